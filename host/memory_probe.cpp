#include "memory_probe.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>

#include "lone_tensor_parallel_rank.hpp"
#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/held_bytes.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/parallel/gradients.hpp"
#include "trainyard/parallel/pipeline_stages.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/parallel/split_backward.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "trainyard/runtime/engine.hpp"
#include "trainyard/runtime/median.hpp"

namespace trainyard {

namespace {

constexpr int kTimedRepetitions = 5;

struct PerSampleSeconds {
  double forward = 0;
  double backward = 0;
};

// What one micro-batch size measured.
struct ProbeStep {
  std::int64_t batch = 0;
  std::int64_t activations = 0;
  std::int64_t forward_transient = 0;
  std::int64_t backward_kept = 0;
  std::int64_t backward_fresh = 0;
  std::vector<std::int64_t> blocks;   // what each block's forward kept (the loss's with the last)
  std::vector<std::int64_t> outputs;  // the bytes of what each block hands to the next
  std::vector<std::int64_t> block_transients;  // each block's forward peak above its end
  // Each block's split backward: kept between its halves, and freed by its input half.
  std::vector<std::int64_t> split_kept;
  std::vector<std::int64_t> split_freed;
  std::vector<std::int64_t> backward_peaks;  // each block's plain backward's peak
};

// The recipe as one process with micro-batches of `samples` read on the calling thread, and
// nothing written anywhere.
Recipe probe_recipe(const std::filesystem::path& path, const std::vector<std::string>& settings,
                    std::int64_t samples, int threads, const Registry& registry) {
  // The layout's own settings are the plan's business, not the probe's.
  std::vector<std::string> overrides;
  for (const auto& setting : settings) {
    if (!setting.starts_with("strategy.") && !setting.starts_with("parallel.")) {
      overrides.push_back(setting);
    }
  }
  overrides.push_back(std::string("strategy.plugin=") + default_plugins::kStrategy);
  for (const char* setting : {"parallel.pp=1", "parallel.tp=1", "parallel.dp_shard=1",
                              "parallel.dp_replicate=1", "loader.workers=0", "run.eval=false",
                              "run.track_memory=false", "run.grad_accumulation=1"}) {
    overrides.emplace_back(setting);
  }
  overrides.push_back("loader.batch_size=" + std::to_string(samples));
  overrides.push_back("run.threads=" + std::to_string(threads));
  Recipe resolved = resolve_recipe(load_recipe(path, overrides), registry);
  auto root = std::make_shared<Table>(*resolved.root);
  root->erase("checkpoint");
  root->set("sinks", Value(std::shared_ptr<const Table>(std::make_shared<Table>())));
  resolved.root = root;
  return resolved;
}

// The first `samples` samples of `batch`, in storages of their own.
Batch first_samples(const Batch& batch, std::int64_t samples) {
  Batch part;
  part.size = samples;
  for (const auto& [name, tensor] : batch.tensors) {
    const bool batched = tensor.dim() > 0 && tensor.size(0) == batch.size;
    part.tensors[name] = (batched ? tensor.narrow(0, 0, samples) : tensor).clone();
  }
  return part;
}

std::int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  std::int64_t bytes = 0;
  for (const auto& tensor : tensors) bytes += static_cast<std::int64_t>(tensor.nbytes());
  return bytes;
}

class Probe {
 public:
  Probe(const Recipe& resolved, int tp, const Registry& registry, Batch batch)
      : batch_(std::move(batch)) {
    BuildContext build;
    build.mesh = lone_tensor_parallel_rank(tp);
    mesh_ = build.mesh;
    build.seed = static_cast<std::uint64_t>(resolved.section("run").get_int("seed"));
    build.recipe_dir = resolved.path.parent_path();
    const Config dataset = resolved.section("dataset");
    build.data = registry.create<Dataset>(dataset.get_string("plugin"), dataset, build)->info();
    const Config precision = resolved.section("precision");
    autocast_ = registry.create<Precision>(precision.get_string("plugin"), precision, build)
                    ->autocast_dtype();
    if (autocast_) build.extensions[kComputeDtypeExtension] = *autocast_;
    const Config model = resolved.section("model");
    model_ = registry.create<Model>(model.get_string("plugin"), model, build);
    if (model_->builds_stages()) block_costs_ = block_costs(registry, model, build);
    model_->module().train();
    checkpointing_ = ActivationCheckpointing::parse(
        resolved.section("run").get_string("activation_checkpointing"));
    blocks_ = with_activation_checkpointing(model_->blocks(), checkpointing_);
    for (const auto& parameter : model_->module().parameters()) {
      (parameter.requires_grad() ? trainable_ : frozen_).push_back(parameter);
    }
    for (const auto& buffer : model_->module().buffers()) frozen_.push_back(buffer);
    const Config optimizer = resolved.section("optimizer");
    optimizer_plugin_ =
        registry.create<Optimizer>(optimizer.get_string("plugin"), optimizer, build);
    optimizer_ = optimizer_plugin_->create(trainable_);
    max_grad_norm_ = resolved.section("run").get_float("max_grad_norm");
  }

  // Measured at `small` and at the whole batch's samples.
  ModelFootprint measure(std::int64_t small) {
    ModelFootprint footprint;
    footprint.parameter_bytes = bytes_of(trainable_);
    footprint.frozen_bytes = bytes_of(frozen_);
    footprint.blocks = block_parameters();
    footprint.shared_parameter_bytes = shared_bytes_;
    for (std::size_t b = 0; b < block_costs_.size() && b + 1 < footprint.blocks.size(); ++b) {
      footprint.blocks[b + 1].cost = block_costs_[b];
    }
    // The first step makes the gradients and the optimizer's state.
    forward(batch_).backward();
    optimizer_step();
    const HeldBytes held = count_held_bytes(trainable_, optimizer_.get(), *optimizer_plugin_);
    const double parameters = static_cast<double>(std::max<std::int64_t>(1, held.parameters));
    footprint.optimizer_state_ratio = static_cast<double>(held.optimizer_state) / parameters;
    footprint.optimizer_step_ratio = static_cast<double>(optimizer_step()) / parameters;

    const std::int64_t large = batch_.size;
    const ProbeStep one = measure_step(small);
    const ProbeStep two = measure_step(large);
    auto line = [&](std::int64_t at_small, std::int64_t at_large) {
      PerSample figure;
      figure.per_sample =
          static_cast<double>(at_large - at_small) / static_cast<double>(large - small);
      figure.fixed = static_cast<double>(at_large) - figure.per_sample * static_cast<double>(large);
      return figure;
    };
    footprint.batch = line(one.batch, two.batch);
    footprint.activations = line(one.activations, two.activations);
    footprint.forward_transient = line(one.forward_transient, two.forward_transient);
    footprint.tensor_parallel_bytes =
        line(tensor_parallel_bytes(small),
             tensor_parallel_bytes(large, &footprint.tensor_parallel_calls));
    footprint.backward_kept = line(one.backward_kept, two.backward_kept);
    footprint.backward_fresh = line(one.backward_fresh, two.backward_fresh);
    for (std::size_t b = 0; b < one.blocks.size(); ++b) {
      footprint.blocks[b + 1].activations = line(one.blocks[b], two.blocks[b]);
      footprint.blocks[b + 1].output = line(one.outputs[b], two.outputs[b]);
      footprint.blocks[b + 1].forward_transient =
          line(one.block_transients[b], two.block_transients[b]);
      footprint.blocks[b + 1].split_kept = line(one.split_kept[b], two.split_kept[b]);
      footprint.blocks[b + 1].split_freed = line(one.split_freed[b], two.split_freed[b]);
      footprint.blocks[b + 1].backward_peak = line(one.backward_peaks[b], two.backward_peaks[b]);
    }
    time_steps(footprint, small, large);
    return footprint;
  }

  // The seconds of a forward and of its backward at both sizes, each block's share of the
  // forward, and the optimizer step's seconds per parameter byte: medians of a few repetitions
  // after a warm-up, on the intra-op threads a rank of the layout gets.
  void time_steps(ModelFootprint& footprint, std::int64_t small, std::int64_t large) {
    using Clock = std::chrono::steady_clock;
    const auto seconds = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    std::vector<double> block_seconds(blocks_.size(), 0.0);
    std::vector<double> steps;
    const auto time_at = [&](std::int64_t samples, PerSampleSeconds& into) {
      const Batch batch = first_samples(batch_, samples);
      std::vector<double> forwards;
      std::vector<double> backwards;
      for (int repetition = 0; repetition < kTimedRepetitions + 2; ++repetition) {
        const auto start = Clock::now();
        at::Tensor loss = forward(batch, nullptr, nullptr,
                                  repetition > 1 && samples == large ? &block_seconds : nullptr);
        const auto forwarded = Clock::now();
        loss.backward();
        const auto backwarded = Clock::now();
        if (samples == large) optimizer_phase();
        const auto stepped = Clock::now();
        if (repetition < 2) continue;  // warm-up
        forwards.push_back(seconds(start, forwarded));
        backwards.push_back(seconds(forwarded, backwarded));
        if (samples == large) steps.push_back(seconds(backwarded, stepped));
      }
      into.forward = median(forwards);
      into.backward = median(backwards);
    };
    PerSampleSeconds at_small;
    PerSampleSeconds at_large;
    time_at(small, at_small);
    time_at(large, at_large);
    const auto line = [&](double a, double b) {
      PerSample figure;
      figure.per_sample = (b - a) / static_cast<double>(large - small);
      figure.fixed = b - figure.per_sample * static_cast<double>(large);
      return figure;
    };
    footprint.forward_seconds = line(at_small.forward, at_large.forward);
    footprint.backward_seconds = line(at_small.backward, at_large.backward);
    double total = 0;
    for (double s : block_seconds) total += s;
    for (std::size_t b = 0; b < block_seconds.size() && b + 1 < footprint.blocks.size(); ++b) {
      footprint.blocks[b + 1].forward_share = total > 0 ? block_seconds[b] / total : 0.0;
    }
    footprint.optimizer_seconds_per_byte =
        median(steps) / static_cast<double>(std::max<std::int64_t>(1, bytes_of(trainable_)));
  }

 private:
  // What a measured forward saw, block by block (the loss with the last block).
  struct ForwardRecord {
    std::vector<std::int64_t> kept;        // what each block's forward kept (the input's with the
                                           // first)
    std::vector<std::int64_t> outputs;     // the bytes of what each block hands to the next
    std::vector<std::int64_t> transients;  // each block's peak above its end
    std::int64_t peak = 0;                 // the whole forward's, as the tracker counts
  };

  // The loss of `batch`; with `tracker` and `record`, what each block's forward kept, handed on
  // and held within it.
  at::Tensor forward(const Batch& batch, AllocationTracker* tracker = nullptr,
                     ForwardRecord* record = nullptr,
                     std::vector<double>* block_seconds = nullptr) {
    AutocastGuard guard(at::kCPU, autocast_);
    std::int64_t before = tracker ? tracker->current_bytes() : 0;
    // What the forward kept since the last call, and its peak above where it ends.
    const auto measure = [&] {
      const std::int64_t now = tracker->current_bytes();
      const std::int64_t kept = now - before;
      before = now;
      record->peak = std::max(record->peak, tracker->peak_bytes());
      const std::int64_t transient = tracker->peak_bytes() - now;
      tracker->reset_peak();
      return std::pair{kept, transient};
    };
    if (record) {
      record->peak = tracker->peak_bytes();
      tracker->reset_peak();
    }
    Activations x(model_->input(batch));
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const auto started = std::chrono::steady_clock::now();
      x = blocks_[b].forward(x);
      if (block_seconds) {
        (*block_seconds)[b] +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      }
      if (!record) continue;
      const auto [kept, transient] = measure();
      record->kept.push_back(kept);
      record->transients.push_back(transient);
      std::int64_t bytes = 0;
      for (const auto& [name, tensor] : x.tensors)
        bytes += static_cast<std::int64_t>(tensor.nbytes());
      record->outputs.push_back(bytes);
    }
    at::Tensor loss = model_->loss(x.hidden(), batch);
    // What the loss does not keep of the last block's output (logits whose loss keeps its own
    // log-probabilities) is freed here, as a pipeline's last stage frees it.
    x = Activations();
    if (record && !record->kept.empty()) {
      const auto [kept, transient] = measure();
      record->kept.back() += kept;
      record->transients.back() = std::max(record->transients.back(), transient);
    }
    return loss;
  }

  // Where block `b`'s backward starts on its own: the loss for the last block, else each output
  // that needs a gradient, with ones as the gradient arriving for it.
  struct BackwardRoots {
    std::vector<at::Tensor> roots;
    std::vector<at::Tensor> grads;  // empty for the loss
  };
  BackwardRoots backward_roots(std::size_t b, const Activations& output, const Batch& batch) {
    BackwardRoots out;
    if (b + 1 == blocks_.size()) {
      out.roots.push_back(model_->loss(output.hidden(), batch));
      return out;
    }
    for (const auto& [name, tensor] : output.tensors) {
      if (!tensor.requires_grad()) continue;
      out.roots.push_back(tensor);
      out.grads.push_back(at::ones_like(tensor));
    }
    return out;
  }

  // Per block, what a split backward's input half keeps for its weight half (the gradients at
  // the branch points) and what of the forward's activations it frees: each block run alone on
  // the previous block's output, as a pipeline stage receives it (its floating tensors needing
  // gradients), the last with the loss.
  void measure_split_backward(std::int64_t samples, ProbeStep& step) {
    const Batch batch = first_samples(batch_, samples);
    AutocastGuard guard(at::kCPU, autocast_);
    Activations x(model_->input(batch));
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      std::vector<at::Tensor> inputs;
      for (auto& [name, tensor] : x.tensors) {
        tensor = tensor.detach();
        if (at::isFloatingType(tensor.scalar_type())) inputs.push_back(tensor.requires_grad_());
      }
      Activations output = blocks_[b].forward(x);
      const BackwardRoots roots = backward_roots(b, output, batch);
      std::vector<at::Tensor> parameters;
      for (const auto& parameter : blocks_[b].module->parameters()) {
        if (parameter.requires_grad()) parameters.push_back(parameter);
      }
      AllocationTracker tracker;
      tracker.start_generation();
      SplitBackward split;
      split.input_half(roots.roots, roots.grads, inputs, parameters);  // input gradients dropped
      const std::int64_t kept = tracker.generation_bytes();
      step.split_kept.push_back(kept);
      step.split_freed.push_back(std::max<std::int64_t>(0, kept - tracker.current_bytes()));
      split.weight_half();
      step.backward_peaks.push_back(plain_backward_peak(b, x, batch));
      x = std::move(output);
    }
  }

  // Block `b`'s plain backward on `input` (its floating tensors needing gradients): the peak above
  // where it started, the gradient of its output included (the last block's loss takes none).
  // Counted from before the forward, so that what the backward frees of the forward's tensors
  // (the loss's, before a recomputed head runs again) makes room as it does in a step.
  std::int64_t plain_backward_peak(std::size_t b, const Activations& input, const Batch& batch) {
    AllocationTracker tracker;
    const Activations output = blocks_[b].forward(input);
    const BackwardRoots roots = backward_roots(b, output, batch);
    std::int64_t arriving = 0;
    for (const auto& grad : roots.grads) arriving += static_cast<std::int64_t>(grad.nbytes());
    const std::int64_t started = tracker.current_bytes();
    tracker.reset_peak();
    torch::autograd::backward(roots.roots, roots.grads);
    return tracker.peak_bytes() - started + arriving;
  }

  // What a step runs between its backward and its end: the gradients' norm, their clipping when
  // the recipe clips, and the optimizer step. Timed right after a backward, as in a step, whose
  // activations have taken the caches the optimizer's state was in (timed alone, repeated, the
  // step ran at half the time it takes in a run).
  void optimizer_phase() {
    const std::vector<at::Tensor> gradients = gradients_of(trainable_);
    const at::Tensor norm = global_norm(gradients);
    if (max_grad_norm_ > 0) clip_to_norm(gradients, norm, max_grad_norm_);
    optimizer_->step();
    optimizer_->zero_grad(/*set_to_none=*/true);
  }

  // The optimizer step's transient peak above what it starts with.
  std::int64_t optimizer_step() {
    AllocationTracker tracker;
    optimizer_->step();
    return tracker.peak_bytes() - std::max<std::int64_t>(0, tracker.current_bytes());
  }

  ProbeStep measure_step(std::int64_t samples) {
    ProbeStep step;
    for (const bool kept : {true, false}) {
      if (!kept) optimizer_->zero_grad(/*set_to_none=*/true);
      AllocationTracker tracker;
      const Batch batch = first_samples(batch_, samples);
      step.batch = tracker.current_bytes();
      ForwardRecord record;
      at::Tensor loss = forward(batch, &tracker, &record);
      const std::int64_t forward_end = tracker.current_bytes();
      step.activations = forward_end - step.batch;
      if (kept) {
        step.blocks = std::move(record.kept);
        step.outputs = std::move(record.outputs);
        step.block_transients = std::move(record.transients);
        step.forward_transient = record.peak - forward_end;
      }
      tracker.reset_peak();
      loss.backward();
      loss.reset();
      (kept ? step.backward_kept : step.backward_fresh) = tracker.peak_bytes() - forward_end;
    }
    measure_split_backward(samples, step);
    return step;
  }

  // What a pipeline balances its stages by: each block's FLOPs per sample, or its parameter
  // count when the model reports no FLOPs, from the block built alone (a stage build).
  static std::vector<double> block_costs(const Registry& registry, const Config& model,
                                         const BuildContext& whole) {
    std::vector<double> flops;
    std::vector<double> sizes;
    const auto count = static_cast<std::int64_t>(
        registry.create<Model>(model.get_string("plugin"), model, whole)->block_names().size());
    for (std::int64_t b = 0; b < count; ++b) {
      BuildContext one_block = whole;
      one_block.device = c10::Device(c10::kMeta);
      one_block.blocks = BlockRange{b, b + 1};
      auto built = registry.create<Model>(model.get_string("plugin"), model, one_block);
      flops.push_back(built->flops_per_sample());
      double numel = 0;
      for (const auto& parameter : built->module().parameters(true)) {
        numel += static_cast<double>(parameter.numel());
      }
      sizes.push_back(numel);
    }
    return stage_balancing_costs(std::move(flops), std::move(sizes));
  }

  // Each block's parameters that it alone uses; the rest (tied, or in no block) as "root".
  std::vector<BlockFootprint> block_parameters() {
    std::map<const void*, int> users;
    for (const auto& block : blocks_) {
      for (const auto& parameter : block.module->parameters()) {
        if (parameter.requires_grad()) ++users[parameter.unsafeGetTensorImpl()];
      }
    }
    std::vector<BlockFootprint> out;
    std::map<const void*, std::size_t> shared_index;
    std::int64_t owned = 0;
    for (std::size_t index = 0; index < blocks_.size(); ++index) {
      const Block& block = blocks_[index];
      BlockFootprint footprint;
      footprint.name = block.name;
      footprint.recomputed = checkpointing_.selects(index, block.name);
      for (const auto& parameter : block.module->parameters()) {
        if (!parameter.requires_grad()) continue;
        const void* key = parameter.unsafeGetTensorImpl();
        if (users[key] == 1) {
          footprint.parameter_bytes += static_cast<std::int64_t>(parameter.nbytes());
          continue;
        }
        auto [found, added] = shared_index.try_emplace(key, shared_bytes_.size());
        if (added) shared_bytes_.push_back(static_cast<std::int64_t>(parameter.nbytes()));
        footprint.shared.push_back(found->second);
      }
      owned += footprint.parameter_bytes;
      out.push_back(footprint);
    }
    BlockFootprint root;
    root.name = "root";
    root.parameter_bytes = bytes_of(trainable_) - owned;
    out.insert(out.begin(), root);
    return out;
  }

  // The bytes a micro-batch's forward and backward move over the tp group (ring algorithms: an
  // all-reduce moves 2 (n-1)/n of its tensor, an all-gather n-1 times this rank's part, a
  // reduce-scatter (n-1)/n of the whole).
  std::int64_t tensor_parallel_bytes(std::int64_t samples, double* calls = nullptr) {
    const double n = static_cast<double>(mesh_->size(MeshGroup::kTensor));
    if (n <= 1) return 0;
    const Batch batch = first_samples(batch_, samples);
    mesh_->collectives().take();
    forward(batch).backward();
    double moved = 0;
    for (const auto& [key, count] : mesh_->collectives().take()) {
      const std::string& operation = key.second;
      const double factor = operation.starts_with("allreduce")    ? 2 * (n - 1) / n
                            : operation.starts_with("_allgather") ? n - 1
                            : operation.starts_with("allgather")  ? n - 1
                            : operation.find("reduce_scatter") != std::string::npos ? (n - 1) / n
                                                                                    : 1.0;
      moved += factor * static_cast<double>(count.bytes);
      if (calls) *calls += static_cast<double>(count.calls);
    }
    return static_cast<std::int64_t>(moved);
  }

  Batch batch_;
  std::shared_ptr<ProcessMesh> mesh_;
  std::optional<at::ScalarType> autocast_;
  std::shared_ptr<Model> model_;
  ActivationCheckpointing checkpointing_;
  std::vector<std::int64_t> shared_bytes_;  // parameters several blocks use
  std::vector<double> block_costs_;
  std::vector<Block> blocks_;
  std::vector<at::Tensor> trainable_;
  std::vector<at::Tensor> frozen_;
  std::shared_ptr<Optimizer> optimizer_plugin_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  double max_grad_norm_ = 0;
};

}  // namespace

ModelFootprint probe_model(const std::filesystem::path& recipe,
                           const std::vector<std::string>& overrides, std::int64_t micro_batch,
                           int threads, int tp, const Registry& registry) {
  // Two sizes give the per-sample line; the micro-batch itself is one of them, so the layout's
  // own figures are measured, not extrapolated (kernels choose their algorithms by size).
  const std::int64_t large = std::max<std::int64_t>(2, micro_batch);
  const std::int64_t small = micro_batch >= 2 ? micro_batch / 2 : 1;
  const Recipe resolved = probe_recipe(recipe, overrides, large, std::max(1, threads), registry);
  Batch batch;
  {
    // The engine reads the batch exactly as training would (any dataset, map or stream).
    RunControls quiet;
    quiet.log = [](const std::string&) {};
    quiet.single_process = true;
    Engine engine(resolved, registry, quiet);
    batch = engine.next_micro_batches().front();
  }
  at::manual_seed(static_cast<std::uint64_t>(resolved.section("run").get_int("seed")));
  Probe probe(resolved, tp, registry, std::move(batch));
  return probe.measure(small);
}

}  // namespace trainyard
