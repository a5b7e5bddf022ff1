#pragma once
// Where each loader thread's time went: per worker, the batches and samples it prepared, its busy
// time, and the stages datasets timed inside it (read, decode, transform, collate). The run
// summary reports them so that a data-bound run shows whether decoding or augmenting is the cost
// and whether more workers would help.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/api/sample_timing.hpp"

namespace trainyard {

struct WorkerTimes {
  SampleTimes stages;
  std::int64_t busy_ns = 0;
  std::int64_t batches = 0;
  std::int64_t samples = 0;
};

// Slot 0 is the training thread (batches prepared in line, loader.workers = 0), slot k the
// loader's worker k - 1. Threads record after each batch; the summary reads a snapshot.
class LoaderWorkerTimes {
 public:
  void record(std::size_t slot, const SampleTimes& stages, std::int64_t busy_ns,
              std::int64_t samples);
  std::vector<WorkerTimes> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<WorkerTimes> slots_;
};

// Times one batch's preparation on the calling thread, from construction to record().
class BatchPreparation {
 public:
  BatchPreparation();
  void record(LoaderWorkerTimes& times, std::size_t slot, std::int64_t samples);

 private:
  std::int64_t started_ns_;
};

// The summary's lines: one per thread that prepared batches ("loader worker 1: 412 batches,
// 26368 samples, busy 9810.2 ms: read 420.5 ms, decode 5100.1 ms, transform 3020.7 ms, collate
// 610.3 ms"),
// empty when none did.
std::vector<std::string> describe_worker_times(const std::vector<WorkerTimes>& times);

// The summary's figures: busy time and each stage's time, summed over the threads
// ("loader_busy_s", "loader_decode_s", ...).
std::vector<std::pair<std::string, double>> summed_worker_figures(
    const std::vector<WorkerTimes>& times);

// Advice when steps waited on data (at least 5% of the run) and the threads preparing batches
// were the limit: busy most of the run (more workers would help while cores remain), or the
// training thread itself (no workers at all). Nullopt when the data wait is small or the workers
// idled (then the cause is elsewhere: the bottleneck report says where).
std::optional<std::string> advise_loader_workers(const std::vector<WorkerTimes>& times, int workers,
                                                 double wall_s, double data_wait_share);

}  // namespace trainyard
