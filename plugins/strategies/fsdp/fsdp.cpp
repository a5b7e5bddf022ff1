// Fully sharded data parallel (ZeRO-3, and ZeRO-2 with sharding = "grad_op") over the mesh's
// dp_shard group: the model is cut into units along its blocks, each rank keeps only its shard of
// each unit's flattened parameters, with that shard's gradient and optimizer state, and a unit's
// parameters exist in full only while it runs. The unit machinery (flattening, gathering before
// forward and backward, freeing, reduce-scattering gradients from hooks, prefetch) is the SDK's
// ShardedUnits; this plugin adds the step, the options and the checkpoint format.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <sstream>
#include <utility>

#include "trainyard/activation_checkpoint.hpp"
#include "trainyard/checkpoint_store.hpp"
#include "trainyard/distributed.hpp"
#include "trainyard/error.hpp"
#include "trainyard/gradients.hpp"
#include "trainyard/micro_batch.hpp"
#include "trainyard/model.hpp"
#include "trainyard/module_state.hpp"
#include "trainyard/optimizer.hpp"
#include "trainyard/plugin.hpp"
#include "trainyard/precision.hpp"
#include "trainyard/process_mesh.hpp"
#include "trainyard/replicated_step.hpp"
#include "trainyard/sharded_units.hpp"
#include "trainyard/step_phases.hpp"
#include "trainyard/strategy.hpp"

namespace trainyard {
namespace {

UnitSharding parse_sharding(const Config& config) {
  const std::string value = config.get_string("sharding");
  if (value == "full") return UnitSharding::kFull;
  if (value == "grad_op") return UnitSharding::kGradOp;
  if (value == "none") return UnitSharding::kNone;
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
  UnitSharding sharding = UnitSharding::kFull;
  bool prefetch = true;
  std::string param_dtype = "auto";  // gathered parameters; auto: the precision's autocast dtype
  std::string reduce_dtype = "float32";  // gradient reduction; auto: the gathered dtype
  bool full_state_dict = false;          // checkpoints consolidated instead of sharded
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
    // Units are sharded over the dp_shard ranks; a replicate dimension would need hybrid
    // sharding (shard within a group, all-reduce across groups), which is not built.
    mesh_ = mesh_of(context.build);
    if (mesh_->size(MeshGroup::kDataReplicate) > 1) {
      throw Error("fsdp: dp_replicate = " + std::to_string(mesh_->size(MeshGroup::kDataReplicate)) +
                  " needs hybrid sharding, which fsdp does not implement; set [parallel] "
                  "dp_replicate = 1 (fsdp shards over dp_shard)");
    }
    group_ = mesh_->group(MeshGroup::kDataShard);
    place_ = {mesh_->rank(MeshGroup::kData), mesh_->size(MeshGroup::kData)};
    model_ = context.make_model(context.build);
    model_->module().to(context.build.device);
    model_->module().train();
    autocast_dtype_ = context.precision->autocast_dtype();
    ShardedUnitsOptions units;
    units.sharding = options_.sharding;
    units.prefetch = options_.prefetch;
    units.gather_dtype = dtype_named(options_.param_dtype, autocast_dtype_.value_or(at::kFloat));
    // Replicated parameters are the fp32 master copy itself: nothing is gathered in another
    // dtype, and "auto" reduces in float32.
    units.reduce_dtype =
        dtype_named(options_.reduce_dtype,
                    options_.sharding == UnitSharding::kNone ? at::kFloat : units.gather_dtype);
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
    try {
      units_ = std::make_unique<ShardedUnits>(parameters_, names_, model_->blocks(), group_, units);
    } catch (const Error& error) {
      throw Error(std::string("fsdp: ") + error.what());
    }
    optimizer_ = context.optimizer->create(units_->shards());
    blocks_ =
        with_activation_checkpointing(units_->blocks(), context.step.activation_checkpointing);
  }

  StepResult train_step(std::span<const Batch> micro_batches) override {
    const auto count = static_cast<std::int64_t>(micro_batches.size());
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      units_->shard(u).mutable_grad() = at::Tensor();
    }
    torch::Tensor loss_sum;
    StepResult result;
    for (std::int64_t i = 0; i < count; ++i) {
      const Batch& batch = micro_batches[static_cast<std::size_t>(i)];
      // Only the last micro-batch reduces; the others accumulate whole gradients locally, as
      // PyTorch's FSDP does under no_sync.
      units_->prepare_backward(i == count - 1);
      torch::Tensor detached =
          forward_backward(*model_, blocks_, batch, count, context_, autocast_dtype_);
      units_->finish_backward();
      if (context_.phases) context_.phases->mark(StepPhase::CommWait);
      loss_sum = loss_sum.defined() ? loss_sum + detached : detached;
      result.samples += batch.size;
    }

    std::vector<at::Tensor> gradients;
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      gradients.push_back(units_->shard(u).grad());
    }
    // Each rank holds other gradients: the decision to step and the norm are taken over all.
    torch::Tensor found_inf = context_.precision->unscale(gradients);
    units_->combine_found_inf(found_inf);
    if (context_.step.max_grad_norm > 0) {
      result.grad_norm =
          clip_to_norm(gradients, units_->gradient_norm(gradients), context_.step.max_grad_norm);
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
    units_->release_all();
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
      for (std::size_t u = 0; u < units_->unit_count(); ++u) {
        out.local.tensors[shard_key(u)] = units_->shard(u).detach().clone();
      }
      context_.optimizer->save_state(*optimizer_, kOptimizerPrefix, out.local);
      return;
    }
    for (auto& [name, tensor] : full_parameters()) out.shared.tensors["model." + name] = tensor;
    StateDict optimizer_state;
    context_.optimizer->save_state(*optimizer_, kOptimizerPrefix, optimizer_state);
    for (const auto& [key, tensor] : optimizer_state.tensors) {
      const std::size_t u = unit_of_optimizer_key(key);
      const ShardedUnitLayout& unit = units_->layout(u);
      const bool per_element = tensor.dim() > 0 && tensor.numel() == unit.shard_numel;
      out.shared.tensors[key] =
          per_element ? units_->gather_copy(u, tensor).narrow(0, 0, unit.numel).clone() : tensor;
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
    const std::int64_t shard_ranks = units_->shard_ranks();
    const std::int64_t shard_rank = units_->shard_rank();
    if (!resharding && saved_ranks != shard_ranks) {
      throw Error("checkpoint holds shards for " + std::to_string(saved_ranks) +
                  " ranks, this run shards over " + std::to_string(shard_ranks) +
                  " (another sharding mode on the same number of ranks); resume with the "
                  "sharding it was saved with");
    }
    // Rank `shard_rank`'s part of unit `u`'s flat tensor saved as `key` in each saved rank's
    // file.
    auto cut = [&](const std::string& key, std::size_t u) -> at::Tensor {
      if (!resharding) return entry(in.local, key, units_->shard(u));
      const ShardedUnitLayout& unit = units_->layout(u);
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
      at::Tensor padded = at::zeros({unit.shard_numel * shard_ranks}, flat.options());
      padded.narrow(0, 0, unit.numel).copy_(flat.narrow(0, 0, unit.numel));
      return padded.narrow(0, shard_rank * unit.shard_numel, unit.shard_numel).clone();
    };
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      buffers_[i].copy_(entry(in.shared, "model." + buffer_names_[i], buffers_[i]));
    }
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      units_->shard(u).copy_(cut(shard_key(u), u));
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
        if (unit >= units_->unit_count())
          throw Error("checkpoint has optimizer state for no unit: " + own);
        const auto& saved_shard = in.local.tensors.find(saved_rank_key(0, shard_key(unit)));
        const bool per_element = saved_shard != in.local.tensors.end() && tensor.dim() > 0 &&
                                 tensor.numel() == saved_shard->second.numel();
        optimizer_state.tensors[own] = per_element ? cut(own, unit) : tensor;
      }
      context_.optimizer->load_state(*optimizer_, kOptimizerPrefix, optimizer_state);
    }
    if (options_.sharding != UnitSharding::kNone) units_->release_all();
  }

  // A consolidated checkpoint: whole parameters and flat optimizer state, cut for this rank
  // whatever the number of ranks that saved it.
  void load_full_state(const CheckpointState& in) {
    // This rank's part of an unpadded flat tensor of unit `unit`.
    auto cut = [&](const at::Tensor& flat, const ShardedUnitLayout& unit, const std::string& key) {
      if (flat.numel() != unit.numel) {
        throw Error("checkpoint's '" + key + "' holds " + std::to_string(flat.numel()) +
                    " values, unit " + unit.name + " has " + std::to_string(unit.numel));
      }
      const std::int64_t shard_ranks = units_->shard_ranks();
      at::Tensor padded = at::zeros({unit.shard_numel * shard_ranks}, flat.options());
      padded.narrow(0, 0, unit.numel).copy_(flat);
      return padded.narrow(0, units_->shard_rank() * unit.shard_numel, unit.shard_numel).clone();
    };
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      buffers_[i].copy_(entry(in.shared, "model." + buffer_names_[i], buffers_[i]));
    }
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      const ShardedUnitLayout& unit = units_->layout(u);
      std::vector<at::Tensor> parts;
      for (std::size_t i : unit.parameters) {
        parts.push_back(entry(in.shared, "model." + names_[i], parameters_[i]).reshape({-1}));
      }
      units_->shard(u).copy_(cut(at::cat(parts).to(at::kFloat), unit, unit.name));
    }
    StateDict optimizer_state;
    for (const auto& [key, tensor] : in.shared.tensors) {
      if (key.rfind(kOptimizerPrefix, 0) != 0) continue;
      const ShardedUnitLayout& unit = units_->layout(unit_of_optimizer_key(key));
      const bool per_element = tensor.dim() > 0 && tensor.numel() == unit.numel;
      optimizer_state.tensors[key] = per_element ? cut(tensor.reshape({-1}), unit, key) : tensor;
    }
    context_.optimizer->load_state(*optimizer_, kOptimizerPrefix, optimizer_state);
    if (options_.sharding != UnitSharding::kNone) units_->release_all();
  }

  // The unit of an optimizer state entry "fsdp.optimizer.param.<unit>.<field>".
  std::size_t unit_of_optimizer_key(const std::string& key) const {
    const std::string rest = key.substr(std::string(kOptimizerPrefix).size());
    const std::size_t unit = std::stoul(rest.substr(rest.find('.') + 1));
    if (unit >= units_->unit_count()) {
      throw Error("checkpoint has optimizer state for no unit: " + key);
    }
    return unit;
  }

  // Collective when sharded: every rank calls it, each gets the full parameters.
  TensorMap full_parameters() const override { return units_->full_parameters(); }

  HeldBytes held_bytes() const override { return units_->held_bytes(optimizer_.get()); }

 private:
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
  std::string layout() const {
    return "ranks=" + std::to_string(units_->shard_ranks()) + units_layout();
  }

  std::string units_layout() const {
    std::ostringstream text;
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      const ShardedUnitLayout& unit = units_->layout(u);
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
  std::shared_ptr<ProcessMesh> mesh_;
  c10::intrusive_ptr<c10d::Backend> group_;  // dp_shard; null when this rank is the only one
  DataParallelPlace place_;
  std::shared_ptr<Model> model_;
  std::vector<Block> blocks_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> buffers_;
  std::vector<std::string> buffer_names_;
  std::unique_ptr<ShardedUnits> units_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torch::ScalarType> autocast_dtype_;
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
