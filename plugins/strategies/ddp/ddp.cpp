// Distributed data parallel: every rank holds the whole model and trains on its own slice of
// each global batch; gradients are averaged across ranks by bucketed all-reduces that autograd
// hooks launch as soon as a bucket's gradients are ready, so communication overlaps the rest of
// backward. The same mechanism as PyTorch's DDP Reducer, on the communicator's c10d backend.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <utility>

#include "sync_batch_norm.hpp"
#include "trainyard/activation_checkpoint.hpp"
#include "trainyard/checkpoint_store.hpp"
#include "trainyard/communicator.hpp"
#include "trainyard/distributed.hpp"
#include "trainyard/error.hpp"
#include "trainyard/gradients.hpp"
#include "trainyard/micro_batch.hpp"
#include "trainyard/model.hpp"
#include "trainyard/module_state.hpp"
#include "trainyard/optimizer.hpp"
#include "trainyard/plugin.hpp"
#include "trainyard/precision.hpp"
#include "trainyard/replicated_step.hpp"
#include "trainyard/step_phases.hpp"
#include "trainyard/strategy.hpp"

namespace trainyard {
namespace {

struct DdpOptions {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = true;
  bool overlap = true;
  bool broadcast_buffers = true;
  bool sync_batchnorm = false;
  bool zero1 = false;
  // The dtype gradients travel in (fp16 or bf16 halve the bytes; unset: their own dtype).
  std::optional<at::ScalarType> wire_dtype;
};

// `compression` names the dtype all-reduces carry gradients in, as PyTorch's DDP compression
// hooks (fp16_compress_hook, bf16_compress_hook) do.
std::optional<at::ScalarType> parse_compression(const Config& config) {
  const std::string name = config.get_string("compression");
  if (name == "none") return std::nullopt;
  if (name == "fp16") return at::kHalf;
  if (name == "bf16") return at::kBFloat16;
  config.fail("compression", "must be none, fp16 or bf16 (got '" + name + "')");
}

// Gradients of several parameters laid out in one flat tensor, all-reduced as one.
struct GradientBucket {
  std::vector<std::size_t> parameters;  // indices into the strategy's parameter list
  std::vector<std::int64_t> offsets;
  at::Tensor flat;
  at::Tensor wire;          // `flat` in the compression dtype while it travels (undefined without)
  std::size_t pending = 0;  // parameters not yet ready in this backward
  c10::intrusive_ptr<c10d::Work> work;  // the in-flight all-reduce
};

// Averages gradients across the ranks of `group` (see the file comment). One instance per
// model; prepare() before each backward whose gradients must be synchronised, finish() after it.
class GradientReducer {
 public:
  GradientReducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                  c10::intrusive_ptr<c10d::Backend> group, const DdpOptions& options)
      : parameters_(std::move(parameters)),
        names_(std::move(names)),
        group_(std::move(group)),
        options_(options) {
    assign_buckets();
    bucket_of_.assign(parameters_.size(), {0, 0});
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      for (std::size_t i = 0; i < buckets_[b].parameters.size(); ++i) {
        bucket_of_[buckets_[b].parameters[i]] = {b, i};
      }
    }
    ready_.assign(parameters_.size(), false);
    accumulators_ = trainyard::on_gradient_ready(
        parameters_, [this](std::size_t index) { on_gradient_ready(index); });
  }

  std::size_t bucket_count() const { return buckets_.size(); }
  // All-reduces launched since the last call (one per bucket per synchronised backward).
  std::int64_t take_launch_count() { return std::exchange(launches_, 0); }

  // Clears gradients before a step: as views into the zeroed buckets, or unset.
  void zero_gradients() {
    if (!options_.gradient_as_bucket_view) {
      for (auto& parameter : parameters_) parameter.mutable_grad() = at::Tensor();
      return;
    }
    for (auto& bucket : buckets_) {
      bucket.flat.zero_();
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
        at::Tensor& parameter = parameters_[bucket.parameters[i]];
        parameter.mutable_grad() = view_of(bucket, i);
      }
    }
  }

  // The next backward synchronises (the last micro-batch) or only accumulates (no_sync).
  void prepare(bool synchronise) {
    synchronise_ = synchronise;
    if (!synchronise) return;
    for (auto& bucket : buckets_) {
      bucket.pending = bucket.parameters.size();
      bucket.work.reset();
    }
    std::fill(ready_.begin(), ready_.end(), false);
    next_launch_ = 0;
  }

  // The flat buffers the buckets all-reduce (gradient memory beyond .grad unless the gradients
  // are views into them).
  std::vector<at::Tensor> bucket_buffers() const {
    std::vector<at::Tensor> flats;
    for (const auto& bucket : buckets_) {
      flats.push_back(bucket.flat);
      if (bucket.wire.defined()) flats.push_back(bucket.wire);
    }
    return flats;
  }

  // After the synchronising backward: completes buckets of parameters that got no gradient,
  // launches what is left, waits for every all-reduce and leaves the averaged gradients in
  // .grad. With find_unused_parameters, a parameter no rank used keeps no gradient (as in one
  // process, so the optimizer skips it), which takes one more all-reduce of the usage counts.
  void finish() {
    if (!synchronise_) return;
    std::vector<std::string> missing;
    // Which parameters this rank's backward used, before the loop below marks the rest ready.
    std::vector<float> used_here;
    if (options_.find_unused_parameters) used_here.assign(ready_.begin(), ready_.end());
    for (std::size_t index = 0; index < parameters_.size(); ++index) {
      if (ready_[index]) continue;
      if (!options_.find_unused_parameters) {
        missing.push_back(names_[index]);
        continue;
      }
      on_gradient_ready(index);
    }
    if (!missing.empty()) {
      std::string list;
      for (const auto& name : missing) list += (list.empty() ? "" : ", ") + name;
      throw Error("ddp: parameters got no gradient in this step (" + list +
                  "); set strategy.find_unused_parameters = true");
    }
    if (!options_.overlap) {
      for (std::size_t b = 0; b < buckets_.size(); ++b) launch(b);
    }
    c10::intrusive_ptr<c10d::Work> usage;
    at::Tensor used;
    if (options_.find_unused_parameters) {
      used = at::tensor(used_here, at::kFloat).to(parameters_.front().device());
      std::vector<at::Tensor> tensors{used};
      usage = group_->allreduce(tensors);  // after every bucket, in the same order on all ranks
    }
    {
      CollectiveWait wait;
      for (auto& bucket : buckets_) {
        if (bucket.work) bucket.work->wait();
      }
      if (usage) usage->wait();
    }
    for (auto& bucket : buckets_) {
      bucket.work.reset();
      if (bucket.wire.defined()) {
        at::NoGradGuard no_grad;
        bucket.flat.copy_(bucket.wire);
      }
      if (options_.gradient_as_bucket_view) continue;
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
        at::Tensor& parameter = parameters_[bucket.parameters[i]];
        at::Tensor averaged = view_of(bucket, i);
        if (parameter.grad().defined()) {
          parameter.mutable_grad().copy_(averaged);
        } else {
          parameter.mutable_grad() = averaged.clone();
        }
      }
    }
    if (usage) {
      const at::Tensor counts = used.cpu();
      const float* count = counts.data_ptr<float>();
      for (std::size_t index = 0; index < parameters_.size(); ++index) {
        if (count[index] == 0) parameters_[index].mutable_grad() = at::Tensor();
      }
    }
  }

 private:
  void assign_buckets() {
    // Reverse registration order approximates the order backward produces gradients. The first
    // bucket is small so that its all-reduce starts early in backward (as PyTorch's DDP does).
    const auto cap = static_cast<std::int64_t>(options_.bucket_cap_mb * 1024 * 1024);
    const auto first_cap = static_cast<std::int64_t>(
        std::min(options_.first_bucket_mb, options_.bucket_cap_mb) * 1024 * 1024);
    std::map<std::pair<at::ScalarType, std::string>, std::size_t> open;
    for (std::size_t k = parameters_.size(); k-- > 0;) {
      const at::Tensor& parameter = parameters_[k];
      auto key = std::make_pair(parameter.scalar_type(), parameter.device().str());
      auto it = open.find(key);
      if (it == open.end()) {
        buckets_.emplace_back();
        it = open.emplace(key, buckets_.size() - 1).first;
      }
      GradientBucket& bucket = buckets_[it->second];
      std::int64_t used =
          bucket.offsets.empty()
              ? 0
              : bucket.offsets.back() + parameters_[bucket.parameters.back()].numel();
      bucket.parameters.push_back(k);
      bucket.offsets.push_back(used);
      used += parameter.numel();
      const std::int64_t limit = it->second == 0 ? first_cap : cap;
      if (used * parameter.element_size() >= limit) open.erase(it);
    }
    for (auto& bucket : buckets_) {
      const at::Tensor& last = parameters_[bucket.parameters.back()];
      bucket.flat = at::zeros({bucket.offsets.back() + last.numel()}, last.options());
      // Only floating-point gradients wider than the wire dtype are compressed.
      if (options_.wire_dtype && bucket.flat.is_floating_point() &&
          bucket.flat.element_size() >
              static_cast<std::int64_t>(at::elementSize(*options_.wire_dtype))) {
        bucket.wire =
            at::empty_like(bucket.flat, bucket.flat.options().dtype(*options_.wire_dtype));
      }
    }
  }

  at::Tensor view_of(GradientBucket& bucket, std::size_t i) {
    const at::Tensor& parameter = parameters_[bucket.parameters[i]];
    return bucket.flat.narrow(0, bucket.offsets[i], parameter.numel()).view(parameter.sizes());
  }

  void on_gradient_ready(std::size_t index) {
    if (!synchronise_ || ready_[index]) return;
    ready_[index] = true;
    auto [b, i] = bucket_of_[index];
    GradientBucket& bucket = buckets_[b];
    if (!options_.gradient_as_bucket_view) {
      at::NoGradGuard no_grad;
      at::Tensor slot = view_of(bucket, i);
      const at::Tensor& gradient = parameters_[index].grad();
      if (gradient.defined()) {
        slot.copy_(gradient);
      } else {
        slot.zero_();
      }
    }
    if (--bucket.pending == 0 && options_.overlap) {
      // Every rank launches buckets in the same order, whatever order they complete in.
      while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
        launch(next_launch_++);
      }
    }
  }

  void launch(std::size_t b) {
    GradientBucket& bucket = buckets_[b];
    at::NoGradGuard no_grad;
    // Averaged before any compression, so the sum cannot leave the narrower dtype's range
    // where each rank's share is inside it.
    bucket.flat.div_(group_->getSize());
    if (bucket.wire.defined()) bucket.wire.copy_(bucket.flat);
    std::vector<at::Tensor> tensors{bucket.wire.defined() ? bucket.wire : bucket.flat};
    bucket.work = group_->allreduce(tensors);
    ++launches_;
  }

  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  c10::intrusive_ptr<c10d::Backend> group_;
  DdpOptions options_;
  std::vector<GradientBucket> buckets_;
  std::vector<std::pair<std::size_t, std::size_t>> bucket_of_;
  std::vector<bool> ready_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::size_t next_launch_ = 0;
  std::int64_t launches_ = 0;
  bool synchronise_ = false;
};

// ZeRO stage 1: parameters and gradients stay replicated (the reducer all-reduces them as
// usual) but each rank keeps optimizer state for one contiguous slice of the flattened
// parameters only: it steps a master copy of its slice, and the updated slices are all-gathered
// back into every rank's parameters.
class ShardedOptimizerState {
 public:
  ShardedOptimizerState(std::vector<at::Tensor> parameters, c10::intrusive_ptr<c10d::Backend> group,
                        Optimizer& plugin)
      : parameters_(std::move(parameters)), group_(std::move(group)) {
    const std::int64_t ranks = group_->getSize();
    for (const auto& parameter : parameters_) numel_ += parameter.numel();
    shard_numel_ = (numel_ + ranks - 1) / ranks;
    at::NoGradGuard no_grad;
    at::Tensor flat = flatten(parameters_, /*gradients=*/false);
    master_ = flat.narrow(0, group_->getRank() * shard_numel_, shard_numel_).clone();
    master_.requires_grad_(true);
    optimizer_ = plugin.create({master_});
  }

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const at::Tensor& master() const { return master_; }

  // The optimizer step on this rank's slice of the (averaged, unscaled, clipped) gradients, then
  // every rank's updated slice into everyone's parameters.
  void step() {
    at::NoGradGuard no_grad;
    at::Tensor gradients = flatten(parameters_, /*gradients=*/true);
    master_.mutable_grad() =
        gradients.narrow(0, group_->getRank() * shard_numel_, shard_numel_).clone();
    optimizer_->step();
    master_.mutable_grad() = at::Tensor();  // the whole gradients stay in the parameters' .grad
    at::Tensor gathered =
        at::empty({shard_numel_ * group_->getSize()}, master_.options().requires_grad(false));
    at::Tensor input = master_.detach();
    {
      CollectiveWait wait;
      group_->_allgather_base(gathered, input)->wait();
    }
    std::int64_t offset = 0;
    for (auto& parameter : parameters_) {
      parameter.detach().copy_(
          gathered.narrow(0, offset, parameter.numel()).view(parameter.sizes()));
      offset += parameter.numel();
    }
  }

 private:
  // Parameters (or their gradients, zero where absent) in one flat tensor, padded to whole
  // slices.
  at::Tensor flatten(const std::vector<at::Tensor>& tensors, bool gradients) const {
    at::Tensor flat = at::zeros({shard_numel_ * group_->getSize()},
                                tensors.front().options().requires_grad(false));
    std::int64_t offset = 0;
    for (const auto& tensor : tensors) {
      const at::Tensor source = gradients ? tensor.grad() : tensor.detach();
      if (source.defined()) flat.narrow(0, offset, tensor.numel()).copy_(source.reshape({-1}));
      offset += tensor.numel();
    }
    return flat;
  }

  std::vector<at::Tensor> parameters_;
  c10::intrusive_ptr<c10d::Backend> group_;
  std::int64_t numel_ = 0;
  std::int64_t shard_numel_ = 0;
  at::Tensor master_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

class Ddp final : public Strategy {
 public:
  explicit Ddp(const Config& config) {
    options_.bucket_cap_mb = config.get_float("bucket_cap_mb");
    options_.first_bucket_mb = config.get_float("first_bucket_mb");
    options_.find_unused_parameters = config.get_bool("find_unused_parameters");
    options_.gradient_as_bucket_view = config.get_bool("gradient_as_bucket_view");
    options_.overlap = config.get_bool("overlap");
    options_.broadcast_buffers = config.get_bool("broadcast_buffers");
    options_.sync_batchnorm = config.get_bool("sync_batchnorm");
    options_.zero1 = config.get_bool("zero1");
    options_.wire_dtype = parse_compression(config);
    if (options_.bucket_cap_mb <= 0) config.fail("bucket_cap_mb", "must be > 0");
    if (options_.first_bucket_mb <= 0) config.fail("first_bucket_mb", "must be > 0");
  }

  void setup(StrategyContext& context) override {
    context_ = context;
    if (context.communicator) {
      group_ = context.communicator->world();
      place_ = {context.communicator->rank(), context.communicator->world_size()};
    }
    model_ = context.make_model(context.build);
    model_->module().to(context.build.device);
    model_->module().train();
    blocks_ = model_->blocks();
    std::vector<std::string> names;
    for (const auto& item : model_->module().named_parameters(true)) {
      parameters_.push_back(item.value());
      names.push_back(item.key());
    }
    for (const auto& item : model_->module().named_buffers(true)) buffers_.push_back(item.value());
    optimizer_ = context.optimizer->create(parameters_);
    autocast_dtype_ = context.precision->autocast_dtype();
    if (!group_) {  // one process: plain training, nothing to synchronise
      blocks_ = with_activation_checkpointing(blocks_, context.step.activation_checkpointing);
      return;
    }

    // Every rank starts from rank 0's parameters and buffers.
    std::vector<at::Tensor> state = parameters_;
    state.insert(state.end(), buffers_.begin(), buffers_.end());
    broadcast_coalesced(state);
    if (options_.sync_batchnorm) {
      for (auto& block : blocks_) {
        if (auto forward = sync_batch_norm_forward(block, group_)) block.forward = *forward;
      }
    }
    // Recomputed blocks run their (possibly synchronised) forward again in backward, in the same
    // order on every rank; gradients still reach the reducer's hooks through the graph.
    blocks_ = with_activation_checkpointing(blocks_, context.step.activation_checkpointing);
    std::vector<at::Tensor> trainable;
    std::vector<std::string> trainable_names;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (!parameters_[i].requires_grad()) continue;
      trainable.push_back(parameters_[i]);
      trainable_names.push_back(names[i]);
    }
    reducer_ = std::make_unique<GradientReducer>(trainable, trainable_names, group_, options_);
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
      reducer_->finish();
      if (context_.phases) context_.phases->mark(StepPhase::CommWait);
      result.metrics.emplace_back("allreduces_per_step",
                                  static_cast<double>(reducer_->take_launch_count()));
    }
    // Gradients are identical on every rank from here, so the local norm is the global one and
    // every rank takes the same decisions (skip, clip) as a single process would.
    if (zero1_) {
      finish_zero1_step(loss_sum, count, result);
      return result;
    }
    finish_replicated_step(parameters_, *context_.precision, *optimizer_, context_.step, loss_sum,
                           count, result);
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

  void save_state(CheckpointState& out) const override {
    save_module_state(model_->module(), "model.", out.shared);
    if (zero1_) {
      // Each rank's optimizer state covers its slice only.
      out.shared.metadata["ddp.zero1_ranks"] = std::to_string(place_.size);
      out.local.tensors["zero1.master"] = zero1_->master().detach().clone();
      context_.optimizer->save_state(zero1_->optimizer(), "zero1.optimizer.", out.local);
      return;
    }
    context_.optimizer->save_state(*optimizer_, "optimizer.", out.shared);
  }

  void load_state(const CheckpointState& in) override {
    settle_buffer_broadcast();  // so that a broadcast in flight cannot overwrite what is loaded
    auto zero1_ranks = in.shared.metadata.find("ddp.zero1_ranks");
    const bool saved_zero1 = zero1_ranks != in.shared.metadata.end();
    if (saved_zero1 != static_cast<bool>(zero1_) ||
        (zero1_ && (zero1_ranks->second != std::to_string(place_.size) ||
                    in.shared.metadata.count(kSavedWorldSizeKey)))) {
      throw Error(
          std::string("ddp: the checkpoint's optimizer state was ") +
          (saved_zero1 ? "sharded over " + zero1_ranks->second + " ranks (zero1)" : "saved whole") +
          "; resume it with the same zero1 setting" + (saved_zero1 ? " on as many ranks" : ""));
    }
    load_module_state(model_->module(), "model.", in.shared);
    if (zero1_) {
      auto master = in.local.tensors.find("zero1.master");
      if (master == in.local.tensors.end()) throw Error("checkpoint lacks 'zero1.master'");
      at::NoGradGuard no_grad;
      zero1_->master().detach().copy_(master->second);
      context_.optimizer->load_state(zero1_->optimizer(), "zero1.optimizer.", in.local);
      return;
    }
    context_.optimizer->load_state(*optimizer_, "optimizer.", in.shared);
  }

  TensorMap full_parameters() const override {
    TensorMap out;
    for (const auto& item : model_->module().named_parameters(true)) {
      out[item.key()] = item.value().detach();
    }
    return out;
  }

  HeldBytes held_bytes() const override {
    std::vector<at::Tensor> buffers =
        reducer_ ? reducer_->bucket_buffers() : std::vector<at::Tensor>{};
    if (zero1_) {
      std::vector<at::Tensor> parameters = parameters_;
      parameters.push_back(zero1_->master());
      return count_held_bytes(parameters, &zero1_->optimizer(), buffers);
    }
    return count_held_bytes(parameters_, optimizer_.get(), buffers);
  }

 private:
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

  // finish_replicated_step with the optimizer step of zero1: the gradients are whole and equal
  // on every rank, so checks and clipping are local; only the step is sharded.
  void finish_zero1_step(const torch::Tensor& loss_sum, std::int64_t count, StepResult& result) {
    std::vector<torch::Tensor> gradients = gradients_of(parameters_);
    const bool finite = context_.precision->unscale_and_check(gradients);
    if (context_.step.max_grad_norm > 0) {
      result.grad_norm =
          clip_to_norm(gradients, global_norm(gradients), context_.step.max_grad_norm);
    }
    if (finite) zero1_->step();
    context_.precision->update(!finite);
    result.skipped = !finite;
    result.loss = count > 1 ? loss_sum / static_cast<double>(count) : loss_sum;
  }

  DdpOptions options_;
  StrategyContext context_;
  c10::intrusive_ptr<c10d::Backend> group_;
  DataParallelPlace place_;
  std::shared_ptr<Model> model_;
  std::vector<Block> blocks_;
  std::vector<torch::Tensor> parameters_;
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
      {option("bucket_cap_mb", 25.0, "gradient bucket size in MiB (one all-reduce per bucket)"),
       option("first_bucket_mb", 1.0,
              "size of the first bucket (the last layers), small so its all-reduce starts early"),
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
              "(half the bytes; the averaged gradients are rounded to that dtype)")},
      "distributed data parallel: replicated model, bucketed all-reduce overlapping backward",
      [](const Config& options, const BuildContext&) { return std::make_unique<Ddp>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("ddp", "1.0.0", trainyard::register_components)
