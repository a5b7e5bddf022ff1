#include "trainyard/runtime/loader_worker_times.hpp"

#include <chrono>
#include <cstdio>

namespace trainyard {
namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void LoaderWorkerTimes::record(std::size_t slot, const SampleTimes& stages, std::int64_t busy_ns,
                               std::int64_t samples) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (slots_.size() <= slot) slots_.resize(slot + 1);
  WorkerTimes& times = slots_[slot];
  times.stages += stages;
  times.busy_ns += busy_ns;
  times.batches += 1;
  times.samples += samples;
}

std::vector<WorkerTimes> LoaderWorkerTimes::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_;
}

// Stages timed before this batch on the same thread (an evaluation, another loader) belong to
// no batch of this loader: they are dropped here.
BatchPreparation::BatchPreparation() : started_ns_(now_ns()) { take_sample_times(); }

void BatchPreparation::record(LoaderWorkerTimes& times, std::size_t slot, std::int64_t samples) {
  times.record(slot, take_sample_times(), now_ns() - started_ns_, samples);
}

std::vector<std::string> describe_worker_times(const std::vector<WorkerTimes>& times) {
  std::vector<std::string> lines;
  for (std::size_t slot = 0; slot < times.size(); ++slot) {
    const WorkerTimes& worker = times[slot];
    if (worker.batches == 0) continue;
    char buffer[256];
    std::string line = slot == 0 ? std::string("loader (training thread)")
                                 : "loader worker " + std::to_string(slot - 1);
    std::snprintf(buffer, sizeof buffer, ": %lld batches, %lld samples, busy %.1f ms",
                  static_cast<long long>(worker.batches), static_cast<long long>(worker.samples),
                  static_cast<double>(worker.busy_ns) / 1e6);
    line += buffer;
    std::string stages;
    for (int index = 0; index < kSampleStageCount; ++index) {
      const auto stage = static_cast<SampleStage>(index);
      if (worker.stages[stage] == 0) continue;
      std::snprintf(buffer, sizeof buffer, "%s%s %.1f ms", stages.empty() ? "" : ", ",
                    sample_stage_name(stage), static_cast<double>(worker.stages[stage]) / 1e6);
      stages += buffer;
    }
    if (!stages.empty()) line += ": " + stages;
    lines.push_back(std::move(line));
  }
  return lines;
}

std::vector<std::pair<std::string, double>> summed_worker_figures(
    const std::vector<WorkerTimes>& times) {
  WorkerTimes total;
  for (const WorkerTimes& worker : times) {
    total.stages += worker.stages;
    total.busy_ns += worker.busy_ns;
  }
  std::vector<std::pair<std::string, double>> figures = {
      {"loader_busy_s", static_cast<double>(total.busy_ns) / 1e9}};
  for (int index = 0; index < kSampleStageCount; ++index) {
    const auto stage = static_cast<SampleStage>(index);
    figures.emplace_back(std::string("loader_") + sample_stage_name(stage) + "_s",
                         static_cast<double>(total.stages[stage]) / 1e9);
  }
  return figures;
}

std::optional<std::string> advise_loader_workers(const std::vector<WorkerTimes>& times, int workers,
                                                 double wall_s, double data_wait_share) {
  if (data_wait_share < 0.05 || wall_s <= 0) return std::nullopt;
  char buffer[320];
  if (workers == 0) {
    std::snprintf(buffer, sizeof buffer,
                  "loader: steps waited %.0f%% of their time for batches prepared on the training "
                  "thread; set loader.workers (-1 picks a count from the cores)",
                  100.0 * data_wait_share);
    return std::string(buffer);
  }
  std::int64_t busy_ns = 0;
  for (std::size_t slot = 1; slot < times.size(); ++slot) busy_ns += times[slot].busy_ns;
  const double busy_share = static_cast<double>(busy_ns) / 1e9 / wall_s / workers;
  if (busy_share < 0.75) return std::nullopt;
  std::snprintf(buffer, sizeof buffer,
                "loader: steps waited %.0f%% of their time for batches while the %d loader "
                "worker%s busy %.0f%% of the run; raise loader.workers if cores are free, or "
                "make samples cheaper (smaller images, fewer transforms)",
                100.0 * data_wait_share, workers, workers == 1 ? " was" : "s were",
                100.0 * busy_share);
  return std::string(buffer);
}

}  // namespace trainyard
