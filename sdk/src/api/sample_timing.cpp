#include "trainyard/api/sample_timing.hpp"

namespace trainyard {
namespace {

thread_local SampleTimes thread_times;

}  // namespace

const char* sample_stage_name(SampleStage stage) {
  switch (stage) {
    case SampleStage::kRead:
      return "read";
    case SampleStage::kDecode:
      return "decode";
    case SampleStage::kTransform:
      return "transform";
    case SampleStage::kCollate:
      return "collate";
  }
  return "?";
}

SampleTimes& SampleTimes::operator+=(const SampleTimes& other) {
  for (std::size_t i = 0; i < nanoseconds.size(); ++i) nanoseconds[i] += other.nanoseconds[i];
  return *this;
}

void add_sample_time(SampleStage stage, std::chrono::nanoseconds elapsed) {
  thread_times[stage] += elapsed.count();
}

SampleTimes take_sample_times() {
  SampleTimes taken = thread_times;
  thread_times = SampleTimes{};
  return taken;
}

}  // namespace trainyard
