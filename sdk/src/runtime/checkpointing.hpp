#pragma once
// The run's checkpoints: the [checkpoint] policy (when to save, how many to keep, where), saving
// and committing the state of every part that has one, and resuming from a saved state, with
// the checks that decide whether a state written by another number of ranks can carry on.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "trainyard/api/build_context.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

class DeviceBackend;
class Loader;
class OptimizerStepGate;
class Precision;
class Strategy;

struct CheckpointPolicy {
  std::string backend;  // the checkpoint plugin
  std::filesystem::path folder;
  std::int64_t every_steps = 0;  // 0: only at the end
  double every_seconds = 0;      // 0: never by time
  bool async = false;
  bool at_end = true;
  int keep = 3;  // 0: all

  // The recipe's [checkpoint]; the folder defaults to <output_dir>/checkpoints.
  static CheckpointPolicy read(const Config& section, const std::filesystem::path& output_dir);
};

// Where training stands: the next step, and the batch of the epoch it reads first.
struct TrainingPosition {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t batch_in_epoch = 0;
  // The engine's own state that must carry over with the position (the batches it skips, the
  // spike guard's window), by name; saved as "engine.state.<name>" metadata.
  std::map<std::string, std::string> engine_state;
};

// The run's parts whose state a checkpoint holds, and the figures that decide whether a saved
// data position carries over.
struct CheckpointedRun {
  Strategy* strategy = nullptr;
  Precision* precision = nullptr;
  DeviceBackend* device = nullptr;
  Loader* loader = nullptr;
  // Passed by the strategy before each optimizer step: an asynchronous save holds it while it
  // copies the strategy's optimizer_stepped_tensors().
  OptimizerStepGate* optimizer_step_gate = nullptr;
  std::string recipe_toml;
  // The model's export_files(), filled once the strategy has built it; saved as
  // "export.<format>/<file>" entries of the shared metadata.
  std::shared_ptr<const std::map<std::string, std::string>> export_files;
  // Samples per optimizer step over every data-parallel rank.
  std::int64_t global_batch = 0;
  std::int64_t steps_per_epoch = 0;
  std::int64_t accumulation = 1;  // micro-batches per optimizer step
  int world_size = 1;
  // The strategy and mesh ("ddp on pp 1 x dp_replicate 1 x dp_shard 2 x tp 1"): a state written
  // under another one is re-sliced from every saved rank's pieces.
  std::string layout;
  // The mesh alone ("pp 2 x dp_replicate 1 x dp_shard 1 x tp 1"): on the same ranks and mesh,
  // every rank keeps its data-parallel place, so even a streaming dataset's per-rank reader
  // positions carry over when only the strategy's layout (a pipeline's cut) changed.
  std::string mesh;
};

class Checkpointing {
 public:
  // `agreement`: the ranks' agreement on a flag (null in a single process).
  Checkpointing(const Recipe& recipe, const Registry& registry, const BuildContext& build,
                const std::filesystem::path& output_dir, CheckpointedRun run,
                std::function<bool(bool)> agreement);

  const CheckpointPolicy& policy() const { return policy_; }

  // Loads `which` (a folder, or "auto": the newest valid one, nullopt when there is none) into
  // every part and returns the position to continue from. A state written by another number of
  // ranks or under another layout (strategy, mesh) resumes its data position only when the
  // global batch and the steps per epoch are the same, whatever the ranks and micro-batches it
  // is split into; otherwise, or for a streaming dataset read from other data-parallel places,
  // it is refused with the reason.
  std::optional<TrainingPosition> resume(const std::string& which,
                                         const std::function<void(const std::string&)>& log);

  // The clock of `every_seconds` starts with training.
  void start_clock();
  // After each optimizer step: commits a background save once it is written (with several
  // ranks only at a logging boundary, which every rank reaches), then saves when the policy
  // says so before the last step. Returns whether it saved.
  bool after_step(const TrainingPosition& position, std::int64_t total_steps, bool log_boundary);
  // When the run ends: the final state, when the policy keeps one.
  void at_end(const TrainingPosition& position);
  void save(const TrainingPosition& position);
  // Whether this run saved the state after `step` (it would save the same state again).
  bool saved_at(std::int64_t step) const { return last_saved_step_ == step; }
  void commit_pending();
  const std::optional<std::filesystem::path>& last_checkpoint() const { return last_checkpoint_; }

 private:
  using Clock = std::chrono::steady_clock;
  CheckpointPolicy policy_;
  CheckpointedRun run_;
  std::function<bool(bool)> agreement_;
  std::unique_ptr<CheckpointStore> store_;
  Clock::time_point last_save_ = Clock::now();
  std::optional<std::filesystem::path> last_checkpoint_;
  std::int64_t last_saved_step_ = -1;
};

}  // namespace trainyard
