#pragma once
// The runtime's own recipe sections, [run] and [loader], read once into typed settings. Their
// ranges are declared with the options (run_options(), loader_options()) and checked when the
// recipe is resolved, so these only read.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/runtime/cpu_binding.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "spike_guard.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

struct RunOptions {
  std::uint64_t seed = 0;
  std::int64_t epochs = 1;
  std::int64_t max_steps = 0;  // 0: every epoch
  std::string device = default_plugins::kDevice;
  std::int64_t threads = 0;  // 0: the cores divided among the machine's ranks
  CpuBinding cpu_binding = CpuBinding::Automatic;
  std::int64_t log_every = 50;
  bool eval = true;
  std::int64_t eval_max_batches = 0;  // 0: all
  std::int64_t grad_accumulation = 1;
  double max_grad_norm = 0;
  bool grad_norm_blocks = false;  // each block's gradient norm in the train records
  bool track_memory = false;      // the steps' memory by the allocator, in the summary
  double memory_limit_gib = 0;    // host memory a step may hold (0: none); implies track_memory
  std::string on_nonfinite = "stop";       // stop | skip, for precisions that do not scale
  std::int64_t max_nonfinite_in_a_row = 5;  // skip: steps skipped in a row before stopping
  SpikeSettings spike;                      // run.spike
  std::vector<std::string> skip_batches;    // "EPOCH:BATCH"
  std::int64_t max_rollbacks = 3;           // to one checkpoint
  std::vector<std::int64_t> profile_steps;  // [first, last] or empty
  ActivationCheckpointing activation_checkpointing;
  std::filesystem::path output_dir;        // runs/<recipe name> unless the recipe says
  std::filesystem::path final_model_file;  // empty: none
  std::filesystem::path initial_model_file;  // empty: none
  std::filesystem::path step_record_file;    // empty: none
  double peak_tflops = 0;                  // 0: measured when the model reports its FLOPs
  std::vector<int> stop_signals;           // caught: stop at the next step with a checkpoint
  // The section itself, to locate errors found later (a device that is not present).
  Config section;

  static RunOptions read(const Recipe& recipe);
};

struct LoaderSettings {
  std::int64_t batch_size = 64;
  std::int64_t eval_batch_size = 0;  // 0: 4 x batch_size
  std::int64_t workers = -1;         // -1: derived from the cores and the machine's ranks
  std::int64_t eval_workers = -1;    // -1: as many as the training loader uses
  std::int64_t prefetch = 2;
  bool shuffle = true;
  bool drop_last = true;
  std::string train_split = "train";
  std::string eval_split = "test";
  // The section itself, to locate errors found later (a split the dataset lacks).
  Config section;

  static LoaderSettings read(const Recipe& recipe);
  // The worker threads of each rank, given the cores the process may use and the machine's ranks.
  int worker_count(unsigned cores, int local_ranks) const;
  std::int64_t evaluation_batch_size() const;
};

}  // namespace trainyard
