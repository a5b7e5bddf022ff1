#pragma once
// Where a loader thread's time goes while it prepares samples: reading bytes, decoding them,
// transforming (augmenting) them, collating them into a batch. A dataset times its own stages
// with SampleTimer; the loader takes each thread's totals after every batch it prepares and
// reports them per worker in the run summary. Per-thread counters: no locks, no sharing.

#include <array>
#include <chrono>
#include <cstdint>

namespace trainyard {

enum class SampleStage { kRead, kDecode, kTransform, kCollate };
inline constexpr int kSampleStageCount = 4;
// "read", "decode", "transform", "collate".
const char* sample_stage_name(SampleStage stage);

struct SampleTimes {
  std::array<std::int64_t, kSampleStageCount> nanoseconds{};

  std::int64_t& operator[](SampleStage stage) {
    return nanoseconds[static_cast<std::size_t>(stage)];
  }
  std::int64_t operator[](SampleStage stage) const {
    return nanoseconds[static_cast<std::size_t>(stage)];
  }
  SampleTimes& operator+=(const SampleTimes& other);
};

// Adds to the calling thread's totals.
void add_sample_time(SampleStage stage, std::chrono::nanoseconds elapsed);
// The calling thread's totals since its previous take, which starts them again from zero.
SampleTimes take_sample_times();

// Times a scope as one stage of the calling thread.
class SampleTimer {
 public:
  explicit SampleTimer(SampleStage stage)
      : stage_(stage), started_(std::chrono::steady_clock::now()) {}
  ~SampleTimer() { add_sample_time(stage_, std::chrono::steady_clock::now() - started_); }
  SampleTimer(const SampleTimer&) = delete;
  SampleTimer& operator=(const SampleTimer&) = delete;

 private:
  SampleStage stage_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace trainyard
