// Distributed data parallel: every rank holds the whole model and trains on its own slice of
// each global batch; gradients are averaged across the mesh's data-parallel ranks by the SDK's
// GradientReducer (bucketed all-reduces launched from autograd hooks, overlapping backward), and
// zero1 shards the optimizer state with the SDK's ShardedOptimizerState.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <iostream>
#include <optional>
#include <utility>

#include "sync_batch_norm.hpp"
#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/parallel/block_norms.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/parallel/gradient_reducer.hpp"
#include "trainyard/parallel/gradient_verdict.hpp"
#include "trainyard/parallel/gradients.hpp"
#include "trainyard/parallel/held_blocks.hpp"
#include "trainyard/parallel/micro_batch.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/parallel/replicated_step.hpp"
#include "trainyard/parallel/sharded_optimizer_state.hpp"
#include "trainyard/api/step_phases.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/parallel/tensor_parallel_step.hpp"

namespace trainyard {
namespace {

// Where this rank's compression state lives in its checkpoint files.
constexpr const char* kCompressionPrefix = "compression.";

struct DdpOptions {
  GradientReducerOptions reducer;
  bool broadcast_buffers = true;
  bool sync_batchnorm = false;
  bool zero1 = false;
};

// `compression` names the dtype all-reduces carry gradients in, as PyTorch's DDP compression
// hooks (fp16_compress_hook, bf16_compress_hook) do.
std::optional<at::ScalarType> parse_compression(const Config& config) {
  const std::string name = config.get_string("compression");
  if (name == "none") return std::nullopt;
  if (name == "fp16") return at::kHalf;
  if (name == "bf16") return at::kBFloat16;
  // The declared choices keep other names out before the factory runs.
  config.fail("compression", "is not a known compression: '" + name + "'");
}

class Ddp final : public Strategy {
 public:
  explicit Ddp(const Config& config) {
    GradientReducerOptions& reducer = options_.reducer;
    reducer.bucket_cap_mb = config.get_float("bucket_cap_mb");
    reducer.first_bucket_mb = config.get_float("first_bucket_mb");
    reducer.find_unused_parameters = config.get_bool("find_unused_parameters");
    reducer.gradient_as_bucket_view = config.get_bool("gradient_as_bucket_view");
    reducer.overlap = config.get_bool("overlap");
    options_.broadcast_buffers = config.get_bool("broadcast_buffers");
    options_.sync_batchnorm = config.get_bool("sync_batchnorm");
    options_.zero1 = config.get_bool("zero1");
    reducer.wire_dtype = parse_compression(config);
  }

  void setup(StrategyContext& context) override {
    context_ = context;
    // Gradients are averaged over the data-parallel ranks (dp_replicate x dp_shard); a pipeline
    // or tensor-parallel peer holds other parameters and never takes part.
    mesh_ = mesh_of(context.build);
    group_ = mesh_->group(MeshGroup::kData);
    place_ = {mesh_->rank(MeshGroup::kData), mesh_->size(MeshGroup::kData)};
    model_ = context.make_model(context.build);
    model_->module().to(context.build.device);
    model_->module().train();
    blocks_ = held_blocks(*model_);
    for (const auto& item : model_->module().named_parameters(true)) {
      parameters_.push_back(item.value());
      names_.push_back(item.key());
    }
    for (const auto& item : model_->module().named_buffers(true)) buffers_.push_back(item.value());
    // A tensor-parallel model holds shards of some parameters: their gradients differ across
    // the tp ranks, which then agree on skipping and on the norm; checkpoints hold the shards.
    tp_group_ = mesh_->group(MeshGroup::kTensor);
    layouts_ = parameter_layouts(*model_);
    for (const auto& layout : layouts_) holds_shards_ = holds_shards_ || !holds_whole(layout);
    if (context.step.block_grad_norms) parameter_blocks_.emplace(*model_);
    optimizer_ = context.optimizer->create(parameters_);
    autocast_dtype_ = context.precision->autocast_dtype();
    if (!group_) {  // the only data-parallel rank: plain training, nothing to synchronise
      blocks_ = with_activation_checkpointing(blocks_, context.step.activation_checkpointing,
                                              context.device_backend);
      return;
    }

    if (!options_.sync_batchnorm && place_.rank == 0 && context.build.rank == 0 &&
        has_batch_norm(model_->module())) {
      std::cerr << "ddp: the model's BatchNorm layers normalise each rank's own batch, so their "
                   "statistics and gradients differ from one process's on the global batch; set "
                   "strategy.sync_batchnorm = true to normalise over all "
                << place_.size << " data-parallel ranks" << std::endl;
    }
    // Every rank starts from rank 0's parameters and buffers.
    std::vector<at::Tensor> state = parameters_;
    state.insert(state.end(), buffers_.begin(), buffers_.end());
    broadcast_coalesced(state);
    if (options_.sync_batchnorm) {
      for (auto& block : blocks_) {
        if (auto forward = sync_batch_norm_forward(block, group_)) {
          block.forward = [forward = *forward](const Activations& x) {
            return x.with_hidden(forward(x.hidden()));
          };
        }
      }
    }
    // Recomputed blocks run their (possibly synchronised) forward again in backward, in the same
    // order on every rank; gradients still reach the reducer's hooks through the graph.
    blocks_ = with_activation_checkpointing(blocks_, context.step.activation_checkpointing,
                                            context.device_backend);
    std::vector<at::Tensor> trainable;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (!parameters_[i].requires_grad()) continue;
      trainable.push_back(parameters_[i]);
      trainable_names_.push_back(names_[i]);
    }
    options_.reducer.compression = context.compression;
    if (context.compression && options_.reducer.wire_dtype) {
      throw Error("ddp: [compression] replaces the all-reduce that strategy.compression narrows; "
                  "set strategy.compression = \"none\" or remove [compression]");
    }
    reducer_ =
        std::make_unique<GradientReducer>(trainable, trainable_names_, group_, options_.reducer);
    if (options_.zero1) {
      optimizer_.reset();  // replaced by the sharded state's optimizer over this rank's slice
      zero1_ = std::make_unique<ShardedOptimizerState>(trainable, group_, *context.optimizer);
    }
  }

  StepResult train_step(std::span<const Batch> micro_batches) override {
    const auto count = static_cast<std::int64_t>(micro_batches.size());
    if (reducer_) {
      reducer_->zero_gradients();
    } else {
      optimizer_->zero_grad(/*set_to_none=*/true);
    }
    torch::Tensor loss_sum;
    StepResult result;
    for (std::int64_t i = 0; i < count; ++i) {
      const Batch& batch = micro_batches[static_cast<std::size_t>(i)];
      // Only the last micro-batch synchronises; the others accumulate locally (no_sync).
      if (reducer_) reducer_->prepare(i == count - 1);
      // Every forward starts from rank 0's buffers, as in PyTorch's DDP (broadcast_buffers).
      if (settle_buffer_broadcast() && context_.phases) {
        context_.phases->mark(StepPhase::CommWait);
      }
      // Recomputed blocks update their buffers again during backward: then the snapshot waits
      // for the end of backward.
      const bool recomputes = context_.step.activation_checkpointing.enabled();
      torch::Tensor detached =
          forward_backward(*model_, blocks_, batch, count, context_, autocast_dtype_, [&] {
            if (broadcasts_buffers() && !recomputes) pending_buffers_ = start_broadcast(buffers_);
          });
      if (broadcasts_buffers() && recomputes) pending_buffers_ = start_broadcast(buffers_);
      loss_sum = loss_sum.defined() ? loss_sum + detached : detached;
      result.samples += batch.size;
    }
    if (reducer_) {
      try {
        reducer_->finish();
      } catch (const UnusedParametersError& error) {
        std::string list;
        for (const auto& name : error.names()) list += (list.empty() ? "" : ", ") + name;
        throw Error("ddp: parameters got no gradient in this step (" + list +
                    "); set strategy.find_unused_parameters = true");
      }
      if (context_.phases) context_.phases->mark(StepPhase::CommWait);
      result.metrics.emplace_back("allreduces_per_step",
                                  static_cast<double>(reducer_->take_launch_count()));
      // What plain all-reduces would have carried, beside the collective counter's bytes.
      result.metrics.emplace_back("gradient_bytes",
                                  static_cast<double>(reducer_->bucket_bytes()));
    }
    // Gradients are identical on every rank from here, so the local norm is the global one and
    // every rank takes the same decisions (skip, clip) as a single process would.
    if (zero1_ || tp_group_) {
      finish_checked_step(loss_sum, count, result);
      return result;
    }
    finish_replicated_step(parameters_, layouts_, context_, *optimizer_, loss_sum, count, result,
                           parameter_blocks_ ? &*parameter_blocks_ : nullptr);
    return result;
  }

  EvalResult eval_step(const Batch& batch) override {
    settle_buffer_broadcast();  // every rank evaluates with rank 0's buffers
    return evaluate_blocks(*model_, blocks_, batch, context_.build.device.type(), autocast_dtype_);
  }

  void set_learning_rate(double lr) override {
    trainyard::set_learning_rate(zero1_ ? zero1_->optimizer() : *optimizer_, lr);
  }

  DataParallelPlace data_parallel_place() const override { return place_; }

  // Parameters, buffers and (unless zero1 shards it) optimizer state are the same on every rank
  // and written once, whole; zero1's optimizer state is each rank's flat slice. Every entry is
  // a placed piece of the whole model's, so any strategy on any layout can resume from it.
  void save_state(CheckpointState& out) const override {
    mark_pieces_format(out.shared);
    if (holds_shards_) {
      // Each tensor-parallel rank holds other pieces: every rank writes its own.
      save_module_pieces(model_->module(), layouts_, *context_.optimizer, optimizer_.get(),
                         out.local, mesh_group_name(MeshGroup::kData));
    } else {
      // Every data-parallel rank holds the same copy; rank 0 writes it.
      save_whole_module_state(model_->module(), *context_.optimizer, optimizer_.get(), out.shared,
                              mesh_group_name(MeshGroup::kData));
    }
    if (zero1_) {
      save_optimizer_pieces(*context_.optimizer, zero1_->optimizer(), {zero1_layout()}, out.local,
                            out.local);
    }
    if (BucketCompressor* compressor = reducer_ ? reducer_->compressor() : nullptr) {
      compressor->save_state(out.local, kCompressionPrefix);
    }
  }

  void load_state(const CheckpointState& in) override {
    settle_buffer_broadcast();  // so that a broadcast in flight cannot overwrite what is loaded
    require_pieces_format(in);
    const PlacedState placed(in);
    load_module_pieces(model_->module(), layouts_, *context_.optimizer, optimizer_.get(), placed);
    if (zero1_) {
      read_held_pieces(placed, "model.", zero1_layout(), zero1_->master());
      load_optimizer_pieces(*context_.optimizer, zero1_->optimizer(), {zero1_layout()}, placed);
    }
    if (BucketCompressor* compressor = reducer_ ? reducer_->compressor() : nullptr) {
      compressor->load_state(in.local, kCompressionPrefix);
    }
  }

  // zero1 steps its master slice and then refreshes every parameter from the slices.
  std::vector<torch::Tensor> optimizer_stepped_tensors() const override {
    if (!zero1_) return stepped_tensors(*optimizer_);
    std::vector<torch::Tensor> tensors = stepped_tensors(zero1_->optimizer());
    tensors.insert(tensors.end(), parameters_.begin(), parameters_.end());
    return tensors;
  }

  TensorMap full_parameters() const override {
    if (holds_shards_) {
      // Collective over the tp group: every rank gets the whole parameters.
      return gather_whole_tensors(parameters_, layouts_, tp_group_);
    }
    TensorMap out;
    for (const auto& item : model_->module().named_parameters(true)) {
      out[item.key()] = item.value().detach();
    }
    return out;
  }

  TensorMap full_model_state() const override {
    if (!holds_shards_) return Strategy::full_model_state();
    TensorMap out = full_parameters();
    for (const auto& item : model_->module().named_buffers(true)) {
      out[item.key()] = item.value().detach();
    }
    return out;
  }

  // What setup refuses of a model, asked before any process starts: BatchNorm layers that
  // sync_batchnorm cannot synchronise (nested in another module, or in a block that is not a
  // torch::nn::Sequential).
  void check_model(Model& model, const BuildContext& /*build*/) const override {
    if (!options_.sync_batchnorm) return;
    for (const auto& block : model.blocks()) sync_batch_norm_forward(block, {});
  }

  HeldBytes held_bytes() const override {
    std::vector<at::Tensor> buffers =
        reducer_ ? reducer_->bucket_buffers() : std::vector<at::Tensor>{};
    if (zero1_) {
      std::vector<at::Tensor> parameters = parameters_;
      parameters.push_back(zero1_->master());
      return count_held_bytes(parameters, &zero1_->optimizer(), *context_.optimizer, buffers);
    }
    return count_held_bytes(parameters_, optimizer_.get(), *context_.optimizer, buffers);
  }

 private:
  // zero1's master: this rank's slice of the trainable parameters flattened in order.
  // Tensor-parallel pieces are flattened as this rank holds them: its slice is then boxes of the
  // whole parameters.
  HeldLayout zero1_layout() const {
    std::vector<HeldLayout> layouts;
    std::vector<std::int64_t> numels;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (!parameters_[i].requires_grad()) continue;
      layouts.push_back(layouts_[i]);
      numels.push_back(parameters_[i].numel());
    }
    const std::int64_t slice = zero1_->master().numel();
    return flat_shard_layout(layouts, numels, place_.rank * slice, slice);
  }

  // A broadcast from rank 0 in flight: the message and the tensors it lands in.
  struct PendingBroadcast {
    at::Tensor message;
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<at::Tensor> targets;
  };

  bool broadcasts_buffers() const {
    // Without SyncBatchNorm each rank's running statistics drift apart; rank 0's are kept.
    return reducer_ && options_.broadcast_buffers && !options_.sync_batchnorm && !buffers_.empty();
  }

  // Starts broadcasting `tensors` from rank 0 as one message of raw bytes whatever their dtypes
  // (BatchNorm's float statistics and integer counters travel together): a broadcast only
  // copies, and on loopback each collective's latency costs more than the bytes. The message is
  // a snapshot, so the tensors may change while it travels.
  PendingBroadcast start_broadcast(const std::vector<at::Tensor>& tensors) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> bytes;
    bytes.reserve(tensors.size());
    for (const auto& tensor : tensors) {
      bytes.push_back(tensor.contiguous().reshape({-1}).view(at::kByte));
    }
    PendingBroadcast pending{at::cat(bytes), {}, tensors};
    std::vector<at::Tensor> message{pending.message};
    pending.work = group_->broadcast(message);
    return pending;
  }

  // Waits for the broadcast and copies rank 0's values into its tensors.
  void finish_broadcast(PendingBroadcast& pending) {
    {
      CollectiveWait wait;
      pending.work->wait();
    }
    at::NoGradGuard no_grad;
    std::int64_t offset = 0;
    for (const auto& tensor : pending.targets) {
      const std::int64_t size = tensor.numel() * static_cast<std::int64_t>(tensor.element_size());
      // A copy of the slice is aligned for its dtype wherever the slice starts in the message.
      at::Tensor slice = pending.message.narrow(0, offset, size).clone();
      tensor.copy_(slice.view(tensor.scalar_type()).view(tensor.sizes()));
      offset += size;
    }
  }

  void broadcast_coalesced(const std::vector<at::Tensor>& tensors) {
    if (tensors.empty()) return;
    PendingBroadcast pending = start_broadcast(tensors);
    finish_broadcast(pending);
  }

  // The buffer broadcast starts after each forward, when the forward's updates to the buffers
  // (BatchNorm's running statistics) are done, and travels while backward runs; the next
  // forward, evaluation or checkpoint load waits for it. The buffers a forward starts from are
  // the same as a broadcast just before it would give, without a collective on the step's
  // critical path. Returns whether there was one to wait for.
  bool settle_buffer_broadcast() {
    if (!pending_buffers_) return false;
    PendingBroadcast pending = std::move(*pending_buffers_);
    pending_buffers_.reset();
    finish_broadcast(pending);
    return true;
  }

  // finish_replicated_step for zero1 or a tensor-parallel model: the gradients are equal on every
  // data-parallel rank, so checks and clipping are local, over the tp group with tensor
  // parallelism (tensor-parallel pieces summed, whole copies once); zero1 steps only its slice.
  void finish_checked_step(const torch::Tensor& loss_sum, std::int64_t count, StepResult& result) {
    std::vector<at::Tensor> held;
    std::vector<at::Tensor> gradients;
    std::vector<at::Tensor> split;
    std::vector<at::Tensor> whole;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const at::Tensor& grad = parameters_[i].grad();
      held.push_back(grad);
      if (!grad.defined()) continue;
      gradients.push_back(grad);
      (holds_whole(layouts_[i]) ? whole : split).push_back(grad);
    }
    test_nonfinite_hook(held, layouts_);
    at::Tensor found_inf = context_.precision->unscale(gradients);
    agree_on_found_inf(found_inf, tp_group_);
    if (parameter_blocks_) report_block_norms(held, result);
    const at::Tensor norm =
        tp_group_ ? squares_over_group(split, whole, tp_group_).sqrt() : global_norm(gradients);
    const GradientVerdict verdict = judge_gradients(
        context_, found_inf, norm, gradients,
        [&] { return first_nonfinite_parameter(held, layouts_); }, result);
    context_.before_optimizer_step();
    if (verdict.step && zero1_) zero1_->step();
    if (verdict.step && !zero1_) optimizer_->step();
    context_.precision->update(verdict.found_inf);
    result.loss = count > 1 ? loss_sum / static_cast<double>(count) : loss_sum;
  }

  // Each block's norm as finish_checked_step takes the total: tensor-parallel pieces' squares
  // summed over the tp group, whole copies counted once.
  void report_block_norms(const std::vector<at::Tensor>& held, StepResult& result) const {
    at::Tensor squares = block_squares(
        held, layouts_, *parameter_blocks_,
        [&](std::size_t i, const ParameterPiece&) { return !holds_whole(layouts_[i]); },
        parameters_.front().device());
    if (tp_group_) {
      std::vector<at::Tensor> split{squares[0].clone()};
      CollectiveWait wait;
      tp_group_->allreduce(split)->wait();
      squares[0].copy_(split[0]);
    }
    set_block_norms(squares.sum(0), *parameter_blocks_, result);
  }

  DdpOptions options_;
  StrategyContext context_;
  std::shared_ptr<ProcessMesh> mesh_;
  c10::intrusive_ptr<c10d::Backend> group_;  // null when this rank is the only data-parallel one
  c10::intrusive_ptr<c10d::Backend> tp_group_;  // null without tensor parallelism
  std::vector<HeldLayout> layouts_;             // how the model holds each parameter
  std::optional<ParameterBlocks> parameter_blocks_;  // with run.grad_norm_blocks
  bool holds_shards_ = false;
  DataParallelPlace place_;
  std::shared_ptr<Model> model_;
  std::vector<Block> blocks_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<std::string> trainable_names_;
  std::vector<torch::Tensor> buffers_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torch::ScalarType> autocast_dtype_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<ShardedOptimizerState> zero1_;
  std::optional<PendingBroadcast> pending_buffers_;
};

void register_components(Registry& registry) {
  registry.add<Strategy>(
      "ddp",
      {option("bucket_cap_mb", 25.0, "gradient bucket size in MiB (one all-reduce per bucket)")
           .greater_than(0),
       option("first_bucket_mb", 1.0,
              "size of the first bucket (the last layers), small so its all-reduce starts early")
           .greater_than(0),
       option("find_unused_parameters", false,
              "parameters without a gradient in a step count as ready (zero) instead of an "
              "error; one that no rank used keeps no gradient, so the optimizer skips it"),
       option("gradient_as_bucket_view", true,
              "gradients are views into the buckets (no copies, no second gradient buffer; "
              "false: separate gradients copied in and out, as PyTorch's default)"),
       option("overlap", true,
              "launch each bucket's all-reduce from autograd hooks during backward (false: "
              "all after backward, for comparison)"),
       option("broadcast_buffers", true, "broadcast rank 0's buffers at every step"),
       option("sync_batchnorm", false,
              "BatchNorm layers use the statistics of the global batch in training"),
       option("zero1", false,
              "ZeRO stage 1: optimizer state sharded across ranks, updated slices all-gathered "
              "after the step"),
       option("compression", "none",
              "dtype the gradient all-reduces carry: none (the gradients' own), fp16 or bf16 "
              "(half the bytes; the averaged gradients are rounded to that dtype)")
           .one_of({"none", "fp16", "bf16"})},
      "distributed data parallel: replicated model, bucketed all-reduce overlapping backward",
      [](const Config& options, const BuildContext&) { return std::make_unique<Ddp>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("ddp", "1.0.0", trainyard::register_components)
