#pragma once
// The engine: builds a run's components from a resolved recipe and loops over epochs and steps.
// It only loops; the strategy owns the step.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/held_bytes.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

class Loader;
class MetricsSink;
struct TrainingPosition;

struct RunControls {
  // A checkpoint folder, or "auto" for the newest valid one in the checkpoint folder (starting
  // fresh when there is none).
  std::optional<std::string> resume;
  // Messages for the user (defaults to standard error).
  std::function<void(const std::string&)> log;
  // The run is this process alone even inside a launched rank (the launcher's variables are
  // ignored): what the memory planner's probe of the model runs as.
  bool single_process = false;
};

// What run.track_memory measured (the steady state's steps, memory_meter's figures).
struct MeasuredMemory {
  std::int64_t step_start = 0;
  std::int64_t activations = 0;  // the most a micro-batch's forward allocated and kept
  std::int64_t peak = 0;
  std::string peak_phase;
  HeldBytes held;  // the strategy's parameters, gradients and optimizer state at the end
  // A caching allocator's (a GPU's; 0 on the host): the most it held from the device, and the
  // share of that it never handed out at once, 1 - its allocated peak / its reserved peak.
  std::int64_t peak_reserved = 0;
  double fragmentation = 0;
};

struct RunSummary {
  std::int64_t steps = 0;
  std::int64_t samples = 0;
  double final_train_loss = 0;
  std::map<std::string, double> eval;  // metrics of the last evaluation
  double wall_s = 0;
  double samples_per_s = 0;
  std::optional<std::filesystem::path> last_checkpoint;
  // The signal (run.stop_signals) the run stopped on before its last step, after saving a
  // checkpoint; 0 when it ran to the end.
  int stopped_by_signal = 0;
  std::optional<MeasuredMemory> memory;  // with run.track_memory
};

class Engine {
 public:
  // `recipe` must be resolved (resolve_recipe) against `registry`.
  Engine(Recipe recipe, const Registry& registry, RunControls controls = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  RunSummary run();

  // One optimizer step over `micro_batches` (on the device) exactly as run() takes it: the
  // scheduled learning rate, the strategy's step, the running loss kept on the device.
  StepResult train_one_step(std::span<const Batch> micro_batches);
  // The next `grad_accumulation` micro-batches of the current epoch on the device, or an empty
  // vector at the end of the epoch.
  std::vector<Batch> next_micro_batches();

  Strategy& strategy();
  Loader& train_loader();
  const torch::Device& device() const;
  std::int64_t step() const;

 private:
  RunSummary run_steps();
  // The training data, its loader (and tuner) and the evaluation, after the strategy's setup.
  void set_up_data();
  // The strategy's step; one that ran out of memory throws MemoryExhausted.
  StepResult train_step_reporting_memory(std::span<const Batch> micro_batches);
  // Logs the loader's workers and compute threads, or that the first steps will choose them.
  void announce_loader();
  // Feeds one step's data wait and time to the loader tuner and applies what it chooses.
  void tune_loader(double wait_s, double step_s);
  // The ranks agreed to stop on `signal` after this step: its metrics, a checkpoint of it.
  void stop_on_signal(int signal, std::int64_t epoch);
  // The checkpoint --resume names (loaded, with the engine's state taken up), or nullopt: the
  // run starts at the beginning.
  std::optional<TrainingPosition> resume_if_asked();
  // The non-finite guard, and the refusal of a rollback without checkpoints.
  void set_up_guards();
  // After a step that was non-finite under on_nonfinite = "rollback", or whose loss spiked
  // (run.spike, whose "stop" throws Error): reloads the last checkpoint, marks the step's
  // batches never to be trained on and returns where training continues. Nullopt otherwise.
  std::optional<TrainingPosition> roll_back_if_needed(const StepResult& result, std::int64_t epoch);
  // With run.spike on: what is wrong when the step's loss spiked (collective).
  std::optional<std::string> loss_spike(const StepResult& result, std::int64_t epoch);
  // A metrics record of `phase` about step `step` (counted from 1), the last one, and its
  // batches.
  void record_step_event(const std::string& phase, std::int64_t step, double loss,
                         std::int64_t epoch);
  // Whether a step may be rolled back (run.spike's or on_nonfinite's rollback).
  bool rolls_back() const;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainyard
