// Fully sharded data parallel (ZeRO-3, and ZeRO-2 with sharding = "grad_op"): the model is cut
// into units along its blocks; each unit's parameters are flattened into one buffer, padded to a
// multiple of the rank count, and each rank keeps only its contiguous shard of it, with the
// gradient and optimizer state of that shard. A unit's parameters exist in full only while it
// runs: they are all-gathered just before its forward (and, in full sharding, again before its
// backward), while the next unit's all-gather is already in flight; after backward its gradients
// are reduce-scattered so that each rank receives the sum of its shard only. The scheme of
// PyTorch's FSDP (FlatParameter, pre-backward hooks on a unit's output, post-backward hooks on
// the gradient accumulators), on the communicator's c10d backend.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Storage.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_map>
#include <utility>

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

enum class Sharding { kFull, kGradOp, kNone };

Sharding parse_sharding(const Config& config) {
  const std::string value = config.get_string("sharding");
  if (value == "full") return Sharding::kFull;
  if (value == "grad_op") return Sharding::kGradOp;
  if (value == "none") return Sharding::kNone;
  config.fail("sharding", "is '" + value + "'; expected \"full\", \"grad_op\" or \"none\"");
}

constexpr const char* kOptimizerPrefix = "fsdp.optimizer.";

// "auto", "float32", "bfloat16" or "float16".
std::string parse_dtype_name(const Config& config, const std::string& key) {
  const std::string value = config.get_string(key);
  if (value != "auto" && value != "float32" && value != "bfloat16" && value != "float16") {
    config.fail(key,
                "is '" + value + "'; expected \"auto\", \"float32\", \"bfloat16\" or \"float16\"");
  }
  return value;
}

at::ScalarType dtype_named(const std::string& name, at::ScalarType automatic) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float32") return at::kFloat;
  return automatic;
}

struct FsdpOptions {
  Sharding sharding = Sharding::kFull;
  bool prefetch = true;
  std::string param_dtype = "auto";  // gathered parameters; auto: the precision's autocast dtype
  std::string reduce_dtype = "float32";  // gradient reduction; auto: the gathered dtype
  bool full_state_dict = false;          // checkpoints consolidated instead of sharded
};

// Frees a tensor's memory while every view into it keeps its shape (PyTorch's FSDP frees the
// unsharded flat parameter the same way); restore_storage gives it memory again. Autograd's saved
// references to the views stay valid: they are refilled before backward reads them.
void release_storage(const at::Tensor& tensor) {
  c10::Storage storage = tensor.storage();
  if (storage.nbytes() == 0) return;
  storage.set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage.set_nbytes(0);
}

void restore_storage(const at::Tensor& tensor) {
  c10::Storage storage = tensor.storage();
  const auto bytes = static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
  if (storage.nbytes() == bytes) return;
  storage.set_data_ptr_noswap(storage.allocator()->allocate(bytes));
  storage.set_nbytes(bytes);
}

// One sharding unit: the parameters of one block (or, for the root unit, those no single block
// owns: tied weights, parameters outside every block).
struct Unit {
  std::string name;
  std::vector<std::size_t> parameters;  // indices into the strategy's parameter list
  std::vector<std::int64_t> offsets;    // of each parameter in the flat buffer
  std::int64_t numel = 0;               // unpadded
  std::int64_t shard_numel = 0;         // padded numel / ranks
  at::Tensor shard;  // this rank's slice of the flat parameters; what the optimizer steps
  at::Tensor full;   // the gathered flat parameters, which the model's parameters view
  bool gathered = false;
  c10::intrusive_ptr<c10d::Work> gather_work;  // an in-flight all-gather into `full`
  at::Tensor gather_input;                     // the shard in the gathered dtype, while in flight
  std::size_t pending = 0;                     // parameters still without a gradient
  bool reduced = false;                        // its gradient reduction was launched
  at::Tensor gradient_flat;                    // the flat gradient being reduced
  at::Tensor gradient_shard;                   // this rank's part of the reduced sum
  c10::intrusive_ptr<c10d::Work> reduce_work;
};

class Fsdp final : public Strategy {
 public:
  explicit Fsdp(const Config& config) {
    options_.sharding = parse_sharding(config);
    options_.prefetch = config.get_bool("prefetch");
    options_.param_dtype = parse_dtype_name(config, "param_dtype");
    options_.reduce_dtype = parse_dtype_name(config, "reduce_dtype");
    const std::string state_dict = config.get_string("state_dict");
    if (state_dict != "sharded" && state_dict != "full") {
      config.fail("state_dict", "is '" + state_dict + "'; expected \"sharded\" or \"full\"");
    }
    options_.full_state_dict = state_dict == "full";
  }

  void setup(StrategyContext& context) override {
    context_ = context;
    if (context.communicator) {
      group_ = context.communicator->world();
      place_ = {context.communicator->rank(), context.communicator->world_size()};
    }
    shard_ranks_ = options_.sharding == Sharding::kNone ? 1 : place_.size;
    shard_rank_ = options_.sharding == Sharding::kNone ? 0 : place_.rank;
    model_ = context.make_model(context.build);
    model_->module().to(context.build.device);
    model_->module().train();
    autocast_dtype_ = context.precision->autocast_dtype();
    // Replicated parameters are the fp32 master copy itself: only sharded modes gather in
    // another dtype.
    gather_dtype_ = options_.sharding == Sharding::kNone
                        ? at::kFloat
                        : dtype_named(options_.param_dtype, autocast_dtype_.value_or(at::kFloat));
    reduce_dtype_ = dtype_named(options_.reduce_dtype, gather_dtype_);
    for (const auto& item : model_->module().named_parameters(true)) {
      if (!item.value().requires_grad()) {
        throw Error("fsdp: parameter '" + item.key() +
                    "' is frozen (requires no gradient); fsdp shards trainable parameters only");
      }
      parameters_.push_back(item.value());
      names_.push_back(item.key());
    }
    for (const auto& item : model_->module().named_buffers(true)) {
      buffers_.push_back(item.value());
      buffer_names_.push_back(item.key());
    }
    if (group_) {
      // Every rank starts from rank 0's parameters and buffers.
      std::vector<at::Tensor> state = parameters_;
      state.insert(state.end(), buffers_.begin(), buffers_.end());
      broadcast_coalesced(state);
    }
    build_units();

    std::vector<at::Tensor> shards;
    for (auto& unit : units_) shards.push_back(unit.shard);
    optimizer_ = context.optimizer->create(shards);

    // Gradient hooks: a unit's gradients are reduced as soon as its last one is complete.
    accumulators_ = trainyard::on_gradient_ready(
        parameters_, [this](std::size_t index) { on_gradient_ready(index); });

    std::vector<Block> blocks = model_->blocks();
    std::vector<Block> wrapped;
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      Block block = blocks[k];
      auto inner = block.forward;
      block.forward = [this, k, inner](const torch::Tensor& x) { return run_block(k, inner, x); };
      wrapped.push_back(std::move(block));
    }
    blocks_ = with_activation_checkpointing(wrapped, context.step.activation_checkpointing);
  }

  StepResult train_step(std::span<const Batch> micro_batches) override {
    const auto count = static_cast<std::int64_t>(micro_batches.size());
    for (auto& unit : units_) unit.shard.mutable_grad() = at::Tensor();
    torch::Tensor loss_sum;
    StepResult result;
    for (std::int64_t i = 0; i < count; ++i) {
      const Batch& batch = micro_batches[static_cast<std::size_t>(i)];
      // Only the last micro-batch reduces; the others accumulate whole gradients locally, as
      // PyTorch's FSDP does under no_sync.
      synchronise_ = i == count - 1;
      for (auto& unit : units_) {
        unit.pending = unit.parameters.size();
        unit.reduced = false;
      }
      torch::Tensor detached =
          forward_backward(*model_, blocks_, batch, count, context_, autocast_dtype_);
      finish_backward();
      if (context_.phases) context_.phases->mark(StepPhase::CommWait);
      loss_sum = loss_sum.defined() ? loss_sum + detached : detached;
      result.samples += batch.size;
    }

    std::vector<at::Tensor> gradients;
    for (auto& unit : units_) gradients.push_back(unit.shard.grad());
    // Each rank holds other gradients: the decision to step and the norm are taken over all.
    torch::Tensor found_inf = context_.precision->unscale(gradients);
    if (found_inf.defined() && sharded_group()) {
      std::vector<at::Tensor> message{found_inf};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::MAX;
      CollectiveWait wait;
      group_->allreduce(message, options)->wait();
    }
    if (context_.step.max_grad_norm > 0) {
      result.grad_norm =
          clip_to_norm(gradients, global_gradient_norm(gradients), context_.step.max_grad_norm);
    }
    const bool step = Precision::should_step(found_inf);
    if (step) optimizer_->step();
    context_.precision->update(found_inf);
    result.skipped = !step;
    result.loss = count > 1 ? loss_sum / static_cast<double>(count) : loss_sum;
    return result;
  }

  EvalResult eval_step(const Batch& batch) override {
    EvalResult result =
        evaluate_blocks(*model_, blocks_, batch, context_.build.device.type(), autocast_dtype_);
    release_all();
    return result;
  }

  void set_learning_rate(double lr) override { trainyard::set_learning_rate(*optimizer_, lr); }

  DataParallelPlace data_parallel_place() const override { return place_; }

  // Sharded (each rank its shards, in its own file) or, with state_dict = "full", consolidated:
  // whole parameters and whole flat optimizer state in the shared file, gathered collectively
  // (every rank calls save_state).
  void save_state(CheckpointState& out) const override {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      out.shared.tensors["model." + buffer_names_[i]] = buffers_[i].detach().clone();
    }
    out.shared.metadata["fsdp.layout"] = layout();
    out.shared.metadata["fsdp.state_dict"] = options_.full_state_dict ? "full" : "sharded";
    if (!options_.full_state_dict) {
      for (std::size_t u = 0; u < units_.size(); ++u) {
        out.local.tensors[shard_key(u)] = units_[u].shard.detach().clone();
      }
      context_.optimizer->save_state(*optimizer_, kOptimizerPrefix, out.local);
      return;
    }
    for (auto& [name, tensor] : full_parameters()) out.shared.tensors["model." + name] = tensor;
    StateDict optimizer_state;
    context_.optimizer->save_state(*optimizer_, kOptimizerPrefix, optimizer_state);
    for (const auto& [key, tensor] : optimizer_state.tensors) {
      const Unit& unit = units_[unit_of_optimizer_key(key)];
      const bool per_element = tensor.dim() > 0 && tensor.numel() == unit.shard_numel;
      out.shared.tensors[key] =
          per_element ? gather_copy(unit, tensor).narrow(0, 0, unit.numel).clone() : tensor;
    }
  }

  // Loads shards saved by the same number of ranks directly; shards saved by another number
  // (the store then hands every saved rank's entries over) are concatenated and cut again.
  void load_state(const CheckpointState& in) override {
    auto it = in.shared.metadata.find("fsdp.layout");
    if (it == in.shared.metadata.end()) {
      throw Error("checkpoint was not written by the fsdp strategy (it lacks 'fsdp.layout')");
    }
    const std::string saved = it->second;
    const auto separator = saved.find(';');
    if (saved.rfind("ranks=", 0) != 0 || separator == std::string::npos ||
        saved.substr(separator) != units_layout()) {
      throw Error("checkpoint's fsdp layout (" + saved + ") does not match this model's (" +
                  layout() + ")");
    }
    auto kind = in.shared.metadata.find("fsdp.state_dict");
    if (kind != in.shared.metadata.end() && kind->second == "full") return load_full_state(in);
    const std::int64_t saved_ranks = std::stoll(saved.substr(6, separator - 6));
    const bool resharding = in.shared.metadata.count(kSavedWorldSizeKey) != 0;
    if (!resharding && saved_ranks != shard_ranks_) {
      throw Error("checkpoint holds shards for " + std::to_string(saved_ranks) +
                  " ranks, this run shards over " + std::to_string(shard_ranks_) +
                  " (another sharding mode on the same number of ranks); resume with the "
                  "sharding it was saved with");
    }
    // Rank `shard_rank_`'s part of a flat tensor saved as `key` in each saved rank's file.
    auto cut = [&](const std::string& key, const Unit& unit) -> at::Tensor {
      if (!resharding) return entry(in.local, key, unit.shard);
      std::vector<at::Tensor> parts;
      for (int rank = 0; rank < saved_ranks; ++rank) {
        auto part = in.local.tensors.find(saved_rank_key(rank, key));
        if (part == in.local.tensors.end()) {
          throw Error("checkpoint lacks rank " + std::to_string(rank) + "'s '" + key + "'");
        }
        parts.push_back(part->second.reshape({-1}));
      }
      at::Tensor flat = at::cat(parts);
      if (flat.numel() < unit.numel) {
        throw Error("checkpoint's '" + key + "' holds " + std::to_string(flat.numel()) +
                    " values over all ranks, unit " + unit.name + " has " +
                    std::to_string(unit.numel));
      }
      at::Tensor padded = at::zeros({unit.shard_numel * shard_ranks_}, flat.options());
      padded.narrow(0, 0, unit.numel).copy_(flat.narrow(0, 0, unit.numel));
      return padded.narrow(0, shard_rank_ * unit.shard_numel, unit.shard_numel).clone();
    };
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      buffers_[i].copy_(entry(in.shared, "model." + buffer_names_[i], buffers_[i]));
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
      units_[u].shard.copy_(cut(shard_key(u), units_[u]));
    }
    if (!resharding) {
      context_.optimizer->load_state(*optimizer_, kOptimizerPrefix, in.local);
    } else {
      // Per-element state (moments, momentum) has the shard's length and is cut like the
      // parameters; anything else (step counters) is the same on every rank.
      StateDict optimizer_state;
      const std::string first = saved_rank_key(0, kOptimizerPrefix);
      for (const auto& [name, tensor] : in.local.tensors) {
        if (name.rfind(first, 0) != 0) continue;
        const std::string key = name.substr(first.size());
        const std::string own = kOptimizerPrefix + key;
        const std::size_t unit = std::stoul(key.substr(key.find('.') + 1));
        if (unit >= units_.size())
          throw Error("checkpoint has optimizer state for no unit: " + own);
        const auto& saved_shard = in.local.tensors.find(saved_rank_key(0, shard_key(unit)));
        const bool per_element = saved_shard != in.local.tensors.end() && tensor.dim() > 0 &&
                                 tensor.numel() == saved_shard->second.numel();
        optimizer_state.tensors[own] = per_element ? cut(own, units_[unit]) : tensor;
      }
      context_.optimizer->load_state(*optimizer_, kOptimizerPrefix, optimizer_state);
    }
    if (options_.sharding != Sharding::kNone) release_all();
  }

  // A consolidated checkpoint: whole parameters and flat optimizer state, cut for this rank
  // whatever the number of ranks that saved it.
  void load_full_state(const CheckpointState& in) {
    // This rank's part of an unpadded flat tensor of unit `unit`.
    auto cut = [&](const at::Tensor& flat, const Unit& unit, const std::string& key) {
      if (flat.numel() != unit.numel) {
        throw Error("checkpoint's '" + key + "' holds " + std::to_string(flat.numel()) +
                    " values, unit " + unit.name + " has " + std::to_string(unit.numel));
      }
      at::Tensor padded = at::zeros({unit.shard_numel * shard_ranks_}, flat.options());
      padded.narrow(0, 0, unit.numel).copy_(flat);
      return padded.narrow(0, shard_rank_ * unit.shard_numel, unit.shard_numel).clone();
    };
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      buffers_[i].copy_(entry(in.shared, "model." + buffer_names_[i], buffers_[i]));
    }
    for (auto& unit : units_) {
      std::vector<at::Tensor> parts;
      for (std::size_t i : unit.parameters) {
        parts.push_back(entry(in.shared, "model." + names_[i], parameters_[i]).reshape({-1}));
      }
      unit.shard.copy_(cut(at::cat(parts).to(at::kFloat), unit, unit.name));
    }
    StateDict optimizer_state;
    for (const auto& [key, tensor] : in.shared.tensors) {
      if (key.rfind(kOptimizerPrefix, 0) != 0) continue;
      const Unit& unit = units_[unit_of_optimizer_key(key)];
      const bool per_element = tensor.dim() > 0 && tensor.numel() == unit.numel;
      optimizer_state.tensors[key] = per_element ? cut(tensor.reshape({-1}), unit, key) : tensor;
    }
    context_.optimizer->load_state(*optimizer_, kOptimizerPrefix, optimizer_state);
    if (options_.sharding != Sharding::kNone) release_all();
  }

  // The unit of an optimizer state entry "fsdp.optimizer.param.<unit>.<field>".
  std::size_t unit_of_optimizer_key(const std::string& key) const {
    const std::string rest = key.substr(std::string(kOptimizerPrefix).size());
    const std::size_t unit = std::stoul(rest.substr(rest.find('.') + 1));
    if (unit >= units_.size()) throw Error("checkpoint has optimizer state for no unit: " + key);
    return unit;
  }

  // Collective when sharded: every rank calls it, each gets the full parameters.
  TensorMap full_parameters() const override {
    TensorMap out;
    for (const auto& unit : units_) {
      at::Tensor flat = gather_copy(unit);
      for (std::size_t i = 0; i < unit.parameters.size(); ++i) {
        const at::Tensor& parameter = parameters_[unit.parameters[i]];
        out[names_[unit.parameters[i]]] =
            flat.narrow(0, unit.offsets[i], parameter.numel()).view(parameter.sizes()).clone();
      }
    }
    return out;
  }

  HeldBytes held_bytes() const override {
    // Shards and their gradients; gathered buffers only while they hold memory; the model's
    // parameters view the gathered buffers (counted once); whole gradients while accumulating.
    std::vector<at::Tensor> tensors;
    for (const auto& unit : units_) tensors.push_back(unit.shard);
    for (const auto& unit : units_) tensors.push_back(unit.full);
    tensors.insert(tensors.end(), parameters_.begin(), parameters_.end());
    std::vector<at::Tensor> gradient_buffers;
    for (const auto& unit : units_) {
      if (unit.gradient_flat.defined()) gradient_buffers.push_back(unit.gradient_flat);
    }
    return count_held_bytes(tensors, optimizer_.get(), gradient_buffers);
  }

 private:
  bool sharded_group() const { return group_ && options_.sharding != Sharding::kNone; }

  static std::string shard_key(std::size_t unit) { return "fsdp.shard." + std::to_string(unit); }

  static at::Tensor entry(const StateDict& dict, const std::string& key, const at::Tensor& like) {
    auto it = dict.tensors.find(key);
    if (it == dict.tensors.end()) throw Error("checkpoint lacks '" + key + "'");
    if (!it->second.sizes().equals(like.sizes())) {
      std::ostringstream message;
      message << "checkpoint entry '" << key << "' has shape " << it->second.sizes()
              << ", this run expects " << like.sizes();
      throw Error(message.str());
    }
    return it->second;
  }

  // The flat layout a sharded checkpoint depends on, which `trainyard checkpoint export` reads:
  // "ranks=R" then per unit ";<unit>:<numel>[<name>@<d0>x<d1>...,...]", the unit's parameters in
  // flat order; shard u of rank r holds elements [r, r + 1) * ceil(numel / R) of unit u.
  std::string layout() const { return "ranks=" + std::to_string(shard_ranks_) + units_layout(); }

  std::string units_layout() const {
    std::ostringstream text;
    for (const auto& unit : units_) {
      text << ";" << unit.name << ":" << unit.numel << "[";
      for (std::size_t i = 0; i < unit.parameters.size(); ++i) {
        text << (i ? "," : "") << names_[unit.parameters[i]] << "@";
        const auto sizes = parameters_[unit.parameters[i]].sizes();
        for (std::size_t d = 0; d < sizes.size(); ++d) text << (d ? "x" : "") << sizes[d];
      }
      text << "]";
    }
    return text.str();
  }

  // Units along the blocks: a parameter used by exactly one block belongs to that block's unit;
  // the rest (tied between blocks, or in no block) form the root unit, gathered for the whole
  // forward and backward.
  void build_units() {
    std::unordered_map<const void*, std::size_t> index_of;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      index_of[parameters_[i].unsafeGetTensorImpl()] = i;
    }
    std::vector<Block> blocks = model_->blocks();
    std::vector<int> uses(parameters_.size(), 0);
    std::vector<std::vector<std::size_t>> members(blocks.size());
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      for (const auto& parameter : blocks[k].module->parameters(true)) {
        auto it = index_of.find(parameter.unsafeGetTensorImpl());
        if (it == index_of.end()) continue;
        if (std::find(members[k].begin(), members[k].end(), it->second) != members[k].end())
          continue;
        members[k].push_back(it->second);
        ++uses[it->second];
      }
    }
    Unit root;
    root.name = "root";
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (uses[i] != 1) root.parameters.push_back(i);
    }
    if (!root.parameters.empty()) {
      units_.push_back(std::move(root));
      root_unit_ = 0;
    }
    unit_of_block_.assign(blocks.size(), -1);
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      Unit unit;
      unit.name = blocks[k].name;
      for (std::size_t i : members[k]) {
        if (uses[i] == 1) unit.parameters.push_back(i);
      }
      if (unit.parameters.empty()) continue;
      unit_of_block_[k] = static_cast<int>(units_.size());
      units_.push_back(std::move(unit));
    }
    unit_of_parameter_.assign(parameters_.size(), 0);
    at::NoGradGuard no_grad;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      Unit& unit = units_[u];
      for (std::size_t i : unit.parameters) {
        unit_of_parameter_[i] = u;
        unit.offsets.push_back(unit.numel);
        unit.numel += parameters_[i].numel();
      }
      const std::int64_t ranks = shard_ranks_;
      unit.shard_numel = (unit.numel + ranks - 1) / ranks;
      const at::Tensor& first = parameters_[unit.parameters.front()];
      if (first.scalar_type() != at::kFloat) {
        throw Error("fsdp: parameter '" + names_[unit.parameters.front()] +
                    "' is not float32; the shards are the fp32 master copy");
      }
      at::Tensor master =
          at::zeros({unit.shard_numel * ranks}, first.options().requires_grad(false));
      for (std::size_t j = 0; j < unit.parameters.size(); ++j) {
        const at::Tensor& parameter = parameters_[unit.parameters[j]];
        master.narrow(0, unit.offsets[j], parameter.numel())
            .copy_(parameter.detach().reshape({-1}));
      }
      unit.full = gather_dtype_ == at::kFloat ? master : master.to(gather_dtype_);
      for (std::size_t j = 0; j < unit.parameters.size(); ++j) {
        at::Tensor& parameter = parameters_[unit.parameters[j]];
        // The parameter keeps its identity (autograd, module, optimizer hooks) and now views
        // the flat buffer, in the gathered dtype.
        parameter.set_data(
            unit.full.narrow(0, unit.offsets[j], parameter.numel()).view(parameter.sizes()));
      }
      if (options_.sharding == Sharding::kNone) {
        unit.shard = unit.full;  // the model's parameters view what the optimizer steps
        unit.gathered = true;
      } else {
        unit.shard = master.narrow(0, shard_rank_ * unit.shard_numel, unit.shard_numel).clone();
        release(unit);
      }
      unit.shard.requires_grad_(true);
    }
  }

  int next_unit_after(std::size_t block) const {
    for (std::size_t k = block + 1; k < unit_of_block_.size(); ++k) {
      if (unit_of_block_[k] >= 0) return unit_of_block_[k];
    }
    return -1;
  }
  int previous_unit_before(std::size_t block) const {
    for (std::size_t k = block; k-- > 0;) {
      if (unit_of_block_[k] >= 0) return unit_of_block_[k];
    }
    return -1;
  }
  int last_block_unit() const {
    for (std::size_t k = unit_of_block_.size(); k-- > 0;) {
      if (unit_of_block_[k] >= 0) return unit_of_block_[k];
    }
    return -1;
  }

  torch::Tensor run_block(std::size_t k,
                          const std::function<torch::Tensor(const torch::Tensor&)>& inner,
                          const torch::Tensor& x) {
    const bool training = at::GradMode::is_enabled();
    if (root_unit_ >= 0) gather(units_[static_cast<std::size_t>(root_unit_)]);
    const int u = unit_of_block_[k];
    if (u >= 0) gather(units_[static_cast<std::size_t>(u)]);
    // The next unit's all-gather runs while this one computes; at most two units are gathered.
    if (options_.prefetch) {
      const int next = next_unit_after(k);
      if (next >= 0) start_gather(units_[static_cast<std::size_t>(next)]);
    }
    torch::Tensor y = inner(x);
    if (u < 0 || options_.sharding == Sharding::kNone) return y;
    Unit& unit = units_[static_cast<std::size_t>(u)];
    if (!training) {
      release(unit);  // evaluation (or a forward to be recomputed): nothing comes back for it
      return y;
    }
    // Full sharding frees the parameters until backward; the last unit's backward comes next.
    if (options_.sharding == Sharding::kFull && u != last_block_unit()) release(unit);
    if (y.requires_grad()) {
      y.register_hook([this, k, u](const at::Tensor&) { before_backward(k, u); });
    }
    return y;
  }

  // Runs when the gradient of a unit's output arrives: its backward is next.
  void before_backward(std::size_t k, int u) {
    gather(units_[static_cast<std::size_t>(u)]);
    if (options_.prefetch) {
      const int previous = previous_unit_before(k);
      if (previous >= 0) start_gather(units_[static_cast<std::size_t>(previous)]);
    }
  }

  void start_gather(Unit& unit) {
    if (unit.gathered || unit.gather_work) return;
    restore_storage(unit.full);
    if (!group_ || shard_ranks_ == 1) {
      at::NoGradGuard no_grad;
      unit.full.copy_(unit.shard.detach());
      unit.gathered = true;
      return;
    }
    // The input must outlive the collective: kept with the unit until the gather completes.
    unit.gather_input = unit.shard.detach().to(gather_dtype_);
    unit.gather_work = group_->_allgather_base(unit.full, unit.gather_input);
  }

  void gather(Unit& unit) {
    if (unit.gathered) return;
    start_gather(unit);
    if (unit.gather_work) {
      CollectiveWait wait;
      unit.gather_work->wait();
      unit.gather_work.reset();
      unit.gather_input = at::Tensor();
    }
    unit.gathered = true;
  }

  void release(Unit& unit) {
    if (options_.sharding == Sharding::kNone) return;
    if (unit.gather_work) {  // a prefetch nobody used: complete it before freeing its target
      CollectiveWait wait;
      unit.gather_work->wait();
      unit.gather_work.reset();
      unit.gather_input = at::Tensor();
    }
    release_storage(unit.full);
    unit.gathered = false;
  }

  void release_all() {
    for (auto& unit : units_) release(unit);
  }

  // Every rank's `shard` (by default the unit's parameter shard) in one padded flat tensor,
  // leaving the unit's own buffers as they are.
  at::Tensor gather_copy(const Unit& unit, const at::Tensor& shard = {}) const {
    at::Tensor input = (shard.defined() ? shard : unit.shard).detach().contiguous();
    at::Tensor flat =
        at::empty({unit.shard_numel * shard_ranks_}, input.options().requires_grad(false));
    if (!group_ || shard_ranks_ == 1) {
      flat.copy_(input);
    } else {
      CollectiveWait wait;
      group_->_allgather_base(flat, input)->wait();
    }
    return flat;
  }

  void on_gradient_ready(std::size_t index) {
    Unit& unit = units_[unit_of_parameter_[index]];
    if (unit.pending == 0) return;
    if (--unit.pending == 0) unit_backward_done(unit);
  }

  // A unit's gradients are complete: reduce them (last micro-batch) and free its parameters.
  void unit_backward_done(Unit& unit) {
    if (synchronise_) launch_reduction(unit);
    // The root unit's parameters may still be read by other units' backward.
    if (&unit != root()) release(unit);
  }

  Unit* root() { return root_unit_ >= 0 ? &units_[static_cast<std::size_t>(root_unit_)] : nullptr; }

  void launch_reduction(Unit& unit) {
    if (unit.reduced) return;
    unit.reduced = true;
    at::NoGradGuard no_grad;
    const std::int64_t padded = unit.shard_numel * shard_ranks_;
    unit.gradient_flat =
        at::zeros({padded}, unit.shard.options().dtype(reduce_dtype_).requires_grad(false));
    for (std::size_t i = 0; i < unit.parameters.size(); ++i) {
      at::Tensor& parameter = parameters_[unit.parameters[i]];
      if (parameter.grad().defined()) {
        unit.gradient_flat.narrow(0, unit.offsets[i], parameter.numel())
            .copy_(parameter.grad().reshape({-1}));
      }
      // Whole gradients live only until they are in the flat buffer.
      parameter.mutable_grad() = at::Tensor();
    }
    if (!group_) {
      unit.gradient_shard = unit.gradient_flat;
      return;
    }
    unit.gradient_flat.div_(place_.size);
    std::vector<at::Tensor> tensors{unit.gradient_flat};
    if (options_.sharding == Sharding::kNone) {
      unit.gradient_shard = unit.gradient_flat;
      unit.reduce_work = group_->allreduce(tensors);
    } else {
      unit.gradient_shard = at::empty({unit.shard_numel}, unit.gradient_flat.options());
      unit.reduce_work = group_->_reduce_scatter_base(unit.gradient_shard, unit.gradient_flat);
    }
  }

  // After each micro-batch's backward: every unit whose gradients are not all there (parameters
  // a step did not use count as zero) is completed, reductions are awaited, whole parameters
  // freed.
  void finish_backward() {
    for (auto& unit : units_) {
      if (unit.pending > 0) {
        unit.pending = 0;
        if (synchronise_) launch_reduction(unit);
      }
    }
    if (synchronise_) {
      CollectiveWait wait;
      for (auto& unit : units_) {
        if (unit.reduce_work) unit.reduce_work->wait();
        unit.reduce_work.reset();
      }
    }
    for (auto& unit : units_) {
      if (synchronise_ && unit.gradient_shard.defined()) {
        unit.shard.mutable_grad() = unit.gradient_shard.to(at::kFloat);  // fp32 master gradient
        unit.gradient_shard = at::Tensor();
      }
      unit.gradient_flat = at::Tensor();
      release(unit);
    }
  }

  // The norm over every shard of every rank.
  torch::Tensor global_gradient_norm(const std::vector<at::Tensor>& gradients) {
    std::vector<at::Tensor> squares;
    for (const auto& gradient : gradients) {
      squares.push_back(gradient.detach().to(at::kFloat).pow(2).sum());
    }
    at::Tensor total = at::stack(squares).sum().reshape({1});
    if (sharded_group()) {
      std::vector<at::Tensor> message{total};
      CollectiveWait wait;
      group_->allreduce(message)->wait();
    }
    return total.sqrt().reshape({});
  }

  void broadcast_coalesced(const std::vector<at::Tensor>& tensors) {
    at::NoGradGuard no_grad;
    std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
    for (const auto& tensor : tensors) by_type[tensor.scalar_type()].push_back(tensor);
    for (auto& [type, group] : by_type) {
      std::vector<at::Tensor> flat_views;
      for (const auto& tensor : group) flat_views.push_back(tensor.reshape({-1}));
      std::vector<at::Tensor> message{at::cat(flat_views)};
      {
        CollectiveWait wait;
        group_->broadcast(message)->wait();
      }
      std::int64_t offset = 0;
      for (auto& tensor : group) {
        tensor.copy_(message[0].narrow(0, offset, tensor.numel()).view(tensor.sizes()));
        offset += tensor.numel();
      }
    }
  }

  FsdpOptions options_;
  StrategyContext context_;
  c10::intrusive_ptr<c10d::Backend> group_;
  DataParallelPlace place_;
  std::int64_t shard_ranks_ = 1;
  std::int64_t shard_rank_ = 0;
  std::shared_ptr<Model> model_;
  std::vector<Block> blocks_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> buffers_;
  std::vector<std::string> buffer_names_;
  std::vector<Unit> units_;
  int root_unit_ = -1;
  std::vector<int> unit_of_block_;
  std::vector<std::size_t> unit_of_parameter_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torch::ScalarType> autocast_dtype_;
  at::ScalarType gather_dtype_ = at::kFloat;
  at::ScalarType reduce_dtype_ = at::kFloat;
  bool synchronise_ = true;
};

void register_components(Registry& registry) {
  registry.add<Strategy>(
      "fsdp",
      {option("sharding", "full",
              "\"full\" (FULL_SHARD: parameters, gradients and optimizer state sharded), "
              "\"grad_op\" (SHARD_GRAD_OP: parameters kept gathered from forward to backward), "
              "\"none\" (replicated, as ddp)"),
       option("prefetch", true,
              "all-gather the next unit's parameters while the current unit computes"),
       option("param_dtype", "auto",
              "dtype of gathered parameters (\"auto\": the precision's autocast dtype; "
              "\"float32\", \"bfloat16\", \"float16\"); shards stay fp32"),
       option("reduce_dtype", "float32",
              "dtype gradients are reduced in (\"auto\": the gathered parameters' dtype)"),
       option("state_dict", "sharded",
              "checkpoints: \"sharded\" (each rank writes its shards) or \"full\" "
              "(consolidated whole tensors in the shared file, gathered on save)")},
      "fully sharded data parallel: parameters, gradients and optimizer state sharded per block",
      [](const Config& options, const BuildContext&) { return std::make_unique<Fsdp>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("fsdp", "1.0.0", trainyard::register_components)
