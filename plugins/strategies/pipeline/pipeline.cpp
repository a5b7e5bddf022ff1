// Pipeline parallelism: the model's blocks are cut into stages of consecutive blocks, each rank of
// the mesh's pp dimension holds one stage (or v of them, interleaved), and every batch is split
// into micro-batches that flow through the stages in the order a schedule lists (gpipe, 1f1b,
// interleaved_1f1b, zero_bubble, zero_bubble_v; pipeline_schedule.hpp; zero_bubble_v places
// its two stages per rank in a V, the schedule's shape says where each stage lives). Activations and their gradients travel
// over the pipeline group's point-to-point operations (stage_channel.hpp). The loss lives on the
// last stage. Gradients are averaged over the mesh's data-parallel group by the SDK's
// GradientReducer, once per step, and the gradients of tied parameters (a shared embedding and
// output head) are summed between the stages that hold them before every optimizer step.
//
// This file sets the strategy up (cuts the model, builds this rank's stages) and finishes each
// step (norms, clipping, the optimizer); stage_executor runs the schedule's actions, tied_weights
// sums tied gradients, pipeline_state saves, loads and gathers what the stages hold.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/optimizer.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "local_stage.hpp"
#include "model_cut.hpp"
#include "pipeline_state.hpp"
#include "split_batch.hpp"
#include "schedule_choice.hpp"
#include "stage_channel.hpp"
#include "stage_executor.hpp"
#include "stage_parameters.hpp"
#include "stage_norms.hpp"
#include "tied_weights.hpp"
#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/block_norms.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/api/step_phases.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/parallel/declared_schedule.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/parallel/gradient_reducer.hpp"
#include "trainyard/parallel/gradient_verdict.hpp"
#include "trainyard/parallel/gradients.hpp"
#include "trainyard/parallel/held_blocks.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"
#include "trainyard/parallel/pipeline_stages.hpp"
#include "trainyard/parallel/pipeline_timeline.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/parallel/tensor_parallel_step.hpp"

namespace trainyard {
namespace {

struct PipelineOptions {
  std::string schedule;
  std::filesystem::path schedule_file;  // empty: build `schedule`
  std::int64_t micro_batches = 0;  // 0: as many as the pipeline has ranks
  std::int64_t virtual_stages = 1;
  std::vector<std::string> stages;  // empty: balanced by cost
  std::int64_t record_step = 3;     // the step whose measured timeline is written; 0: none
  GradientReducerOptions reducer;
  std::optional<UnitSharding> sharding;  // parameters sharded over dp_shard; unset: replicated
};

class Pipeline final : public Strategy {
 public:
  explicit Pipeline(const Config& config) {
    options_.schedule = config.get_string("schedule");
    options_.schedule_file = config.get_path("schedule_file");
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
    schedule_ = choose_schedule({options_.schedule, options_.schedule_file,
                                 mesh_->size(MeshGroup::kPipeline),
                                 static_cast<int>(options_.micro_batches),
                                 static_cast<int>(options_.virtual_stages)});
    shape_ = schedule_.shape;
    const PipelineSimulation simulation = simulate_schedule(schedule_);
    if (pp_group_) {
      channel_ = std::make_unique<StageChannel>(pp_group_, mesh_->pipeline_return_group(),
                                                context.build.device);
    }

    autocast_dtype_ = context.precision->autocast_dtype();
    if (context.compression && options_.sharding) {
      throw Error("pipeline: [compression] replaces all-reduces of gradients, and dp_sharding "
                  "reduce-scatters them: set strategy.dp_sharding = \"none\"");
    }
    options_.reducer.compression = context.compression;
    cut_model();
    build_local_stages();
    std::vector<at::Tensor> all;
    for (const auto& stage : stages_) {
      for (const auto& tensor : stage.held->optimized()) all.push_back(tensor);
      local_flops_per_sample_ += stage.model->flops_per_sample();
    }
    optimizer_ = context.optimizer->create(all);
    find_last_weight_actions();
    executor_ = std::make_unique<StageExecutor>(stages_, channel_.get(), schedule_, pp_rank_,
                                                context_, autocast_dtype_);
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
      result.flops += static_cast<double>(batch.size) * local_flops_per_sample_;
      executor_->run(split_batch(batch, shape_.micro_batches), round == rounds - 1,
                     static_cast<double>(rounds), loss_sum);
    }
    if (channel_) channel_->wait_sends();
    for (auto& stage : stages_) stage.held->finish();
    tied_.sum_gradients(stages_, channel_.get(), shape_, pp_rank_);
    if (context_.phases) context_.phases->mark(StepPhase::CommWait);
    if (recording) finish_recording();
    finish_step(result);
    if (has_last_stage()) result.loss = loss_sum;
    // What plain all-reduces over the dp group carry, beside the collective counter's bytes.
    if (const std::int64_t bytes = gradient_bytes(stages_)) {
      result.metrics.emplace_back("gradient_bytes", static_cast<double>(bytes));
    }
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
    // Replicated stages hold the same on every data-parallel rank, sharded ones the same on every
    // replicate group.
    const std::string replicas =
        !options_.sharding ? mesh_group_name(MeshGroup::kData)
        : mesh_->size(MeshGroup::kDataReplicate) > 1 ? mesh_group_name(MeshGroup::kDataReplicate)
                                                     : "";
    save_stages(stages_, *context_.optimizer, *optimizer_, replicas, out);
  }

  std::vector<torch::Tensor> optimizer_stepped_tensors() const override {
    return stepped_tensors(*optimizer_);
  }

  void load_state(const CheckpointState& in) override {
    load_stages(stages_, *context_.optimizer, *optimizer_, in);
  }

  TensorMap full_parameters() const override { return gather_whole(/*buffers=*/false); }
  TensorMap full_model_state() const override { return gather_whole(/*buffers=*/true); }

  TensorMap gather_whole(bool buffers) const {
    return gather_whole_model(
        stages_, buffers, {pp_group_, tp_group_, pp_rank_, shape_.ranks, context_.build.device});
  }

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

  LocalStage* local_stage(int stage) { return find_stage(stages_, stage); }

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

  // What setup refuses, asked before any process starts: a schedule that cannot be built or
  // read for this mesh's pipeline size, a model that cannot be cut into its stages, and frozen
  // parameters where dp_sharding would shard them.
  void check_model(Model& model, const BuildContext& build) const override {
    const int ranks = build.mesh ? build.mesh->size(MeshGroup::kPipeline) : 1;
    choose_schedule({options_.schedule, options_.schedule_file, ranks,
                     static_cast<int>(options_.micro_batches),
                     static_cast<int>(options_.virtual_stages)});
    const std::vector<std::string> names = cuttable_block_names(
        model, ranks, options_.virtual_stages, !options_.stages.empty());
    if (!options_.stages.empty()) {
      named_stages(options_.stages, names, ranks * static_cast<int>(options_.virtual_stages));
    }
    if (!options_.sharding) return;
    for (const auto& item : model.module().named_parameters(true)) {
      if (!item.value().requires_grad()) throw Error(frozen_under_sharding(item.key()));
    }
  }

  // Decides which blocks each stage holds: as the recipe names them, or balanced by the FLOPs
  // each block reports (its parameter count when the model reports none), measured by building
  // one block at a time, so no rank ever holds more than its stages and one other block.
  void cut_model() {
    std::shared_ptr<Model> empty = context_.make_model(stage_build({0, 0}));
    block_names_ = cuttable_block_names(*empty, shape_.ranks, shape_.virtual_stages,
                                        !options_.stages.empty());
    const int stage_count = shape_.stages();
    if (!options_.stages.empty()) {
      cut_ = named_stages(options_.stages, block_names_, stage_count);
      return;
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
    block_costs_ = stage_balancing_costs(std::move(flops), std::move(sizes));
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
        TiedGroup& group = tied_.group(tie, cut_, block_names_);
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
      // Before the stage's parameters are held (sharded units take them over): which block
      // holds each, by its whole name.
      if (context_.step.block_grad_norms) {
        if (!parameter_blocks_) parameter_blocks_.emplace();
        parameter_blocks_->add(*stage.model, stage.parameters, stage.whole_names);
      }
      stage.held = hold_parameters(stage);
      stage.run = with_activation_checkpointing(
          stage.held->blocks(), context_.step.activation_checkpointing, context_.device_backend);
      stages_.push_back(std::move(stage));
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
                                    stage.layouts, mesh_->group(MeshGroup::kDataShard),
                                    mesh_->group(MeshGroup::kDataReplicate), units);
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

  // Unscale, judge by the norm over every stage (clip or skip), step: the decisions are the
  // pipeline's, agreed over the pipeline group.
  void finish_step(StepResult& result) {
    std::vector<at::Tensor> held;  // one per optimized tensor, undefined where it has none
    std::vector<at::Tensor> gradients;
    for (const auto& stage : stages_) {
      for (const at::Tensor& tensor : stage.held->optimized()) {
        held.push_back(tensor.grad());
        if (held.back().defined()) gradients.push_back(held.back());
      }
    }
    if (held_layouts_.empty()) held_layouts_ = stage_layouts(stages_);
    const std::vector<HeldLayout>& layouts = held_layouts_;
    test_nonfinite_hook(held, layouts);
    at::Tensor found_inf = context_.precision->unscale(gradients);
    if (found_inf.defined()) {
      stages_.front().held->combine_found_inf(found_inf);  // over the data-parallel shards
      agree_on_found_inf(found_inf, tp_group_);
      if (pp_group_) {
        std::vector<at::Tensor> flag{found_inf};
        all_reduce(flag, c10d::ReduceOp::MAX);
      }
    }
    at::Tensor squares = stage_gradient_squares(stages_, options_.sharding.has_value(), tp_group_,
                                                context_.build.device)
                             .reshape({1});
    if (pp_group_) {
      std::vector<at::Tensor> sum{squares};
      all_reduce(sum, c10d::ReduceOp::SUM);
    }
    if (parameter_blocks_) {
      std::vector<at::Tensor> blocks{stage_block_squares(stages_, *parameter_blocks_,
                                                         options_.sharding.has_value(), tp_group_,
                                                         context_.build.device)};
      if (pp_group_) all_reduce(blocks, c10d::ReduceOp::SUM);
      set_block_norms(blocks[0], *parameter_blocks_, result);
    }
    const GradientVerdict verdict = judge_gradients(
        context_, found_inf, squares.sqrt().reshape({}), gradients,
        [&] { return first_nonfinite_parameter(held, layouts); }, result);
    context_.before_optimizer_step();
    if (verdict.step) optimizer_->step();
    context_.precision->update(verdict.found_inf);
  }

  void all_reduce(std::vector<at::Tensor>& tensors, c10d::ReduceOp op) {
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    auto work = pp_group_->allreduce(tensors, options);
    CollectiveWait waiting;
    work->wait();
  }

  // The recorded step starts with the pipeline's ranks leaving one barrier, so that their
  // timelines share a time axis.
  void start_recording() {
    if (pp_group_) {
      auto work = pp_group_->barrier();
      CollectiveWait waiting;
      work->wait();
    }
    executor_->start_recording();
  }

  void finish_recording() {
    std::vector<MeasuredAction> actions = executor_->finish_recording();
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
    rank.actions = std::move(actions);
    write_measured_timeline(measured_timeline_file(context_.build.output_dir, context_.build.rank,
                                                   context_.build.world_size),
                            rank);
    report_idle_shares();
  }

  // Rank 0 logs, per pp rank, the idle share measured in the recorded step beside the share the
  // schedule's simulation gives at the measured costs and the formula. Its pp group (the pp
  // ranks of data-parallel rank 0) has written its files once the group leaves the barrier.
  void report_idle_shares() const {
    if (pp_group_) {
      auto work = pp_group_->barrier();
      CollectiveWait waiting;
      work->wait();
    }
    // With tp, every tp rank of a stage writes a timeline: the folder holds no single one.
    if (context_.build.rank != 0 || tp_group_) return;
    // A report, never a reason to stop training.
    try {
      const std::optional<MeasuredPipelineTimeline> timeline =
          read_measured_timeline(context_.build.output_dir);
      if (timeline) std::cerr << "pipeline: " << describe_idle_shares(*timeline) << std::endl;
    } catch (const Error& error) {
      std::cerr << "pipeline: no idle shares for the recorded step: " << error.what() << std::endl;
    }
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
  std::optional<ParameterBlocks> parameter_blocks_;  // with run.grad_norm_blocks
  std::vector<HeldLayout> held_layouts_;  // stage_layouts(stages_), made at the first step
  double local_flops_per_sample_ = 0;  // of this rank's stages: what StepResult::flops counts
  TiedWeights tied_;
  std::unique_ptr<StageChannel> channel_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torch::ScalarType> autocast_dtype_;
  std::unique_ptr<StageExecutor> executor_;
  std::int64_t steps_ = 0;
};

void register_components(Registry& registry) {
  registry.add<Strategy>(
      "pipeline",
      {option("schedule", "1f1b",
              "the order of forwards and backwards: gpipe, 1f1b, interleaved_1f1b, zero_bubble "
              "(ZB-H1) or zero_bubble_v (ZB-V: needs virtual_stages = 2)")
           .one_of({"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zero_bubble_v"}),
       option("schedule_file", "",
              "a schedule written out, one line per pp rank of actions such as 0F1, 1SEND_B0 "
              "(torch.distributed.pipelining's spelling; `trainyard schedule NAME --as-file` "
              "writes one to start from), run instead of `schedule` after validation"),
       option("micro_batches", 0,
              "micro-batches each batch is split into (0: as many as the pipeline has ranks)")
           .at_least(0),
       option("virtual_stages", 1,
              "stages per rank (interleaved_1f1b: placed looped, stage s on pp rank s % pp; "
              "zero_bubble_v: 2, placed in a V, pp rank r holding stages r and 2 pp - 1 - r)")
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
