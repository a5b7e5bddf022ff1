// Fully sharded data parallel (ZeRO-3, and ZeRO-2 with sharding = "grad_op") over the mesh's
// dp_shard group: the model is cut into units along its blocks, each rank keeps only its shard of
// each unit's flattened parameters, with that shard's gradient and optimizer state, and a unit's
// parameters exist in full only while it runs. The unit machinery (flattening, gathering before
// forward and backward, freeing, reduce-scattering gradients from hooks, prefetch) is the SDK's
// ShardedUnits; this plugin adds the step, the options and the checkpoint format.
//
// Two more mesh dimensions compose with it. With tp > 1 (2-D, FSDP x TP) the units flatten this
// rank's tensor-parallel pieces, so each dp_shard rank holds a shard of its tp rank's piece; the
// model's own collectives run on the gathered pieces, and the step takes the gradient norm and
// the skip decision over the tp group too. With dp_replicate > 1 (hybrid sharding, HSDP) each
// replicate group shards the model over its dp_shard ranks, and after the reduce-scatter inside
// it the shards' gradients are averaged across the groups, whose ranks hold the same shard.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/optim/optimizer.h>

#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/parallel/block_norms.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/gradient_verdict.hpp"
#include "trainyard/parallel/gradients.hpp"
#include "trainyard/parallel/held_blocks.hpp"
#include "trainyard/parallel/micro_batch.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/support/module_state.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/parallel/replicated_step.hpp"
#include "trainyard/models/deferred_parameters.hpp"
#include "trainyard/parallel/sharded_units.hpp"
#include "trainyard/parallel/tensor_parallel_step.hpp"
#include "trainyard/api/step_phases.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {
namespace {

UnitSharding parse_sharding(const Config& config) {
  const std::string value = config.get_string("sharding");
  if (value == "full") return UnitSharding::kFull;
  if (value == "grad_op") return UnitSharding::kGradOp;
  if (value == "none") return UnitSharding::kNone;
  // The declared choices keep other names out before the factory runs.
  config.fail("sharding", "is not a known sharding: '" + value + "'");
}

const std::vector<std::string>& dtype_names() {
  static const std::vector<std::string> names = {"auto", "float32", "bfloat16", "float16"};
  return names;
}

at::ScalarType dtype_named(const std::string& name, at::ScalarType automatic) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float32") return at::kFloat;
  return automatic;
}

// The dtype's name as a recipe writes it.
std::string recipe_dtype_name(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return "bfloat16";
  if (dtype == at::kHalf) return "float16";
  return "float32";
}

// Whether `module` holds BatchNorm layers. Their running statistics stay float32, and LibTorch's
// batch_norm takes bfloat16 or float16 weights only with running statistics of the same dtype.
bool has_batch_norm(torch::nn::Module& module) {
  for (const auto& layer : module.modules(/*include_self=*/true)) {
    if (std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(layer) ||
        std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(layer) ||
        std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(layer)) {
      return true;
    }
  }
  return false;
}

struct FsdpOptions {
  UnitSharding sharding = UnitSharding::kFull;
  bool prefetch = true;
  std::string param_dtype = "auto";  // gathered parameters; auto: the precision's autocast dtype
  std::string reduce_dtype = "float32";  // gradient reduction; auto: the gathered dtype
  bool full_state_dict = false;          // checkpoints consolidated instead of sharded
};

// Moves what `module` holds to `device`, but for the placeholders `deferred` holds, which have
// no values to move: the units make them there.
void to_device_but_placeholders(torch::nn::Module& module, const DeferredParameters& deferred,
                                c10::Device device) {
  if (deferred.size() == 0) {
    module.to(device);
    return;
  }
  at::NoGradGuard no_grad;
  for (auto& parameter : module.parameters(true)) {
    if (!deferred.holds(parameter)) parameter.set_data(parameter.to(device));
  }
  for (auto& buffer : module.buffers(true)) buffer.set_data(buffer.to(device));
}

const char* const kNothingToTrain =
    "fsdp: the model has no trainable parameters; fsdp shards what trains (unfreeze some, or use "
    "ddp or single)";

class Fsdp final : public Strategy {
 public:
  explicit Fsdp(const Config& config) {
    options_.sharding = parse_sharding(config);
    options_.prefetch = config.get_bool("prefetch");
    options_.param_dtype = config.get_string("param_dtype");
    options_.reduce_dtype = config.get_string("reduce_dtype");
    options_.full_state_dict = config.get_string("state_dict") == "full";
  }

  void setup(StrategyContext& context) override {
    if (context.compression) {
      throw Error("fsdp: [compression] replaces all-reduces of gradients, and fsdp "
                  "reduce-scatters them: use ddp (or pipeline) with compression, or remove "
                  "[compression]");
    }
    context_ = context;
    // Units are sharded over the dp_shard ranks, replicated over dp_replicate (hybrid sharding);
    // a tp rank's units hold its tensor-parallel pieces.
    mesh_ = mesh_of(context.build);
    group_ = mesh_->group(MeshGroup::kDataShard);
    replicate_group_ = mesh_->group(MeshGroup::kDataReplicate);
    tp_group_ = mesh_->group(MeshGroup::kTensor);
    place_ = {mesh_->rank(MeshGroup::kData), mesh_->size(MeshGroup::kData)};
    // A model that can defer its parameters' values hands placeholders, made one at a time as
    // the units are built: no rank holds the whole model while it loads.
    auto deferred = std::make_shared<DeferredParameters>();
    BuildContext build = context.build;
    build.extensions[kDeferredParametersExtension] = deferred;
    model_ = context.make_model(build);
    to_device_but_placeholders(model_->module(), *deferred, context.build.device);
    model_->module().train();
    // Before the units take the parameters over: which block holds each, by its whole name.
    if (context.step.block_grad_norms) parameter_blocks_.emplace(*model_);
    autocast_dtype_ = context.precision->autocast_dtype();
    ShardedUnitsOptions units;
    units.sharding = options_.sharding;
    units.prefetch = options_.prefetch;
    units.gather_dtype = gathered_dtype(*model_, autocast_dtype_, place_.rank == 0);
    // Replicated parameters are the fp32 master copy itself: nothing is gathered in another
    // dtype, and "auto" reduces in float32.
    units.reduce_dtype =
        dtype_named(options_.reduce_dtype,
                    options_.sharding == UnitSharding::kNone ? at::kFloat : units.gather_dtype);
    for (const auto& item : model_->module().named_parameters(true)) {
      HeldLayout layout = model_->parameter_layout(item.key(), item.value());
      if (!holds_whole(layout)) split_names_.insert(item.key());
      // Frozen parameters (a base model under LoRA adapters) get no gradient and no optimizer
      // state: they stay whole (or this tp rank's piece) on every rank, outside the units.
      if (!item.value().requires_grad()) {
        if (deferred->holds(item.value())) deferred->materialize(item.value(), context.build.device);
        frozen_.push_back(item.value());
        frozen_names_.push_back(item.key());
        frozen_layouts_.push_back(std::move(layout));
        continue;
      }
      layouts_.push_back(std::move(layout));
      parameters_.push_back(item.value());
      names_.push_back(item.key());
    }
    if (parameters_.empty()) throw Error(kNothingToTrain);
    for (const auto& item : model_->module().named_buffers(true)) {
      buffers_.push_back(item.value());
      buffer_names_.push_back(item.key());
    }
    if (auto data_group = mesh_->group(MeshGroup::kData)) {
      // Every data-parallel rank (each replicate group's too) starts from the parameters and
      // buffers of the first one in its tp rank. Deferred parameters are made alike on every
      // rank (drawn per name, or read from the same files).
      std::vector<at::Tensor> state;
      for (const auto& parameter : parameters_) {
        if (!deferred->holds(parameter)) state.push_back(parameter);
      }
      for (const auto& parameter : frozen_) {
        if (!deferred->holds(parameter)) state.push_back(parameter);
      }
      state.insert(state.end(), buffers_.begin(), buffers_.end());
      broadcast_coalesced(state, data_group);
    }
    try {
      units_ = std::make_unique<ShardedUnits>(parameters_, names_, held_blocks(*model_), group_,
                                              units, *deferred, context.build.device);
    } catch (const Error& error) {
      throw Error(std::string("fsdp: ") + error.what());
    }
    // Hybrid sharding: each replicate group shards the model; the shards' gradients are then
    // averaged across the groups.
    units_->average_over(replicate_group_);
    optimizer_ = context.optimizer->create(units_->shards());
    shard_layouts_ = shard_layouts();
    blocks_ = with_activation_checkpointing(units_->blocks(), context.step.activation_checkpointing,
                                            context.device_backend);
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
    test_nonfinite_hook(gradients, shard_layouts_);
    // Each rank holds other gradients: the decision to step and the norm are taken over all.
    torch::Tensor found_inf = context_.precision->unscale(gradients);
    units_->combine_found_inf(found_inf);
    agree_on_found_inf(found_inf, tp_group_);
    if (parameter_blocks_) report_block_norms(gradients, result);
    const GradientVerdict verdict = judge_gradients(
        context_, found_inf, gradient_norm(gradients), gradients,
        [&] { return first_nonfinite_parameter(gradients, shard_layouts_); }, result);
    context_.before_optimizer_step();
    if (verdict.step) optimizer_->step();
    context_.precision->update(verdict.found_inf);
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

  // What setup refuses of a model, asked before any process starts.
  void check_model(Model& model, const BuildContext& build) const override {
    bool trainable = false;
    for (const auto& parameter : model.module().parameters(true)) {
      trainable = trainable || parameter.requires_grad();
    }
    if (!trainable) throw Error(kNothingToTrain);
    gathered_dtype(model, compute_dtype(build), false);
  }

  // The dtype the units' parameters are gathered in: param_dtype, where "auto" follows autocast.
  // A model with BatchNorm layers gathers float32 under "auto", as PyTorch's FSDP keeps BatchNorm
  // in full precision; autocast still runs the convolutions and matrix products in its dtype.
  // Throws Error for an explicit param_dtype other than float32 on a model with BatchNorm.
  at::ScalarType gathered_dtype(Model& model, std::optional<at::ScalarType> autocast_dtype,
                                bool report) const {
    const at::ScalarType chosen =
        dtype_named(options_.param_dtype, autocast_dtype.value_or(at::kFloat));
    // Replicated units gather nothing: their parameters are the float32 master itself.
    if (chosen == at::kFloat || options_.sharding == UnitSharding::kNone ||
        !has_batch_norm(model.module())) {
      return chosen;
    }
    // What autocast computes in either way; an explicit param_dtype need not be autocast's.
    const std::string autocast =
        autocast_dtype ? "autocast still computes in " + recipe_dtype_name(*autocast_dtype)
                       : "nothing autocasts";
    if (options_.param_dtype != "auto") {
      throw Error("fsdp: param_dtype = \"" + options_.param_dtype +
                  "\" cannot serve the model's BatchNorm layers, whose running statistics stay "
                  "float32; use \"float32\" or \"auto\" (" +
                  autocast + ")");
    }
    if (report) {
      std::cerr << "fsdp: parameters gathered in float32 (param_dtype auto): the model's "
                   "BatchNorm layers keep float32 running statistics; "
                << autocast << std::endl;
    }
    return at::kFloat;
  }

  // Each rank writes its shards and their optimizer state as placed pieces of the whole
  // parameters; with state_dict = "full" (or replicated units) the shards are gathered and written
  // once, whole. Collective when gathering: every rank calls save_state. Either loads into any
  // strategy on any layout.
  void save_state(CheckpointState& out) const override {
    mark_pieces_format(out.shared);
    // Buffers and gathered state are the same on every data-parallel rank; rank 0 writes them,
    // or, where tp ranks hold other pieces, each rank writes its own into its file.
    const std::string replicas = mesh_group_name(MeshGroup::kData);
    StateDict& gathered = tp_group_ ? out.local : out.shared;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      TensorPlacement placement = TensorPlacement::whole(buffers_[i].sizes().vec());
      placement.replicas = replicas;
      put_piece(out.shared, "model." + buffer_names_[i], buffers_[i].detach(), placement);
    }
    out.shared.metadata["fsdp.state_dict"] = options_.full_state_dict ? "full" : "sharded";
    if (!options_.full_state_dict && units_->shard_ranks() > 1) {
      // Every replicate group holds the same shards; each rank writes its own.
      const std::string shard_replicas =
          replicate_group_ ? mesh_group_name(MeshGroup::kDataReplicate) : "";
      const std::vector<HeldLayout> layouts = shard_layouts();
      for (std::size_t u = 0; u < units_->unit_count(); ++u) {
        put_held_pieces(out.local, "model.", units_->shard(u), layouts[u], shard_replicas);
      }
      save_optimizer_pieces(*context_.optimizer, *optimizer_, layouts, out.local, out.local,
                            shard_replicas);
      return;
    }
    OptimizerFields fields = optimizer_fields(*context_.optimizer, *optimizer_);
    std::vector<HeldLayout> layouts;
    std::vector<std::int64_t> numels;
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      const at::Tensor whole = units_->gather_copy(u);
      layouts.push_back(unit_layout(u, 0, whole.numel()));
      numels.push_back(whole.numel());
      put_held_pieces(gathered, "model.", whole, layouts.back(), replicas);
      for (auto& [field, value] : fields[u]) {
        if (value.dim() > 0 && value.numel() == units_->layout(u).shard_numel) {
          value = units_->gather_copy(u, value);
        }
      }
    }
    put_optimizer_pieces(fields, numels, layouts, gathered, gathered, replicas);
  }

  // Whatever layout wrote the checkpoint: this rank's shards are cut from the whole parameters'
  // pieces (the store hands every saved rank's entries over when they are needed).
  void load_state(const CheckpointState& in) override {
    require_pieces_format(in);
    const PlacedState placed(in);
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      at::Tensor value = placed.whole("model." + buffer_names_[i]);
      if (!value.sizes().equals(buffers_[i].sizes())) {
        throw Error("checkpoint's 'model." + buffer_names_[i] +
                    "' has another shape than this model's");
      }
      buffers_[i].copy_(value);
    }
    const std::vector<HeldLayout> layouts = shard_layouts();
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      read_held_pieces(placed, "model.", layouts[u], units_->shard(u));
    }
    load_optimizer_pieces(*context_.optimizer, *optimizer_, layouts, placed);
    if (options_.sharding != UnitSharding::kNone) units_->release_all();
  }

  // The shards (or, for replicated units, the flat buffers the parameters view) and their state.
  std::vector<torch::Tensor> optimizer_stepped_tensors() const override {
    return stepped_tensors(*optimizer_);
  }

  // Collective when sharded: every rank calls it, each gets the full parameters (assembled from
  // the tp ranks' pieces with tensor parallelism).
  TensorMap full_parameters() const override {
    TensorMap pieces = units_->full_parameters();
    for (std::size_t i = 0; i < frozen_.size(); ++i) pieces[frozen_names_[i]] = frozen_[i].detach();
    if (!tp_group_) return pieces;
    std::vector<at::Tensor> held;
    std::vector<HeldLayout> layouts = layouts_;
    for (const auto& name : names_) held.push_back(pieces.at(name));
    for (std::size_t i = 0; i < frozen_.size(); ++i) {
      held.push_back(frozen_[i].detach());
      layouts.push_back(frozen_layouts_[i]);
    }
    return gather_whole_tensors(held, layouts, tp_group_);
  }

  HeldBytes held_bytes() const override {
    HeldBytes bytes = units_->held_bytes(optimizer_.get(), *context_.optimizer);
    for (const auto& frozen : frozen_) bytes.parameters += frozen.numel() * frozen.element_size();
    return bytes;
  }

 private:
  // Elements [begin, begin + count) of unit `u`'s flat buffer as pieces of its parameters
  // (boxes of them where this rank holds tensor-parallel pieces).
  HeldLayout unit_layout(std::size_t u, std::int64_t begin, std::int64_t count) const {
    const ShardedUnitLayout& unit = units_->layout(u);
    std::vector<HeldLayout> layouts;
    std::vector<std::int64_t> numels;
    for (std::size_t i : unit.parameters) {
      layouts.push_back(layouts_[i]);
      numels.push_back(parameters_[i].numel());
    }
    return flat_shard_layout(layouts, numels, begin, count);
  }

  // The norm of the shards' gradients over the shard group (replicated units each hold all); with
  // tensor parallelism the squares of tensor-parallel pieces are summed over the tp group as
  // well, and whole copies, which every tp rank holds alike, are counted once.
  at::Tensor gradient_norm(const std::vector<at::Tensor>& gradients) const {
    if (!tp_group_) return units_->gradient_norm(gradients);
    const std::vector<HeldLayout>& layouts = shard_layouts_;
    std::vector<at::Tensor> split;
    std::vector<at::Tensor> whole;
    for (std::size_t u = 0; u < gradients.size(); ++u) {
      const at::Tensor flat = gradients[u].detach().reshape({-1});
      for (const ParameterPiece& piece : layouts[u]) {
        (split_names_.count(piece.name) ? split : whole)
            .push_back(flat.narrow(0, piece.offset, piece.length));
      }
    }
    // Each kind's squares summed over the shard group first, then the split ones over tp.
    std::vector<at::Tensor> squares;
    for (const auto* part : {&split, &whole}) {
      at::Tensor sum = at::zeros({}, gradients.front().options().dtype(at::kFloat));
      for (const auto& piece : *part) sum = sum + piece.to(at::kFloat).pow(2).sum();
      squares.push_back(sum);
    }
    std::vector<at::Tensor> message{at::stack(squares)};
    CollectiveWait wait;
    if (units_->shard_ranks() > 1) group_->allreduce(message)->wait();  // replicas hold all
    std::vector<at::Tensor> split_squares{message[0].narrow(0, 0, 1).clone()};
    tp_group_->allreduce(split_squares)->wait();
    return (split_squares[0][0] + message[0][1]).sqrt();
  }

  // Each block's norm as gradient_norm takes the total: the shards' squares summed over the
  // shard group, tensor-parallel pieces' squares over the tp group as well.
  void report_block_norms(const std::vector<at::Tensor>& gradients, StepResult& result) const {
    std::vector<at::Tensor> message{block_squares(
        gradients, shard_layouts_, *parameter_blocks_,
        [&](std::size_t, const ParameterPiece& piece) { return split_names_.count(piece.name) > 0; },
        context_.build.device)};
    CollectiveWait wait;
    if (units_->shard_ranks() > 1) group_->allreduce(message)->wait();  // replicas hold all
    if (tp_group_) {
      std::vector<at::Tensor> split{message[0][0].clone()};
      tp_group_->allreduce(split)->wait();
      message[0][0].copy_(split[0]);
    }
    set_block_norms(message[0].sum(0), *parameter_blocks_, result);
  }

  // This rank's shard of every unit.
  std::vector<HeldLayout> shard_layouts() const {
    std::vector<HeldLayout> layouts;
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      const std::int64_t shard = units_->layout(u).shard_numel;
      layouts.push_back(unit_layout(u, units_->shard_rank() * shard, shard));
    }
    return layouts;
  }

  void broadcast_coalesced(const std::vector<at::Tensor>& tensors,
                           const c10::intrusive_ptr<c10d::Backend>& over) {
    at::NoGradGuard no_grad;
    std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
    for (const auto& tensor : tensors) by_type[tensor.scalar_type()].push_back(tensor);
    for (auto& [type, group] : by_type) {
      std::vector<at::Tensor> flat_views;
      for (const auto& tensor : group) flat_views.push_back(tensor.reshape({-1}));
      std::vector<at::Tensor> message{at::cat(flat_views)};
      {
        CollectiveWait wait;
        over->broadcast(message)->wait();
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
  c10::intrusive_ptr<c10d::Backend> replicate_group_;  // dp_replicate; null without hybrid
  c10::intrusive_ptr<c10d::Backend> tp_group_;         // null without tensor parallelism
  std::vector<HeldLayout> layouts_;    // how this rank holds each trainable parameter (a tp box?)
  std::vector<at::Tensor> frozen_;     // parameters without gradients, held outside the units
  std::vector<std::string> frozen_names_;
  std::vector<HeldLayout> frozen_layouts_;
  std::set<std::string> split_names_;  // parameters held as tensor-parallel pieces
  std::optional<ParameterBlocks> parameter_blocks_;  // with run.grad_norm_blocks
  DataParallelPlace place_;
  std::shared_ptr<Model> model_;
  std::vector<Block> blocks_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> buffers_;
  std::vector<std::string> buffer_names_;
  std::unique_ptr<ShardedUnits> units_;
  std::vector<HeldLayout> shard_layouts_;  // of each unit's shard on this rank, set by setup
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torch::ScalarType> autocast_dtype_;
};

void register_components(Registry& registry) {
  registry.add<Strategy>(
      "fsdp",
      {option("sharding", "full",
              "\"full\" (FULL_SHARD: parameters, gradients and optimizer state sharded), "
              "\"grad_op\" (SHARD_GRAD_OP: parameters kept gathered from forward to backward), "
              "\"none\" (replicated, as ddp)")
           .one_of({"full", "grad_op", "none"}),
       option("prefetch", true,
              "all-gather the next unit's parameters while the current unit computes"),
       option("param_dtype", "auto",
              "dtype of gathered parameters (\"auto\": the precision's autocast dtype, float32 "
              "for a model with BatchNorm layers; \"float32\", \"bfloat16\", \"float16\"); "
              "shards stay fp32")
           .one_of(dtype_names()),
       option("reduce_dtype", "float32",
              "dtype gradients are reduced in (\"auto\": the gathered parameters' dtype)")
           .one_of(dtype_names()),
       option("state_dict", "sharded",
              "checkpoints: \"sharded\" (each rank writes its shards) or \"full\" "
              "(consolidated whole tensors in the shared file, gathered on save)")
           .one_of({"sharded", "full"})},
      "fully sharded data parallel: parameters, gradients and optimizer state sharded per block",
      [](const Config& options, const BuildContext&) { return std::make_unique<Fsdp>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("fsdp", "1.0.0", trainyard::register_components)
