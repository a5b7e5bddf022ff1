#include "pipeline_state.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <string>

#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/api/placed_state.hpp"
#include "trainyard/parallel/tensor_parallel_step.hpp"

namespace trainyard {
namespace {

// `tensors` of pp rank `source`, on every rank of the pipeline group: a spec, then the data.
TensorMap broadcast_map(const TensorMap& tensors, int source, const PipelinePlace& place) {
  auto broadcast = [&](at::Tensor tensor) {
    std::vector<at::Tensor> one{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = source;
    auto work = place.pp_group->broadcast(one, options);
    CollectiveWait waiting;
    work->wait();
    return one[0];
  };
  std::vector<std::int64_t> spec;
  for (const auto& [name, tensor] : tensors) {
    spec.push_back(static_cast<std::int64_t>(name.size()));
    for (char c : name) spec.push_back(static_cast<unsigned char>(c));
    spec.push_back(static_cast<std::int64_t>(tensor.scalar_type()));
    spec.push_back(tensor.dim());
    for (std::int64_t size : tensor.sizes()) spec.push_back(size);
  }
  const bool sending = place.pp_rank == source;
  at::Tensor length =
      broadcast(at::tensor({static_cast<std::int64_t>(spec.size())}, at::kLong).to(place.device));
  const std::int64_t count = length.cpu().item<std::int64_t>();
  at::Tensor body = broadcast(sending ? at::tensor(spec, at::kLong).to(place.device)
                                      : at::empty({count}, at::kLong).to(place.device));
  const at::Tensor values = body.cpu();
  const std::int64_t* data = values.data_ptr<std::int64_t>();
  TensorMap out;
  for (std::int64_t at = 0; at < count;) {
    std::string name;
    const std::int64_t name_length = data[at++];
    for (std::int64_t c = 0; c < name_length; ++c) name.push_back(static_cast<char>(data[at++]));
    const auto dtype = static_cast<at::ScalarType>(data[at++]);
    const std::int64_t dims = data[at++];
    std::vector<std::int64_t> shape(data + at, data + at + dims);
    at += dims;
    at::Tensor tensor =
        sending ? tensors.at(name).contiguous().clone()
                : at::empty(shape, at::TensorOptions().dtype(dtype).device(place.device));
    out[name] = broadcast(tensor);
  }
  return out;
}

}  // namespace

std::vector<HeldLayout> stage_layouts(const std::vector<LocalStage>& stages) {
  std::vector<HeldLayout> layouts;
  for (const auto& stage : stages) {
    const std::vector<HeldLayout> held = stage.held->layouts(stage.whole_names);
    layouts.insert(layouts.end(), held.begin(), held.end());
  }
  return layouts;
}

std::int64_t gradient_bytes(const std::vector<LocalStage>& stages) {
  std::int64_t bytes = 0;
  for (const auto& stage : stages) bytes += stage.held->gradient_bytes();
  return bytes;
}

namespace {

// Each local stage's compression state under its own prefix: an interleaved rank holds several.
std::string compression_prefix(const LocalStage& stage) {
  return "compression.stage" + std::to_string(stage.index) + ".";
}

}  // namespace

// Data-parallel peers hold the same and each writes its own file, so that a resume on the same
// layout reads one file per rank; a resume on another cut reads every rank's files and takes
// what it holds.
void save_stages(const std::vector<LocalStage>& stages, const Optimizer& plugin,
                 const torch::optim::Optimizer& optimizer, const std::string& replicas,
                 CheckpointState& out) {
  mark_pieces_format(out.shared);
  const std::vector<HeldLayout> layouts = stage_layouts(stages);
  std::size_t next = 0;
  for (const auto& stage : stages) {
    for (const at::Tensor& held : stage.held->optimized()) {
      put_held_pieces(out.local, "model.", held.detach(), layouts[next++], replicas);
    }
    for (std::size_t i = 0; i < stage.buffers.size(); ++i) {
      TensorPlacement placement = TensorPlacement::whole(stage.buffers[i].sizes().vec());
      placement.replicas = replicas;
      put_piece(out.local, "model." + stage.buffer_names[i], stage.buffers[i].detach(), placement);
    }
  }
  save_optimizer_pieces(plugin, optimizer, layouts, out.local, out.local, replicas);
  for (const auto& stage : stages) {
    if (BucketCompressor* compressor = stage.held->compressor()) {
      compressor->save_state(out.local, compression_prefix(stage));
    }
  }
}

void load_stages(std::vector<LocalStage>& stages, const Optimizer& plugin,
                 torch::optim::Optimizer& optimizer, const CheckpointState& in) {
  require_pieces_format(in);
  const PlacedState placed(in);
  std::vector<HeldLayout> layouts;
  at::NoGradGuard no_grad;
  for (auto& stage : stages) {
    const std::vector<at::Tensor> held = stage.held->optimized();
    const std::vector<HeldLayout> stage_layouts = stage.held->layouts(stage.whole_names);
    for (std::size_t i = 0; i < held.size(); ++i) {
      read_held_pieces(placed, "model.", stage_layouts[i], held[i]);
      layouts.push_back(stage_layouts[i]);
    }
    for (std::size_t i = 0; i < stage.buffers.size(); ++i) {
      const std::string name = "model." + stage.buffer_names[i];
      at::Tensor value = placed.whole(name);
      if (!value.sizes().equals(stage.buffers[i].sizes())) {
        throw Error("checkpoint's '" + name + "' has another shape than this model's");
      }
      stage.buffers[i].copy_(value);
    }
  }
  load_optimizer_pieces(plugin, optimizer, layouts, placed);
  for (auto& stage : stages) {
    stage.held->release();
    if (BucketCompressor* compressor = stage.held->compressor()) {
      compressor->load_state(in.local, compression_prefix(stage));
    }
  }
}

TensorMap gather_whole_model(const std::vector<LocalStage>& stages, bool buffers,
                             const PipelinePlace& place) {
  TensorMap mine;
  for (const auto& stage : stages) {
    const std::vector<at::Tensor> whole = stage.held->whole_parameters();
    std::vector<at::Tensor> held;
    std::vector<HeldLayout> layouts;
    for (std::size_t i = 0; i < whole.size(); ++i) {
      if (stage.tied_copy[i]) continue;
      held.push_back(whole[i]);  // whole, or this tp rank's piece (gathered over dp if sharded)
      layouts.push_back(stage.layouts[i]);
    }
    for (auto& [name, tensor] : gather_whole_tensors(held, layouts, place.tp_group)) {
      mine[name] = tensor;
    }
    if (!buffers) continue;
    for (std::size_t i = 0; i < stage.buffers.size(); ++i) {
      mine[stage.buffer_names[i]] = stage.buffers[i].detach();
    }
  }
  if (!place.pp_group) return mine;
  TensorMap whole;
  for (int source = 0; source < place.pp_ranks; ++source) {
    const TensorMap sent =
        broadcast_map(source == place.pp_rank ? mine : TensorMap{}, source, place);
    for (auto& [name, tensor] : sent) whole[name] = tensor;
  }
  return whole;
}

}  // namespace trainyard
