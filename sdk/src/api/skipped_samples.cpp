#include "trainyard/api/skipped_samples.hpp"

#include <mutex>

namespace trainyard {
namespace {

std::mutex& skipped_mutex() {
  static std::mutex mutex;
  return mutex;
}

SkippedSamples& skipped() {
  static SkippedSamples samples;
  return samples;
}

}  // namespace

void report_skipped_sample(const std::string& reason) {
  std::lock_guard<std::mutex> lock(skipped_mutex());
  if (skipped().count++ == 0) skipped().first_reason = reason;
}

SkippedSamples skipped_samples() {
  std::lock_guard<std::mutex> lock(skipped_mutex());
  return skipped();
}

}  // namespace trainyard
