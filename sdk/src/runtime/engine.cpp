#include "trainyard/runtime/engine.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <limits>

#include "engine_state.hpp"
#include "trainyard/runtime/memory_exhausted.hpp"
#include "model_export.hpp"
#include "stop_signals.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/api/sample_index.hpp"
#include "trainyard/api/scheduler.hpp"
#include "trainyard/api/step_phases.hpp"
#include "trainyard/parallel/collective_counter.hpp"
#include "trainyard/parallel/gradient_verdict.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/runtime/loader_tuning.hpp"
#include "trainyard/runtime/optimizer_step_gate.hpp"

namespace trainyard {

using Clock = std::chrono::steady_clock;

Engine::Engine(Recipe recipe, const Registry& registry, RunControls controls)
    : state_(std::make_unique<State>(std::move(recipe), std::move(controls))) {
  State& s = *state_;
  s.loader = LoaderSettings::read(s.recipe);
  s.skipped_batches.add_entries(s.run.skip_batches);
  s.runtime = std::make_unique<DistributedRuntime>(s.run, s.recipe.section("parallel"),
                                                   s.controls.single_process);

  BuildContext build;
  build.seed = s.run.seed;
  build.recipe_dir = s.recipe.path.parent_path();
  build.output_dir = s.run.output_dir;
  s.placement = DevicePlacement::choose(s.run, registry, s.runtime->local_rank(), build);
  s.placement.make_current();
  build.device = s.placement.device;
  build.device_backend = s.placement.backend;
  s.runtime->connect(s.recipe, registry, *s.placement.backend, s.placement.device, build,
                     s.logger());

  // Every random stream starts from the recipe's seed, before anything draws from it.
  at::manual_seed(s.run.seed);
  s.placement.backend->manual_seed(s.run.seed);

  s.components = Components::build(s.recipe, registry, build);
  StrategyContext context = s.components.strategy_context(s.recipe, registry, build);
  context.device_backend = s.placement.backend;
  context.step.accumulation = s.run.grad_accumulation;
  context.step.max_grad_norm = s.run.max_grad_norm;
  context.step.block_grad_norms = s.run.grad_norm_blocks;
  context.step.activation_checkpointing = s.run.activation_checkpointing;
  s.phases = std::make_unique<PhaseClock>(s.placement.backend.get(), s.placement.index, false);
  context.phases = s.phases.get();
  // Counted from here: what the strategy builds (the model, its gradients and optimizer state,
  // communication buffers) and what the steps allocate, not the dataset.
  if (s.run.track_memory) {
    const auto limit = static_cast<std::int64_t>(s.run.memory_limit_gib * (1LL << 30));
    s.memory = std::make_unique<MemoryMeter>(s.placement.device.type(), limit);
  }
  if (MemoryMeter* memory = s.memory.get()) {
    s.phases->on_mark([memory](StepPhase phase) { memory->phase_ended(phase); });
  }
  context.optimizer_step_gate = &s.optimizer_step_gate;
  s.runtime->naming_failures([&] { s.strategy().setup(context); });

  set_up_data();
  if (s.recipe.has_section("checkpoint")) {
    CheckpointedRun saved;
    saved.strategy = s.components.strategy.get();
    saved.precision = s.components.precision.get();
    saved.device = s.placement.backend.get();
    saved.optimizer_step_gate = &s.optimizer_step_gate;
    saved.loader = &s.data->loader();
    saved.recipe_toml = to_toml(*s.recipe.root);
    saved.export_files = s.components.export_files;
    saved.global_batch = s.global_batch();
    saved.steps_per_epoch = s.data->steps_per_epoch();
    saved.accumulation = s.run.grad_accumulation;
    saved.world_size = s.runtime->world_size();
    saved.mesh = build.mesh->layout().describe();
    saved.layout = s.recipe.section("strategy").get_string("plugin") + " on " + saved.mesh;
    if (const std::string cut = s.strategy().describe_layout(); !cut.empty()) {
      saved.layout += ", " + cut;
    }
    s.checkpointing = std::make_unique<Checkpointing>(s.recipe, registry, build, s.run.output_dir,
                                                      std::move(saved), s.runtime->agreement());
  }

  MeterSetup meter;
  meter.tokens_per_sample = build.data.sequence_length;
  meter.flops_per_sample = *s.components.flops_per_sample;
  if (s.runtime->multi_process()) {
    DistributedRuntime* runtime = s.runtime.get();
    meter.sum_over_ranks = [runtime](std::vector<double> values) {
      return runtime->sum(std::move(values));
    };
  }
  ReportedRun reported{s.components.strategy, s.components.precision, s.components.scheduler,
                       s.placement,           &s.data->loader(),      s.components.base_lr,
                       s.data->total_steps(), s.runtime->rank(), s.memory.get()};
  s.reporter =
      std::make_unique<MetricsReporter>(s.recipe, registry, build, *s.phases, meter,
                                        s.run.peak_tflops, std::move(reported), s.logger());
  set_up_guards();
  s.profiler = make_step_profiler(s.run.profile_steps, s.run.output_dir, s.runtime->rank(),
                                  s.placement.backend->profiler_activities(), s.logger());
}

Engine::~Engine() = default;

// The training data, the loader tuner and the evaluation: loaded untracked, since the data is
// not the steps' memory (run.track_memory counts what the strategy holds).
void Engine::set_up_data() {
  State& s = *state_;
  std::optional<AllocationTracker::Untracked> loading_data;
  if (s.memory) loading_data.emplace();
  s.data = std::make_unique<TrainingData>(
      *s.components.dataset, s.recipe.section("dataset").get_string("plugin"), s.loader, s.run,
      s.placement, s.runtime->data_parallel_place(), s.runtime->cores(), s.runtime->local_ranks());
  if (s.data->chooses_workers()) {
    LoaderTuningSettings tuning;
    tuning.cores =
        std::max(1, static_cast<int>(s.runtime->cores()) / std::max(1, s.runtime->local_ranks()));
    tuning.threads = at::get_num_threads();
    tuning.tune_threads = s.run.threads == 0;
    s.loader_tuner = std::make_unique<LoaderTuner>(tuning);
  }
  if (!s.data->eval_split().empty()) {
    LoaderOptions options;
    options.batch_size = s.loader.evaluation_batch_size();
    options.shuffle = false;
    options.drop_last = false;
    options.pad = false;
    options.workers = s.loader.eval_workers >= 0 ? static_cast<int>(s.loader.eval_workers)
                                                 : s.data->loader().workers();
    s.evaluation = std::make_unique<Evaluation>(s.components.dataset, s.data->eval_split(), options,
                                                s.run.eval_max_batches, s.strategy(),
                                                s.placement.device, *s.runtime);
  }
}

Strategy& Engine::strategy() { return state_->strategy(); }
Loader& Engine::train_loader() { return state_->data->loader(); }
const torch::Device& Engine::device() const { return state_->placement.device; }
std::int64_t Engine::step() const { return state_->step; }

std::vector<Batch> Engine::next_micro_batches() {
  State& s = *state_;
  PhaseClock& phases = s.reporter->meter().phases();
  if (s.memory) s.memory->step_started();
  phases.begin_step(s.step);
  std::vector<Batch> host;
  host.reserve(static_cast<std::size_t>(s.run.grad_accumulation));
  s.micro_batch_indices.clear();
  s.step_batches.clear();
  Loader& loader = s.data->loader();
  for (std::int64_t i = 0; i < s.run.grad_accumulation; ++i) {
    // Batches the run never trains on are read and dropped, so that every later batch is the
    // one an uninterrupted reading gives.
    bool ended = false;
    while (!ended && s.skipped_batches.contains(loader.epoch(), loader.position())) {
      ended = !loader.next();
    }
    std::vector<std::int64_t> indices = loader.next_batch_indices();
    s.step_batches.emplace_back(loader.epoch(), loader.position());
    std::optional<Batch> batch;
    if (!ended) batch = loader.next();
    if (!batch) {
      phases.cancel_step();
      return {};
    }
    test_corrupt_batch_hook(s.step_batches.back().first, s.step_batches.back().second, *batch);
    // A stream names its samples in the batch (map-style splits are named by the loader); the
    // name is not the model's input.
    if (auto named = batch->tensors.find(kSampleIndexKey); named != batch->tensors.end()) {
      const at::Tensor values = named->second.to(at::kLong).contiguous();
      indices.assign(values.data_ptr<std::int64_t>(),
                     values.data_ptr<std::int64_t>() + values.numel());
      batch->tensors.erase(named);
    }
    s.micro_batch_indices.push_back(std::move(indices));
    host.push_back(std::move(*batch));
  }
  phases.end_data_wait();
  std::vector<Batch> micro;
  micro.reserve(host.size());
  for (const Batch& batch : host) {
    micro.push_back(s.placement.backend->stage(batch, s.placement.index));
  }
  phases.mark(StepPhase::HostToDevice);
  // Host copies are released after the mark: freeing pinned memory is not copying.
  return micro;
}

// The strategy's step. One that ran out of memory (the device's allocator, or the limit
// run.memory_limit sets) becomes MemoryExhausted, with what the memory meter saw.
StepResult Engine::train_step_reporting_memory(std::span<const Batch> micro_batches) {
  State& s = *state_;
  try {
    return s.strategy().train_step(micro_batches);
  } catch (const std::exception& error) {
    const bool device_out = dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr;
    if (s.memory) {
      auto shortage = s.memory->shortage(s.runtime->rank(), s.step + 1,
                                         s.strategy().held_bytes(), device_out);
      if (shortage) throw MemoryExhausted(std::move(*shortage));
    }
    throw;
  }
}

StepResult Engine::train_one_step(std::span<const Batch> micro_batches) {
  State& s = *state_;
  // A mesh of one rank has no groups: nothing to count, nothing to take.
  CollectiveCounter* collectives =
      s.runtime->mesh()->world_size() > 1 ? &s.runtime->mesh()->collectives() : nullptr;
  // What was issued between steps (evaluation, checkpoints) is not this step's.
  if (collectives) collectives->take();
  s.learning_rate =
      s.components.scheduler->learning_rate(s.step, s.data->total_steps(), s.components.base_lr);
  s.strategy().set_learning_rate(s.learning_rate);
  set_test_hook_step(s.step);
  if (s.profiler) s.profiler->before_step(s.step + 1);
  StepResult result = train_step_reporting_memory(micro_batches);
  if (s.optimizer_step_gate.held()) {
    // Its optimizer may have changed tensors while a checkpoint was copying them.
    throw Error("strategy '" + s.recipe.section("strategy").get_string("plugin") +
                "' stepped its optimizer without StrategyContext::before_optimizer_step() while "
                "an asynchronous checkpoint copied its optimizer_stepped_tensors(); the "
                "checkpoint could mix two steps");
  }
  if (s.step_record) {
    // A pipeline's loss lives on its last stage: rank 0 of a pipeline records no loss.
    const double loss = result.loss.defined() ? result.loss.item<double>()
                                              : std::numeric_limits<double>::quiet_NaN();
    s.step_record->write(s.step, s.learning_rate, loss, s.micro_batch_indices);
  }
  if (s.nonfinite->applies(result)) {
    const double loss = result.loss.defined() ? result.loss.item<double>()
                                              : std::numeric_limits<double>::quiet_NaN();
    record_step_event("nonfinite", s.step + 1, loss, s.data->loader().epoch());
  }
  if (auto why = s.nonfinite->after_step(s.step + 1, result, s.micro_batch_indices)) {
    s.rollback_reason = std::move(*why);
  }
  if (collectives) {
    for (const auto& [group, count] : per_group(collectives->take())) {
      result.metrics.emplace_back("comm_" + group + "_calls", static_cast<double>(count.calls));
      result.metrics.emplace_back("comm_" + group + "_bytes", static_cast<double>(count.bytes));
    }
  }
  s.reporter->meter().phases().end_step();
  ++s.step;
  if (s.profiler) s.profiler->after_step(s.step);
  s.reporter->meter().add_step(result);
  return result;
}

namespace {

std::string describe_loader(int workers, int threads) {
  return std::to_string(workers) + (workers == 1 ? " loader worker, " : " loader workers, ") +
         std::to_string(threads) + (threads == 1 ? " compute thread" : " compute threads");
}

}  // namespace

void Engine::announce_loader() {
  State& s = *state_;
  if (s.runtime->rank() != 0) return;
  if (s.evaluation && s.loader.eval_workers >= 0) {
    s.log("trainyard: evaluation loader: " + std::to_string(s.evaluation->workers()) +
          " workers (loader.eval_workers)");
  }
  if (s.loader_tuner) {
    s.log(
        "trainyard: loader.workers = -1: timing batch preparation in line over the first "
        "steps, then choosing the workers");
    return;
  }
  const std::string why = s.loader.workers == -1
                              ? " (a streaming split's order depends on its worker count: a "
                                "quarter of the cores, fixed at start)"
                              : " (loader.workers)";
  s.log("trainyard: loader: " + describe_loader(s.data->loader().workers(), at::get_num_threads()) +
        why);
}

void Engine::tune_loader(double wait_s, double step_s) {
  State& s = *state_;
  const std::optional<LoaderChoice> choice = s.loader_tuner->observe(wait_s, step_s);
  if (!choice) return;
  if (choice->workers != s.data->loader().workers()) s.data->loader().set_workers(choice->workers);
  // Evaluation follows the training loader unless the recipe gives its own count.
  if (s.evaluation && s.loader.eval_workers < 0) s.evaluation->set_workers(choice->workers);
  if (choice->threads != at::get_num_threads()) at::set_num_threads(choice->threads);
  if (!s.loader_tuner->settled()) return;
  s.reporter->set_loader_choice(s.loader_tuner->prepare_ms(), s.loader_tuner->prepare_share());
  if (s.runtime->rank() == 0) {
    s.log("trainyard: loader: " + describe_loader(choice->workers, choice->threads) + " after " +
          std::to_string(s.step) + " steps: " + choice->reason);
  }
}

void Engine::stop_on_signal(int signal, std::int64_t epoch) {
  State& s = *state_;
  s.reporter->flush_train(s.step, epoch, s.elapsed());
  std::string saved = "no [checkpoint] section: nothing saved";
  if (s.checkpointing) {
    if (!s.checkpointing->saved_at(s.step)) s.checkpointing->save(s.position(epoch));
    s.checkpointing->commit_pending();
    saved = "checkpoint " + s.checkpointing->last_checkpoint()->string() +
            " saved; --resume auto continues";
  }
  if (s.runtime->rank() == 0) {
    s.log(std::string("trainyard: stopping at step ") + std::to_string(s.step) + " on SIG" +
          sigabbrev_np(signal) + ": " + saved);
  }
}

RunSummary Engine::run() {
  State& s = *state_;
  return s.runtime->naming_failures([&] {
    RunSummary summary = run_steps();
    s.runtime->finish();
    return summary;
  });
}

std::optional<TrainingPosition> Engine::resume_if_asked() {
  State& s = *state_;
  if (!s.controls.resume) return std::nullopt;
  if (!s.checkpointing) {
    throw Error(
        "--resume needs checkpoints, and the recipe has no [checkpoint] section: add one "
        "(`[checkpoint]` with `plugin = \"torch\"`, or --set checkpoint.plugin=torch) so that "
        "runs save checkpoints to resume from");
  }
  std::optional<TrainingPosition> resumed = s.checkpointing->resume(*s.controls.resume, s.logger());
  if (resumed) {
    s.step = resumed->step;
    s.restore(*resumed);
  }
  return resumed;
}

RunSummary Engine::run_steps() {
  State& s = *state_;
  const std::optional<TrainingPosition> resumed = resume_if_asked();
  const TrainingPosition start = resumed.value_or(TrainingPosition{});
  const std::int64_t total_steps = s.data->total_steps();
  if (!s.run.initial_model_file.empty()) {
    export_final_model(s.strategy(), s.runtime->rank(), s.run.initial_model_file);
  }
  if (!s.run.step_record_file.empty() && s.runtime->rank() == 0) {
    s.step_record = std::make_unique<StepRecord>(s.run.step_record_file);
  }
  s.reporter->begin({s.recipe.name(), total_steps, s.data->steps_per_epoch(), s.run.epochs,
                     s.runtime->rank(), s.runtime->world_size(), s.run.output_dir.string(),
                     start.step});
  announce_loader();
  if (rolls_back() && (!resumed || *s.controls.resume != "auto")) {
    // A rollback before the first save goes back to the start, which the checkpoint folder
    // holds only when the run resumed from it.
    s.checkpointing->save(s.position_at(start.epoch, start.batch_in_epoch));
  }
  if (s.checkpointing) s.checkpointing->start_clock();
  const auto run_started = Clock::now();
  const std::int64_t first_step = s.step;
  TrainingMeter& meter = s.reporter->meter();
  meter.restart_clock();
  const StopSignals stop_signals(s.run.stop_signals);
  int stopped_by = 0;  // the signal the ranks agreed to stop on
  std::int64_t epoch = start.epoch;
  std::int64_t first_batch = start.batch_in_epoch;
  while (epoch < s.run.epochs && s.step < total_steps) {
    s.data->loader().start_epoch(epoch, first_batch);
    std::optional<TrainingPosition> rolled_back;
    while (s.step < total_steps) {
      const auto step_started = Clock::now();
      std::vector<Batch> micro = next_micro_batches();
      if (micro.empty()) break;
      const auto batches_ready = Clock::now();
      s.runtime->before_step(s.step);
      const StepResult result = train_one_step(micro);
      if ((rolled_back = roll_back_if_needed(result, epoch))) break;
      if (s.loader_tuner && !s.loader_tuner->settled()) {
        using Seconds = std::chrono::duration<double>;
        tune_loader(Seconds(batches_ready - step_started).count(),
                    Seconds(Clock::now() - step_started).count());
      }
      const bool log_boundary = s.step % s.run.log_every == 0;
      if (log_boundary) s.reporter->flush_train(s.step, epoch, s.elapsed());
      // Throughput and step time measure training, not saving.
      if (s.checkpointing &&
          s.checkpointing->after_step(s.position(epoch), total_steps, log_boundary)) {
        meter.restart_clock();
      }
      stopped_by = s.runtime->agreed_stop_signal(StopSignals::received());
      if (stopped_by != 0) break;
    }
    if (rolled_back) {
      epoch = rolled_back->epoch;
      first_batch = rolled_back->batch_in_epoch;
      meter.restart_clock();
      continue;
    }
    if (stopped_by != 0) {
      stop_on_signal(stopped_by, epoch);
      break;
    }
    const bool finished = s.step >= total_steps;
    s.reporter->flush_train(s.step, epoch, s.elapsed());
    const bool epoch_complete = s.data->epoch_complete();
    if (s.evaluation && (epoch_complete || finished)) {
      s.reporter->write_eval(s.step, epoch, s.elapsed(), s.evaluation->run());
      meter.restart_clock();
    }
    // A completed epoch resumes at the start of the next one.
    if (finished && s.checkpointing) {
      s.checkpointing->at_end(epoch_complete ? s.position_at(epoch + 1, 0) : s.position(epoch));
    }
    ++epoch;
    first_batch = 0;
  }

  if (s.checkpointing) s.checkpointing->commit_pending();
  // A run stopped by a signal has not finished: it leaves a checkpoint, not a final model.
  if (!s.run.final_model_file.empty() && stopped_by == 0) {
    export_final_model(s.strategy(), s.runtime->rank(), s.run.final_model_file);
  }
  RunSummary summary;
  summary.stopped_by_signal = stopped_by;
  summary.steps = s.step;
  summary.wall_s = std::chrono::duration<double>(Clock::now() - run_started).count();
  summary.samples = (s.step - first_step) * s.run.grad_accumulation * s.loader.batch_size;
  summary.samples_per_s =
      summary.wall_s > 0 ? static_cast<double>(summary.samples) / summary.wall_s : 0;
  if (s.checkpointing) summary.last_checkpoint = s.checkpointing->last_checkpoint();
  return s.reporter->finish(summary, epoch, s.elapsed());
}

}  // namespace trainyard
