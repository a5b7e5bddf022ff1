#pragma once
// The engine's state, shared by the files that define its member functions (engine.cpp: the
// build and the loop; engine_guards.cpp: what happens after a non-finite or spiking step).
// Internal to the SDK library.

#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpointing.hpp"
#include "components.hpp"
#include "device_placement.hpp"
#include "distributed_runtime.hpp"
#include "evaluation.hpp"
#include "memory_meter.hpp"
#include "metrics_reporter.hpp"
#include "nonfinite_guard.hpp"
#include "run_options.hpp"
#include "skipped_batches.hpp"
#include "spike_guard.hpp"
#include "step_profiler.hpp"
#include "step_record.hpp"
#include "training_data.hpp"
#include "trainyard/api/step_phases.hpp"
#include "trainyard/runtime/engine.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/runtime/loader_tuning.hpp"
#include "trainyard/runtime/optimizer_step_gate.hpp"

namespace trainyard {

struct Engine::State {
  Recipe recipe;
  RunControls controls;
  std::chrono::steady_clock::time_point run_start = std::chrono::steady_clock::now();
  RunOptions run;
  LoaderSettings loader;
  std::unique_ptr<DistributedRuntime> runtime;
  DevicePlacement placement;
  // run.track_memory: made just before the strategy builds the model.
  std::unique_ptr<MemoryMeter> memory;
  Components components;
  // The step phases the strategy marks.
  std::unique_ptr<PhaseClock> phases;
  // Held by an asynchronous checkpoint until it has copied what the next optimizer step changes.
  OptimizerStepGate optimizer_step_gate;
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<Checkpointing> checkpointing;  // null without [checkpoint]
  std::unique_ptr<Evaluation> evaluation;        // null without evaluation
  std::unique_ptr<MetricsReporter> reporter;
  std::unique_ptr<NonfiniteGuard> nonfinite;
  SpikeGuard spike;
  std::unique_ptr<StepProfiler> profiler;  // run.profile_steps; null without
  // Set by a non-finite step under on_nonfinite = "rollback": what went wrong.
  std::optional<std::string> rollback_reason;
  // The checkpoint step the last rollback went back to, and how many went back to it in a row.
  std::int64_t rollback_target = -1;
  std::int64_t rollbacks_to_target = 0;
  SkippedBatches skipped_batches;
  // The loader batches (epoch, index) the last step trained on.
  std::vector<std::pair<std::int64_t, std::int64_t>> step_batches;
  // Chooses the loader's workers and the compute threads over the first steps; null when the
  // recipe sets the workers or the split is a stream.
  std::unique_ptr<LoaderTuner> loader_tuner;
  std::int64_t step = 0;
  // run.step_record_file, on rank 0; the indices of the micro-batches taken for the next step
  // (for the record and for the report of a non-finite step).
  std::unique_ptr<StepRecord> step_record;
  std::vector<std::vector<std::int64_t>> micro_batch_indices;
  double learning_rate = 0;

  State(Recipe r, RunControls c)
      : recipe(std::move(r)),
        controls(std::move(c)),
        run(RunOptions::read(recipe)),
        spike(run.spike) {}

  void log(const std::string& message) const {
    if (controls.log) {
      controls.log(message);
    } else {
      std::cerr << message << std::endl;
    }
  }
  std::function<void(const std::string&)> logger() const {
    return [this](const std::string& message) { log(message); };
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  }
  Strategy& strategy() const { return *components.strategy; }
  // Samples per optimizer step over every data-parallel rank.
  std::int64_t global_batch() const {
    return static_cast<std::int64_t>(runtime->data_parallel_place().size) * run.grad_accumulation *
           loader.batch_size;
  }
  TrainingPosition position(std::int64_t epoch) const {
    return position_at(epoch, data->loader().position());
  }
  TrainingPosition position_at(std::int64_t epoch, std::int64_t batch_in_epoch) const {
    TrainingPosition out{step, epoch, batch_in_epoch, {}};
    if (!skipped_batches.empty()) out.engine_state["skipped_batches"] = skipped_batches.save();
    if (spike.enabled()) out.engine_state["loss_window"] = spike.save();
    return out;
  }
  // Takes up the engine state a checkpoint carried (resume or rollback).
  void restore(const TrainingPosition& position) {
    if (auto it = position.engine_state.find("skipped_batches");
        it != position.engine_state.end()) {
      skipped_batches.load(it->second);
    }
    if (auto it = position.engine_state.find("loss_window"); it != position.engine_state.end()) {
      spike.load(it->second);
    }
  }
};

}  // namespace trainyard
