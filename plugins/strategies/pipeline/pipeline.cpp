// Pipeline parallelism: the model's blocks are cut into stages of consecutive blocks, each rank of
// the mesh's pp dimension holds one stage (or v of them, interleaved), and every batch is split
// into micro-batches that flow through the stages in the order a schedule lists (gpipe, 1f1b,
// interleaved_1f1b, zero_bubble; pipeline_schedule.hpp). Activations and their gradients travel
// over the pipeline group's point-to-point operations (stage_channel.hpp). The loss lives on the
// last stage. Gradients are averaged over the mesh's data-parallel group by the SDK's
// GradientReducer, once per step, and the gradients of tied parameters (a shared embedding and
// output head) are summed between the stages that hold them before every optimizer step.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "stage_channel.hpp"
#include "stage_parameters.hpp"
#include "trainyard/activation_checkpoint.hpp"
#include "trainyard/declared_schedule.hpp"
#include "trainyard/distributed.hpp"
#include "trainyard/error.hpp"
#include "trainyard/gradient_reducer.hpp"
#include "trainyard/gradients.hpp"
#include "trainyard/held_blocks.hpp"
#include "trainyard/model.hpp"
#include "trainyard/optimizer.hpp"
#include "trainyard/parameter_pieces.hpp"
#include "trainyard/pipeline_schedule.hpp"
#include "trainyard/pipeline_stages.hpp"
#include "trainyard/pipeline_timeline.hpp"
#include "trainyard/plugin.hpp"
#include "trainyard/precision.hpp"
#include "trainyard/process_mesh.hpp"
#include "trainyard/step_phases.hpp"
#include "trainyard/strategy.hpp"
#include "trainyard/tensor_parallel_step.hpp"

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;

struct PipelineOptions {
  std::string schedule;
  std::int64_t micro_batches = 0;  // 0: as many as the pipeline has ranks
  std::int64_t virtual_stages = 1;
  std::vector<std::string> stages;  // empty: balanced by cost
  std::int64_t record_step = 3;     // the step whose measured timeline is written; 0: none
  GradientReducerOptions reducer;
  std::optional<UnitSharding> sharding;  // parameters sharded over dp_shard; unset: replicated
};

// A tensor as it enters a stage: detached from the sender's graph, and a leaf that collects its
// gradient when it is floating point.
Activations as_stage_input(const Activations& received) {
  Activations input;
  for (const auto& [name, tensor] : received.tensors) {
    at::Tensor leaf = tensor.detach();
    if (at::isFloatingType(leaf.scalar_type())) leaf.requires_grad_(true);
    input.tensors.emplace(name, leaf);
  }
  return input;
}

// Splits a batch along its first dimension into `count` micro-batches whose sizes differ by at
// most one, as torch.tensor_split does.
std::vector<Batch> split_batch(const Batch& batch, std::int64_t count) {
  if (batch.size < count) {
    throw Error("pipeline: a batch of " + std::to_string(batch.size) +
                " samples cannot be split into " + std::to_string(count) +
                " micro-batches; use batches of at least micro_batches samples");
  }
  std::vector<Batch> parts(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t begin = batch.size * i / count;
    const std::int64_t end = batch.size * (i + 1) / count;
    Batch& part = parts[static_cast<std::size_t>(i)];
    part.size = end - begin;
    for (const auto& [name, tensor] : batch.tensors) {
      part.tensors.emplace(name, tensor.narrow(0, begin, end - begin));
    }
  }
  return parts;
}

// One stage this rank holds: a build of the model with only the stage's blocks.
struct LocalStage {
  int index = 0;  // in the whole pipeline, 0 .. stages - 1
  BlockRange blocks;
  std::shared_ptr<Model> model;
  std::vector<Block> run;  // the blocks as they run (activation checkpointing applied)
  bool first = false;
  bool last = false;
  std::vector<at::Tensor> parameters;    // whole, as the model built them
  std::vector<std::string> names;        // in this build's module
  std::vector<std::string> whole_names;  // in the whole model (a tied copy: the tied name)
  // True for a stage's copy of a tied parameter (the gpt head's copy of the embedding): saved
  // as a piece of the tied parameter like the owner's, counted once in norms and gathers.
  std::vector<bool> tied_copy;
  // How the stage holds each parameter: whole, or the model's tensor-parallel shards; pieces of
  // tied copies are named by the tied parameter.
  std::vector<HeldLayout> layouts;
  std::vector<at::Tensor> buffers;
  std::vector<std::string> buffer_names;
  // How the stage's data-parallel ranks hold the parameters: replicated or sharded.
  std::unique_ptr<StageParameters> held;
  // Index in the rank's action list of the last action that computes this stage's weight
  // gradients: the backward that synchronises them across data-parallel ranks.
  std::size_t last_weight_action = 0;
};

// A micro-batch between its forward and its backward on one stage.
struct InFlight {
  Activations input;                   // the stage's input leaves
  Activations output;                  // what the stage produced (not on the last stage)
  at::Tensor loss;                     // the last stage's weighted loss
  std::vector<at::Tensor> roots;       // what backward starts from ...
  std::vector<at::Tensor> root_grads;  // ... with these gradients (empty: the loss)
  Activations input_grads;             // computed by the backward, for the previous stage
  bool weights_pending = false;        // BackwardInput ran, BackwardWeight has not
  bool grads_delivered = false;        // the input gradient is sent, handed over or not needed
};

// A parameter several stages hold (a tied embedding and head): their gradients are summed.
struct TiedGroup {
  std::string name;
  std::vector<int> stages;           // holding stages, ascending
  std::map<int, std::size_t> local;  // stage -> index of the parameter this rank holds for it
};

class Pipeline final : public Strategy {
 public:
  explicit Pipeline(const Config& config) {
    options_.schedule = config.get_string("schedule");
    options_.micro_batches = config.get_int("micro_batches");
    options_.virtual_stages = config.get_int("virtual_stages");
    options_.stages = config.get_string_list("stages");
    options_.record_step = config.get_int("record_step");
    options_.reducer.bucket_cap_mb = config.get_float("bucket_cap_mb");
    options_.reducer.first_bucket_mb = options_.reducer.bucket_cap_mb;
    const std::string sharding = config.get_string("dp_sharding");
    if (sharding == "full") options_.sharding = UnitSharding::kFull;
    if (sharding == "grad_op") options_.sharding = UnitSharding::kGradOp;
  }

  void setup(StrategyContext& context) override {
    context_ = context;
    mesh_ = mesh_of(context.build);
    pp_group_ = mesh_->group(MeshGroup::kPipeline);
    dp_group_ = mesh_->group(MeshGroup::kData);
    tp_group_ = mesh_->group(MeshGroup::kTensor);
    pp_rank_ = mesh_->rank(MeshGroup::kPipeline);
    place_ = {mesh_->rank(MeshGroup::kData), mesh_->size(MeshGroup::kData)};
    const int ranks = mesh_->size(MeshGroup::kPipeline);
    shape_ = PipelineShape{
        ranks, static_cast<int>(options_.micro_batches == 0 ? ranks : options_.micro_batches),
        static_cast<int>(options_.virtual_stages)};
    schedule_ = build_pipeline_schedule(options_.schedule, shape_);
    check_sharding();
    validate_schedule(schedule_);
    const PipelineSimulation simulation = simulate_schedule(schedule_);
    if (pp_group_) channel_ = std::make_unique<StageChannel>(pp_group_, context.build.device);

    autocast_dtype_ = context.precision->autocast_dtype();
    cut_model();
    build_local_stages();
    std::vector<at::Tensor> all;
    for (const auto& stage : stages_) {
      for (const auto& tensor : stage.held->optimized()) all.push_back(tensor);
    }
    optimizer_ = context.optimizer->create(all);
    find_last_weight_actions();
    if (context.build.rank == 0) {
      announce(simulation);
      // Reports draw the schedule this run used from this file, not from the recipe.
      if (!context.build.output_dir.empty()) {
        write_declared_schedule(context.build.output_dir, {schedule_.name, shape_});
      }
    }
  }

  StepResult train_step(std::span<const Batch> micro_batches) override {
    const auto rounds = static_cast<std::int64_t>(micro_batches.size());
    const bool recording = options_.record_step > 0 && steps_ + 1 == options_.record_step;
    if (recording) start_recording();
    for (auto& stage : stages_) stage.held->zero_gradients();
    StepResult result;
    at::Tensor loss_sum;
    for (std::int64_t round = 0; round < rounds; ++round) {
      const Batch& batch = micro_batches[static_cast<std::size_t>(round)];
      result.samples += batch.size;
      run_schedule(split_batch(batch, shape_.micro_batches), round == rounds - 1,
                   static_cast<double>(rounds), loss_sum);
    }
    if (channel_) channel_->wait_sends();
    for (auto& stage : stages_) stage.held->finish();
    sum_tied_gradients();
    if (context_.phases) context_.phases->mark(StepPhase::CommWait);
    if (recording) finish_recording();
    finish_step(result);
    if (has_last_stage()) result.loss = loss_sum;
    ++steps_;
    return result;
  }

  EvalResult eval_step(const Batch& batch) override {
    at::NoGradGuard no_grad;
    EvalResult result;
    Activations carried;
    for (int s = 0; s < shape_.stages(); ++s) {
      LocalStage* stage = local_stage(s);
      if (!stage) continue;
      if (!stage->first && !local_stage(s - 1)) {
        StageChannel::Pending pending =
            channel_->receive(rank_of(s - 1), StageMessage::kEvalActivation, s, 0, batch.size);
        carried = channel_->wait(pending);
      }
      stage->model->module().eval();
      {
        AutocastGuard autocast(context_.build.device.type(), autocast_dtype_);
        Activations x = stage->first ? Activations(stage->model->input(batch)) : carried;
        for (const auto& block : stage->run) x = block.forward(x);
        carried = x;
        if (stage->last) {
          result.loss_sum = stage->model->loss(x.hidden(), batch).to(at::kDouble) *
                            static_cast<double>(batch.size);
          result.sums = stage->model->eval_sums(x.hidden(), batch);
          result.samples = batch.size;
        }
      }
      stage->model->module().train();
      if (!stage->last && !local_stage(s + 1)) {
        channel_->send(carried, rank_of(s + 1), StageMessage::kEvalActivation, s + 1, 0,
                       batch.size);
      }
    }
    if (channel_) channel_->wait_sends();
    for (auto& stage : stages_) stage.held->release();
    return result;
  }

  void set_learning_rate(double lr) override { trainyard::set_learning_rate(*optimizer_, lr); }

  DataParallelPlace data_parallel_place() const override { return place_; }

  // Each rank saves its stages' parameters, buffers and optimizer state as whole pieces of the
  // whole model's (a stage's copy of a tied parameter as another piece of it, equal to the
  // owner's); data-parallel peers hold the same and each writes its own file, so that a resume
  // on the same layout reads one file per rank. A resume on another cut reads every rank's
  // files and takes what it holds.
  void save_state(CheckpointState& out) const override {
    mark_pieces_format(out.shared);
    // Replicated stages hold the same pieces on every data-parallel rank; sharded ones their own.
    const std::string replicas = options_.sharding ? "" : mesh_group_name(MeshGroup::kData);
    std::vector<HeldLayout> layouts;
    for (const auto& stage : stages_) {
      const std::vector<at::Tensor> held = stage.held->optimized();
      const std::vector<HeldLayout> stage_layouts = stage.held->layouts(stage.whole_names);
      for (std::size_t i = 0; i < held.size(); ++i) {
        put_held_pieces(out.local, "model.", held[i].detach(), stage_layouts[i], replicas);
        layouts.push_back(stage_layouts[i]);
      }
      for (std::size_t i = 0; i < stage.buffers.size(); ++i) {
        TensorPlacement placement = TensorPlacement::whole(stage.buffers[i].sizes().vec());
        placement.replicas = replicas;
        put_piece(out.local, "model." + stage.buffer_names[i], stage.buffers[i].detach(), placement);
      }
    }
    save_optimizer_pieces(*context_.optimizer, *optimizer_, layouts, out.local, out.local,
                          replicas);
  }

  std::vector<torch::Tensor> optimizer_stepped_tensors() const override {
    return stepped_tensors(*optimizer_);
  }

  void load_state(const CheckpointState& in) override {
    require_pieces_format(in);
    const PlacedState placed(in);
    std::vector<HeldLayout> layouts;
    at::NoGradGuard no_grad;
    for (auto& stage : stages_) {
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
    load_optimizer_pieces(*context_.optimizer, *optimizer_, layouts, placed);
    for (auto& stage : stages_) stage.held->release();
  }

  TensorMap full_parameters() const override { return gather_whole(/*buffers=*/false); }
  TensorMap full_model_state() const override { return gather_whole(/*buffers=*/true); }

  // The cut, and whether the data-parallel ranks shard (then each holds other pieces).
  std::string describe_layout() const override {
    return stage_cut_key(cut_, block_names_) + (options_.sharding ? ", sharded over dp" : "");
  }

  // The optimizer's state is counted once, with the first stage.
  HeldBytes held_bytes() const override {
    HeldBytes total;
    for (std::size_t i = 0; i < stages_.size(); ++i) {
      const HeldBytes held =
          stages_[i].held->held_bytes(i == 0 ? optimizer_.get() : nullptr, *context_.optimizer);
      total.parameters += held.parameters;
      total.gradients += held.gradients;
      total.optimizer_state += held.optimizer_state;
    }
    return total;
  }

 private:
  int rank_of(int stage) const { return shape_.rank_of_stage(stage); }

  LocalStage* local_stage(int stage) {
    for (auto& local : stages_) {
      if (local.index == stage) return &local;
    }
    return nullptr;
  }

  bool has_last_stage() const {
    for (const auto& stage : stages_) {
      if (stage.last) return true;
    }
    return false;
  }

  BuildContext stage_build(BlockRange range) const {
    BuildContext build = context_.build;
    build.blocks = range;
    return build;
  }

  // Decides which blocks each stage holds: as the recipe names them, or balanced by the FLOPs
  // each block reports (its parameter count when the model reports none), measured by building
  // one block at a time, so no rank ever holds more than its stages and one other block.
  void cut_model() {
    std::shared_ptr<Model> empty = context_.make_model(stage_build({0, 0}));
    if (!empty->builds_stages()) {
      throw Error("pipeline: model '" + empty->module().name() +
                  "' does not build stages (Model::builds_stages), so it cannot be cut");
    }
    block_names_ = empty->block_names();
    const int stage_count = shape_.stages();
    if (!options_.stages.empty()) {
      cut_ = named_stages(options_.stages, block_names_, stage_count);
      return;
    }
    if (static_cast<int>(block_names_.size()) < stage_count) {
      throw Error("pipeline: model '" + empty->module().name() + "' has " +
                  std::to_string(block_names_.size()) + " blocks, fewer than the " +
                  std::to_string(stage_count) + " stages (pp " + std::to_string(shape_.ranks) +
                  " x virtual_stages " + std::to_string(shape_.virtual_stages) + ")");
    }
    std::vector<double> flops;
    std::vector<double> sizes;
    for (std::int64_t b = 0; b < static_cast<std::int64_t>(block_names_.size()); ++b) {
      std::shared_ptr<Model> one = context_.make_model(stage_build({b, b + 1}));
      flops.push_back(one->flops_per_sample());
      double numel = 0;
      for (const auto& parameter : one->module().parameters(true)) {
        numel += static_cast<double>(parameter.numel());
      }
      sizes.push_back(numel);
    }
    double total = 0;
    for (double f : flops) total += f;
    block_costs_ = total > 0 ? flops : sizes;
    cut_ = balanced_stages(block_costs_, stage_count);
  }

  void build_local_stages() {
    const int stage_count = shape_.stages();
    std::set<std::string> tied_names;
    for (int s = 0; s < stage_count; ++s) {
      if (rank_of(s) != pp_rank_) continue;
      LocalStage stage;
      stage.index = s;
      stage.blocks = cut_[static_cast<std::size_t>(s)];
      stage.first = s == 0;
      stage.last = s == stage_count - 1;
      stage.model = context_.make_model(stage_build(stage.blocks));
      stage.model->module().to(context_.build.device);
      stage.model->module().train();
      std::map<std::string, std::string> copies;  // held name -> tied name
      std::map<std::string, TiedGroup*> ties;     // held name -> its tie
      for (const TiedParameter& tie : stage.model->tied_parameters()) {
        if (tie.held_as.empty()) continue;
        TiedGroup& group = tied_group(tie);
        if (tie.held_as != tie.name) copies[tie.held_as] = tie.name;
        ties[tie.held_as] = &group;
      }
      for (const auto& item : stage.model->module().named_parameters(true)) {
        stage.parameters.push_back(item.value());
        stage.names.push_back(item.key());
        auto copy = copies.find(item.key());
        stage.whole_names.push_back(copy == copies.end() ? item.key() : copy->second);
        stage.tied_copy.push_back(copy != copies.end());
        if (auto tie = ties.find(item.key()); tie != ties.end()) {
          tie->second->local[s] = stage.parameters.size() - 1;
        }
      }
      for (const auto& item : stage.model->module().named_buffers(true)) {
        stage.buffers.push_back(item.value());
        stage.buffer_names.push_back(item.key());
      }
      for (std::size_t i = 0; i < stage.parameters.size(); ++i) {
        HeldLayout layout = stage.model->parameter_layout(stage.names[i], stage.parameters[i]);
        for (auto& piece : layout) piece.name = stage.whole_names[i];
        stage.layouts.push_back(std::move(layout));
      }
      stage.held = hold_parameters(stage);
      stage.run = with_activation_checkpointing(
          stage.held->blocks(), context_.step.activation_checkpointing, context_.device_backend);
      stages_.push_back(std::move(stage));
    }
  }

  // The tie's group, created the first time with every stage that holds one of its blocks.
  TiedGroup& tied_group(const TiedParameter& tie) {
    for (auto& group : tied_) {
      if (group.name == tie.name) return group;
    }
    TiedGroup group;
    group.name = tie.name;
    for (std::size_t s = 0; s < cut_.size(); ++s) {
      for (std::int64_t b = cut_[s].begin; b < cut_[s].end; ++b) {
        const std::string& block = block_names_[static_cast<std::size_t>(b)];
        bool uses = false;
        for (const auto& user : tie.blocks) uses = uses || user == block;
        if (uses) {
          group.stages.push_back(static_cast<int>(s));
          break;
        }
      }
    }
    tied_.push_back(std::move(group));
    return tied_.back();
  }

  // Sharding over the data-parallel ranks shards over dp_shard (a replicate dimension would need
  // hybrid sharding) and gathers a unit around each call, which a backward split in two halves
  // (zero bubble) would run twice with nothing in between to free it.
  void check_sharding() const {
    if (!options_.sharding) return;
    if (mesh_->size(MeshGroup::kDataReplicate) > 1) {
      throw Error("pipeline: dp_sharding needs dp_replicate = 1 (it shards over dp_shard), got " +
                  std::to_string(mesh_->size(MeshGroup::kDataReplicate)));
    }
    if (mesh_->size(MeshGroup::kTensor) > 1) {
      throw Error("pipeline: dp_sharding with tensor parallelism (tp " +
                  std::to_string(mesh_->size(MeshGroup::kTensor)) +
                  ") would flatten tensor-parallel shards, which is not built; use dp_sharding "
                  "= \"none\"");
    }
    if (options_.schedule == "zero_bubble") {
      throw Error(
          "pipeline: zero_bubble splits each backward in two, which dp_sharding's "
          "gathered units do not follow; use dp_sharding = \"none\" or another schedule");
    }
  }

  std::unique_ptr<StageParameters> hold_parameters(const LocalStage& stage) const {
    if (!options_.sharding) {
      return replicated_stage_parameters(stage.parameters, stage.names, held_blocks(*stage.model),
                                         stage.layouts, dp_group_, options_.reducer);
    }
    ShardedUnitsOptions units;
    units.sharding = *options_.sharding;
    units.gather_dtype = autocast_dtype_.value_or(at::kFloat);
    units.reduce_dtype = at::kFloat;
    return sharded_stage_parameters(stage.parameters, stage.names, held_blocks(*stage.model),
                                    mesh_->group(MeshGroup::kDataShard), units);
  }

  void find_last_weight_actions() {
    const auto& actions = schedule_.rank_actions[static_cast<std::size_t>(pp_rank_)];
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const PipelineActionKind kind = actions[i].kind;
      if (kind != PipelineActionKind::kBackward && kind != PipelineActionKind::kBackwardWeight) {
        continue;
      }
      local_stage(actions[i].stage)->last_weight_action = i;
    }
  }

  void announce(const PipelineSimulation& simulation) const {
    std::cerr << "pipeline: " << schedule_.name << " on " << shape_.ranks << " ranks x "
              << shape_.virtual_stages << " stage" << (shape_.virtual_stages > 1 ? "s" : "")
              << " each, " << shape_.micro_batches << " micro-batches per batch" << std::endl;
    const std::vector<std::string> lines = describe_stages(cut_, block_names_, block_costs_);
    for (std::size_t s = 0; s < lines.size(); ++s) {
      std::cerr << "pipeline: " << lines[s] << " on pp rank " << rank_of(static_cast<int>(s))
                << std::endl;
    }
    const IdleShareFormula formula = idle_share_formula(schedule_, simulation.costs);
    std::cerr << "pipeline: simulated idle share " << simulation.mean_idle_share() << " ("
              << (formula.upper_bound ? "at most " : "") << formula.formula << " = "
              << formula.value << ")" << std::endl;
  }

  // One schedule over one batch's micro-batches. `synchronising`: the step's last batch, whose
  // last backward of each stage starts the data-parallel all-reduce. Adds the last stage's
  // weighted losses to `loss_sum`.
  void run_schedule(const std::vector<Batch>& parts, bool synchronising, double rounds,
                    at::Tensor& loss_sum) {
    weights_ = loss_weights(parts, rounds);
    const auto& actions = schedule_.rank_actions[static_cast<std::size_t>(pp_rank_)];
    std::map<std::pair<int, int>, StageChannel::Pending> receives;  // (stage, micro-batch)
    std::map<std::pair<int, int>, StageChannel::Pending> gradient_receives;
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const PipelineAction& action = actions[i];
      const Batch& part = parts[static_cast<std::size_t>(action.micro_batch)];
      const auto key = std::make_pair(action.stage, action.micro_batch);
      // A forward or backward is timed from when its input is here: waiting for a neighbour
      // is idle time in the measured timeline, not compute.
      double started = recording_ ? now_us() : 0;
      switch (action.kind) {
        case PipelineActionKind::kReceiveActivation:
          receives[key] = channel_->receive(rank_of(action.stage - 1), StageMessage::kActivation,
                                            action.stage, action.micro_batch, part.size);
          break;
        case PipelineActionKind::kReceiveGradient:
          gradient_receives[key] =
              channel_->receive(rank_of(action.stage + 1), StageMessage::kGradient, action.stage,
                                action.micro_batch, part.size);
          break;
        case PipelineActionKind::kForward: {
          Activations input;
          if (action.stage > 0) {
            auto pending = receives.find(key);
            if (pending != receives.end()) {
              input = channel_->wait(pending->second);
              receives.erase(pending);
              if (context_.phases) context_.phases->mark(StepPhase::CommWait);
              if (recording_) started = now_us();
            } else {
              input = take_handover(handover_activations_, key, "activations");
            }
          }
          forward(action, part, input, loss_sum);
          break;
        }
        case PipelineActionKind::kSendActivation:
          channel_->send(in_flight_.at(key).output, rank_of(action.stage + 1),
                         StageMessage::kActivation, action.stage + 1, action.micro_batch,
                         part.size);
          break;
        case PipelineActionKind::kBackward:
        case PipelineActionKind::kBackwardInput: {
          InFlight& flight = in_flight_.at(key);
          if (!local_stage(action.stage)->last) {
            Activations grads;
            auto pending = gradient_receives.find(key);
            if (pending != gradient_receives.end()) {
              grads = channel_->wait(pending->second);
              gradient_receives.erase(pending);
              // The gradient answers this micro-batch's activations: their send is done.
              channel_->release_sent(rank_of(action.stage + 1), StageMessage::kActivation,
                                     action.stage + 1, action.micro_batch);
              if (context_.phases) context_.phases->mark(StepPhase::CommWait);
              if (recording_) started = now_us();
            } else {
              grads = take_handover(handover_gradients_, key, "gradients");
            }
            set_roots(flight, grads);
          }
          if (action.kind == PipelineActionKind::kBackward) {
            backward(action, flight,
                     synchronising && i == local_stage(action.stage)->last_weight_action);
          } else {
            backward_input(action, flight);
          }
          break;
        }
        case PipelineActionKind::kBackwardWeight:
          backward_weight(action, in_flight_.at(key),
                          synchronising && i == local_stage(action.stage)->last_weight_action);
          break;
        case PipelineActionKind::kSendGradient: {
          InFlight& flight = in_flight_.at(key);
          channel_->send(flight.input_grads, rank_of(action.stage - 1), StageMessage::kGradient,
                         action.stage - 1, action.micro_batch, part.size);
          flight.grads_delivered = true;
          release_if_done(key);
          break;
        }
      }
      if (recording_) timeline_.push_back({action, started, now_us()});
    }
  }

  // For the last stage: the factor each micro-batch's loss carries so that their sum is the
  // batch's loss as the model reduces it, divided by the step's batches (accumulation).
  std::vector<double> loss_weights(const std::vector<Batch>& parts, double rounds) const {
    std::vector<double> weights(parts.size(), 1.0 / rounds);
    const LocalStage* last = nullptr;
    for (const auto& stage : stages_) {
      if (stage.last) last = &stage;
    }
    if (!last || last->model->loss_reduction() == LossReduction::kSum) return weights;
    std::vector<double> terms;
    double total = 0;
    for (const Batch& part : parts) {
      terms.push_back(last->model->loss_terms(part));
      total += terms.back();
    }
    for (std::size_t i = 0; i < parts.size(); ++i) {
      weights[i] = total > 0 ? terms[i] / total / rounds : 0.0;
    }
    return weights;
  }

  Activations take_handover(std::map<std::pair<int, int>, Activations>& handovers,
                            const std::pair<int, int>& key, const char* what) {
    auto it = handovers.find(key);
    if (it == handovers.end()) {
      throw Error(std::string("pipeline: stage ") + std::to_string(key.first) + " has no " + what +
                  " for micro-batch " + std::to_string(key.second));
    }
    Activations out = std::move(it->second);
    handovers.erase(it);
    return out;
  }

  void forward(const PipelineAction& action, const Batch& part, const Activations& received,
               at::Tensor& loss_sum) {
    LocalStage& stage = *local_stage(action.stage);
    InFlight& flight = in_flight_[{action.stage, action.micro_batch}];
    {
      AutocastGuard autocast(context_.build.device.type(), autocast_dtype_);
      flight.input = stage.first ? Activations(stage.model->input(part)) : as_stage_input(received);
      Activations x = flight.input;
      for (const auto& block : stage.run) x = block.forward(x);
      if (stage.last) {
        at::Tensor loss = stage.model->loss(x.hidden(), part);
        const double weight = weights_[static_cast<std::size_t>(action.micro_batch)];
        flight.loss = loss * weight;
        at::Tensor weighted = flight.loss.detach();
        loss_sum = loss_sum.defined() ? loss_sum + weighted : weighted;
      } else {
        flight.output = x;
      }
    }
    if (!stage.last && local_stage(action.stage + 1)) {
      handover_activations_[{action.stage + 1, action.micro_batch}] = flight.output;
    }
    if (context_.phases) context_.phases->mark(StepPhase::Forward);
  }

  // The tensors backward starts from: the stage's floating outputs that carry a graph, with the
  // gradients the next stage sent for them.
  static void set_roots(InFlight& flight, const Activations& grads) {
    flight.roots.clear();
    flight.root_grads.clear();
    for (const auto& [name, output] : flight.output.tensors) {
      if (!output.requires_grad()) continue;
      auto grad = grads.tensors.find(name);
      if (grad == grads.tensors.end()) continue;
      flight.roots.push_back(output);
      flight.root_grads.push_back(grad->second);
    }
  }

  std::vector<at::Tensor> loss_roots(InFlight& flight) {
    if (flight.loss.defined()) return {context_.precision->scale_loss(flight.loss)};
    return flight.roots;
  }

  std::vector<at::Tensor> input_leaves(const InFlight& flight) const {
    std::vector<at::Tensor> leaves;
    for (const auto& [name, tensor] : flight.input.tensors) {
      if (tensor.requires_grad()) leaves.push_back(tensor);
    }
    return leaves;
  }

  // The gradient of each floating input (zeros where none flowed), for the previous stage.
  void collect_input_grads(const LocalStage& stage, const PipelineAction& action, InFlight& flight,
                           const std::vector<at::Tensor>& grads) {
    if (stage.first) {
      flight.grads_delivered = true;
      return;
    }
    flight.input_grads = Activations();
    std::size_t next = 0;
    for (const auto& [name, tensor] : flight.input.tensors) {
      if (!tensor.requires_grad()) continue;
      at::Tensor grad = next < grads.size() ? grads[next] : at::Tensor();
      ++next;
      flight.input_grads.tensors.emplace(name, grad.defined() ? grad : at::zeros_like(tensor));
    }
    if (local_stage(action.stage - 1)) {
      handover_gradients_[{action.stage - 1, action.micro_batch}] = flight.input_grads;
      flight.grads_delivered = true;
    }
  }

  void backward(const PipelineAction& action, InFlight& flight, bool synchronise) {
    LocalStage& stage = *local_stage(action.stage);
    stage.held->before_backward(synchronise);
    const std::vector<at::Tensor> roots = loss_roots(flight);
    if (!roots.empty()) torch::autograd::backward(roots, flight.root_grads);
    stage.held->after_backward();
    std::vector<at::Tensor> grads;
    for (const auto& leaf : input_leaves(flight)) grads.push_back(leaf.grad());
    collect_input_grads(stage, action, flight, grads);
    if (context_.phases) context_.phases->mark(StepPhase::Backward);
    release_if_done({action.stage, action.micro_batch});
  }

  // Zero bubble's first half: only the gradient of the stage's input, keeping the graph for the
  // weight gradients.
  void backward_input(const PipelineAction& action, InFlight& flight) {
    LocalStage& stage = *local_stage(action.stage);
    flight.weights_pending = true;
    const std::vector<at::Tensor> leaves = input_leaves(flight);
    if (stage.first) {
      collect_input_grads(stage, action, flight, {});
    } else if (leaves.empty()) {
      collect_input_grads(stage, action, flight, {});
    } else {
      const std::vector<at::Tensor> roots = loss_roots(flight);
      if (flight.loss.defined()) flight.roots = roots;  // the scaled loss, once
      std::vector<at::Tensor> grads =
          roots.empty() ? std::vector<at::Tensor>{}
                        : torch::autograd::grad(roots, leaves, flight.root_grads,
                                                /*retain_graph=*/true, /*create_graph=*/false,
                                                /*allow_unused=*/true);
      collect_input_grads(stage, action, flight, grads);
    }
    if (context_.phases) context_.phases->mark(StepPhase::Backward);
  }

  // Zero bubble's second half: the weight gradients, from the graph the first half kept.
  void backward_weight(const PipelineAction& action, InFlight& flight, bool synchronise) {
    LocalStage& stage = *local_stage(action.stage);
    stage.held->before_backward(synchronise);
    std::vector<at::Tensor> roots = flight.roots;
    if (roots.empty() && flight.loss.defined()) roots = loss_roots(flight);
    std::vector<at::Tensor> trainable;
    for (const auto& parameter : stage.parameters) {
      if (parameter.requires_grad()) trainable.push_back(parameter);
    }
    if (!roots.empty() && !trainable.empty()) {
      torch::autograd::backward(roots, flight.root_grads, /*retain_graph=*/false,
                                /*create_graph=*/false, trainable);
    }
    stage.held->after_backward();
    flight.weights_pending = false;
    if (context_.phases) context_.phases->mark(StepPhase::Backward);
    release_if_done({action.stage, action.micro_batch});
  }

  // Drops a micro-batch's activations and graph once nothing needs them: both halves of a split
  // backward have run and the input gradient has left (sent, handed over, or not needed).
  void release_if_done(const std::pair<int, int>& key) {
    auto it = in_flight_.find(key);
    if (it != in_flight_.end() && !it->second.weights_pending && it->second.grads_delivered) {
      in_flight_.erase(it);
    }
  }

  // Tied parameters: every stage holding one gets the sum of all their gradients, added in
  // stage order so that each holder computes exactly the same value.
  void sum_tied_gradients() {
    for (TiedGroup& group : tied_) {
      if (group.stages.size() < 2) continue;
      std::map<int, at::Tensor> grads;
      for (auto& [stage, parameter] : group.local) {
        grads[stage] = local_stage(stage)->held->whole_gradient(parameter);
      }
      std::set<int> other_ranks;
      for (int stage : group.stages) {
        if (rank_of(stage) != pp_rank_) other_ranks.insert(rank_of(stage));
      }
      std::vector<StageChannel::Pending> pending;
      std::vector<int> pending_stage;
      for (int peer : other_ranks) {
        for (auto& [stage, grad] : grads) {
          Activations one;
          one.tensors.emplace(group.name, grad);
          channel_->send(one, peer, StageMessage::kTiedGradient, stage, 0, 0);
        }
        for (int stage : group.stages) {
          if (rank_of(stage) != peer) continue;
          pending.push_back(channel_->receive(peer, StageMessage::kTiedGradient, stage, 0, 0));
          pending_stage.push_back(stage);
        }
      }
      for (std::size_t i = 0; i < pending.size(); ++i) {
        grads[pending_stage[i]] = channel_->wait(pending[i]).tensors.at(group.name);
      }
      if (channel_) channel_->wait_sends();
      at::Tensor total;
      for (int stage : group.stages) {
        total = total.defined() ? total + grads.at(stage) : grads.at(stage).clone();
      }
      for (auto& [stage, parameter] : group.local) {
        local_stage(stage)->held->set_whole_gradient(parameter, total);
      }
    }
  }

  // The sum of squares of this rank's stages' gradients over the data- and tensor-parallel
  // ranks, each parameter of the whole model counted once (tied copies left out).
  at::Tensor stage_gradient_squares(const std::vector<std::vector<at::Tensor>>& stage_gradients) {
    if (options_.sharding) {
      // Flat shards mix parameters: the copies' squares are taken out again.
      at::Tensor squares = at::zeros({}, at::kFloat).to(context_.build.device);
      for (std::size_t i = 0; i < stages_.size(); ++i) {
        squares = squares + stages_[i].held->gradient_squares(stage_gradients[i]);
      }
      return (squares - tied_copy_squares().to(squares.device())).clamp_min(0);
    }
    std::vector<at::Tensor> split;
    std::vector<at::Tensor> whole;
    for (const auto& stage : stages_) {
      for (std::size_t i = 0; i < stage.parameters.size(); ++i) {
        const at::Tensor& grad = stage.parameters[i].grad();
        if (!grad.defined() || stage.tied_copy[i]) continue;
        (holds_whole(stage.layouts[i]) ? whole : split).push_back(grad);
      }
    }
    return squares_over_group(split, whole, tp_group_);
  }

  // The squares of the gradients of tied copies, which the norm counts once (with the owner).
  at::Tensor tied_copy_squares() {
    at::Tensor total = at::zeros({}, at::kFloat);
    for (auto& stage : stages_) {
      for (std::size_t i = 0; i < stage.parameters.size(); ++i) {
        if (!stage.tied_copy[i]) continue;
        const at::Tensor grad = stage.held->whole_gradient(i);
        total = total.to(grad.device()) + grad.to(at::kFloat).square().sum();
      }
    }
    return total;
  }

  // Unscale and check, clip by the norm over every stage, step: the decisions (skip, clip
  // factor) are the pipeline's, agreed over the pipeline group.
  void finish_step(StepResult& result) {
    std::vector<std::vector<at::Tensor>> stage_gradients;
    std::vector<at::Tensor> gradients;
    for (const auto& stage : stages_) {
      stage_gradients.push_back(stage.held->gradients());
      gradients.insert(gradients.end(), stage_gradients.back().begin(),
                       stage_gradients.back().end());
    }
    at::Tensor found_inf = context_.precision->unscale(gradients);
    if (found_inf.defined()) {
      stages_.front().held->combine_found_inf(found_inf);  // over the data-parallel shards
      agree_on_found_inf(found_inf, tp_group_);
      if (pp_group_) {
        std::vector<at::Tensor> flag{found_inf};
        all_reduce(flag, c10d::ReduceOp::MAX);
      }
    }
    if (context_.step.max_grad_norm > 0) {
      at::Tensor squares = stage_gradient_squares(stage_gradients).reshape({1});
      if (pp_group_) {
        std::vector<at::Tensor> sum{squares};
        all_reduce(sum, c10d::ReduceOp::SUM);
      }
      result.grad_norm =
          clip_to_norm(gradients, squares.sqrt().reshape({}), context_.step.max_grad_norm);
    }
    const bool finite = Precision::should_step(found_inf);
    context_.before_optimizer_step();
    if (finite) optimizer_->step();
    context_.precision->update(found_inf);
    result.skipped = !finite;
  }

  void all_reduce(std::vector<at::Tensor>& tensors, c10d::ReduceOp op) {
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    auto work = pp_group_->allreduce(tensors, options);
    CollectiveWait waiting;
    work->wait();
  }

  // The whole model's tensors on every rank: each pp rank in turn broadcasts its stages'.
  TensorMap gather_whole(bool buffers) const {
    TensorMap mine;
    for (const auto& stage : stages_) {
      const std::vector<at::Tensor> whole = stage.held->whole_parameters();
      std::vector<at::Tensor> held;
      std::vector<HeldLayout> layouts;
      for (std::size_t i = 0; i < whole.size(); ++i) {
        if (stage.tied_copy[i]) continue;
        held.push_back(whole[i]);
        layouts.push_back(options_.sharding
                              ? whole_parameter_layout(stage.whole_names[i], whole[i].sizes().vec())
                              : stage.layouts[i]);
      }
      // Tensor-parallel shards are assembled over the tp group first.
      for (auto& [name, tensor] : gather_whole_tensors(held, layouts, tp_group_)) {
        mine[name] = tensor;
      }
      if (!buffers) continue;
      for (std::size_t i = 0; i < stage.buffers.size(); ++i) {
        mine[stage.buffer_names[i]] = stage.buffers[i].detach();
      }
    }
    if (!pp_group_) return mine;
    TensorMap whole;
    for (int source = 0; source < shape_.ranks; ++source) {
      for (auto& [name, tensor] : broadcast_map(source == pp_rank_ ? mine : TensorMap{}, source)) {
        whole[name] = tensor;
      }
    }
    return whole;
  }

  // `tensors` of pp rank `source`, on every rank of the pipeline group: a spec, then the data.
  TensorMap broadcast_map(const TensorMap& tensors, int source) const {
    const at::Device device = context_.build.device;
    auto broadcast = [&](at::Tensor tensor) {
      std::vector<at::Tensor> one{tensor};
      c10d::BroadcastOptions options;
      options.rootRank = source;
      auto work = pp_group_->broadcast(one, options);
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
    at::Tensor length =
        broadcast(at::tensor({static_cast<std::int64_t>(spec.size())}, at::kLong).to(device));
    const std::int64_t count = length.cpu().item<std::int64_t>();
    at::Tensor body = broadcast(pp_rank_ == source ? at::tensor(spec, at::kLong).to(device)
                                                   : at::empty({count}, at::kLong).to(device));
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
      at::Tensor tensor = pp_rank_ == source
                              ? tensors.at(name).contiguous().clone()
                              : at::empty(shape, at::TensorOptions().dtype(dtype).device(device));
      out[name] = broadcast(tensor);
    }
    return out;
  }

  double now_us() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - recording_origin_).count();
  }

  // The recorded step starts with the pipeline's ranks leaving one barrier, so that their
  // timelines share a time axis.
  void start_recording() {
    if (pp_group_) {
      auto work = pp_group_->barrier();
      CollectiveWait waiting;
      work->wait();
    }
    recording_origin_ = Clock::now();
    recording_ = true;
    timeline_.clear();
  }

  void finish_recording() {
    recording_ = false;
    if (context_.build.output_dir.empty()) return;
    RankTimeline rank;
    rank.schedule = schedule_.name;
    rank.ranks = shape_.ranks;
    rank.micro_batches = shape_.micro_batches;
    rank.virtual_stages = shape_.virtual_stages;
    rank.step = steps_ + 1;
    rank.rank = context_.build.rank;
    rank.pp_rank = pp_rank_;
    rank.dp_rank = place_.rank;
    rank.actions = timeline_;
    write_measured_timeline(measured_timeline_file(context_.build.output_dir, context_.build.rank,
                                                   context_.build.world_size),
                            rank);
  }

  PipelineOptions options_;
  StrategyContext context_;
  std::shared_ptr<ProcessMesh> mesh_;
  c10::intrusive_ptr<c10d::Backend> pp_group_;  // null with one pipeline rank
  c10::intrusive_ptr<c10d::Backend> dp_group_;  // null with one data-parallel rank
  c10::intrusive_ptr<c10d::Backend> tp_group_;  // null without tensor parallelism
  int pp_rank_ = 0;
  DataParallelPlace place_;
  PipelineShape shape_;
  PipelineSchedule schedule_;
  std::vector<std::string> block_names_;
  std::vector<double> block_costs_;  // empty when the stages are named
  std::vector<BlockRange> cut_;
  std::vector<LocalStage> stages_;
  std::vector<TiedGroup> tied_;
  std::unique_ptr<StageChannel> channel_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torch::ScalarType> autocast_dtype_;
  std::vector<double> weights_;
  std::map<std::pair<int, int>, InFlight> in_flight_;
  std::map<std::pair<int, int>, Activations> handover_activations_;
  std::map<std::pair<int, int>, Activations> handover_gradients_;
  std::int64_t steps_ = 0;
  bool recording_ = false;
  Clock::time_point recording_origin_;
  std::vector<MeasuredAction> timeline_;
};

void register_components(Registry& registry) {
  registry.add<Strategy>(
      "pipeline",
      {option("schedule", "1f1b",
              "the order of forwards and backwards: gpipe, 1f1b, interleaved_1f1b or "
              "zero_bubble")
           .one_of({"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"}),
       option("micro_batches", 0,
              "micro-batches each batch is split into (0: as many as the pipeline has ranks)")
           .at_least(0),
       option("virtual_stages", 1,
              "stages per rank (interleaved_1f1b), placed looped: stage s on pp rank s % pp")
           .at_least(1),
       option("stages", std::vector<std::string>{},
              "each stage's blocks by name, comma-separated, e.g. [\"embed, layer0\", "
              "\"layer1, head\"] (empty: cut balanced by the FLOPs each block reports)"),
       option("record_step", 3,
              "the step whose measured timeline each rank writes to "
              "<output_dir>/pipeline_timeline[.rank<R>].json (0: none)")
           .at_least(0),
       option("dp_sharding", "none",
              "how each stage's data-parallel ranks hold its parameters: \"none\" (replicated, "
              "gradients all-reduced as ddp), \"full\" or \"grad_op\" (sharded as fsdp's "
              "modes, over dp_shard)")
           .one_of({"none", "full", "grad_op"}),
       option("bucket_cap_mb", 25.0,
              "data-parallel gradient bucket size in MiB (one all-reduce per bucket)")
           .at_least(0.001)},
      "pipeline parallel: stages of consecutive blocks on the pp ranks, micro-batches flowing "
      "through them by schedule; data parallel on the dp ranks",
      [](const Config& options, const BuildContext&) {
        return std::make_unique<Pipeline>(options);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("pipeline", "1.0.0", trainyard::register_components)
