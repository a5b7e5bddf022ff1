#pragma once
// The data a run trains on: the training split's loader at this rank's data-parallel place, the
// optimizer steps it makes per epoch and in all, and the split evaluated on.

#include <cstdint>
#include <memory>
#include <string>

#include "device_placement.hpp"
#include "run_options.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/runtime/loader.hpp"

namespace trainyard {

// A loader over `split`, map-style or streaming, or null when the dataset has no such split.
// `equal_lengths` gives every rank of a stream the same batch count (training needs it).
std::unique_ptr<Loader> open_split(const Dataset& dataset, const std::string& split,
                                   const LoaderOptions& options, bool equal_lengths);

class TrainingData {
 public:
  // Throws Error, located in [loader] where a value is to blame, when a split is missing or the
  // training split cannot make one optimizer step per epoch.
  TrainingData(const Dataset& dataset, const std::string& dataset_plugin,
               const LoaderSettings& loader, const RunOptions& run,
               const DevicePlacement& placement, DataParallelPlace place, unsigned cores,
               int local_ranks);

  Loader& loader() { return *loader_; }
  const Loader& loader() const { return *loader_; }
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t total_steps() const { return total_steps_; }
  // Empty: no evaluation.
  const std::string& eval_split() const { return eval_split_; }
  // Whether the worker count is the run's to choose (`loader.workers = -1` on a map-style split,
  // whose batches do not depend on it): the loader then starts without workers.
  bool chooses_workers() const { return chooses_workers_; }
  // Whether the loader's epoch has too few batches left for another optimizer step.
  bool epoch_complete() const;

 private:
  std::unique_ptr<Loader> loader_;
  std::int64_t accumulation_ = 1;
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t total_steps_ = 0;
  std::string eval_split_;
  bool chooses_workers_ = false;
};

}  // namespace trainyard
