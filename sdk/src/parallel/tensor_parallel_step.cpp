#include "trainyard/parallel/tensor_parallel_step.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

at::Tensor sum_of_squares(const std::vector<at::Tensor>& gradients, const at::Device& device) {
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const auto& gradient : gradients) {
    total = total + gradient.detach().to(at::kFloat).square().sum();
  }
  return total;
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) {
  CollectiveWait waiting;
  work->wait();
}

void all_reduce(at::Tensor& tensor, c10d::ReduceOp op,
                const c10::intrusive_ptr<c10d::Backend>& group) {
  std::vector<at::Tensor> one{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  wait(group->allreduce(one, options));
}

// Each rank's tensor, in group-rank order.
std::vector<at::Tensor> all_gather(const at::Tensor& tensor,
                                   const c10::intrusive_ptr<c10d::Backend>& group) {
  std::vector<at::Tensor> input{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < group->getSize(); ++r) output[0].push_back(at::empty_like(input[0]));
  wait(group->allgather(output, input));
  return output[0];
}

// A layout's pieces as int64 rows: offset, length, then the box's offsets and extent.
at::Tensor encode_pieces(const HeldLayout& layout) {
  std::vector<std::int64_t> values;
  for (const auto& piece : layout) {
    if (piece.placement.flat_offset >= 0) {
      throw Error("gather_whole_tensors: '" + piece.name +
                  "' is held as a flat range, which tensor-parallel shards never are");
    }
    values.push_back(piece.offset);
    values.push_back(piece.length);
    values.insert(values.end(), piece.placement.offsets.begin(), piece.placement.offsets.end());
    values.insert(values.end(), piece.shape.begin(), piece.shape.end());
  }
  return at::tensor(values, at::kLong);
}

}  // namespace

at::Tensor squares_over_group(const std::vector<at::Tensor>& split,
                              const std::vector<at::Tensor>& whole,
                              const c10::intrusive_ptr<c10d::Backend>& group) {
  at::Device device = at::kCPU;
  if (!split.empty()) device = split.front().device();
  if (!whole.empty()) device = whole.front().device();
  at::Tensor shards = sum_of_squares(split, device).reshape({1});
  if (group) all_reduce(shards, c10d::ReduceOp::SUM, group);
  return shards.reshape({}) + sum_of_squares(whole, device);
}

void agree_on_found_inf(at::Tensor& found_inf, const c10::intrusive_ptr<c10d::Backend>& group) {
  if (!found_inf.defined() || !group) return;
  all_reduce(found_inf, c10d::ReduceOp::MAX, group);
}

TensorMap gather_whole_tensors(const std::vector<at::Tensor>& held,
                               const std::vector<HeldLayout>& layouts,
                               const c10::intrusive_ptr<c10d::Backend>& group) {
  TensorMap whole;
  for (std::size_t i = 0; i < held.size(); ++i) {
    const HeldLayout& layout = layouts.at(i);
    if (layout.empty()) continue;
    const std::string& name = layout.front().name;
    if (holds_whole(layout)) {
      whole[name] = held[i].detach();
      continue;
    }
    if (!group) {
      throw Error("gather_whole_tensors: '" + name + "' is a shard, but there is no group");
    }
    const std::vector<at::Tensor> shards = all_gather(held[i].detach(), group);
    // Every rank's pieces (host side: counts are small), in the same order as the shards.
    const std::vector<at::Tensor> pieces =
        all_gather(encode_pieces(layout).to(held[i].device()), group);
    const std::vector<std::int64_t>& shape = layout.front().placement.global_shape;
    const auto dims = static_cast<std::int64_t>(shape.size());
    at::Tensor out = at::zeros(shape, held[i].options().requires_grad(false));
    for (std::size_t r = 0; r < shards.size(); ++r) {
      const at::Tensor flat = shards[r].reshape({-1});
      const at::Tensor rows = pieces[r].cpu().view({-1, 2 + 2 * dims});
      for (std::int64_t p = 0; p < rows.size(0); ++p) {
        const std::int64_t* row = rows[p].data_ptr<std::int64_t>();
        std::vector<std::int64_t> extent(row + 2 + dims, row + 2 + 2 * dims);
        at::Tensor box = out;
        for (std::int64_t d = 0; d < dims; ++d) box = box.narrow(d, row[2 + d], extent[d]);
        box.copy_(flat.narrow(0, row[0], row[1]).view(extent));
      }
    }
    whole[name] = out;
  }
  return whole;
}

}  // namespace trainyard
