#pragma once
// Samples a dataset left out because they could not be read (on_bad_sample = "skip"): counted
// for the whole process, so that the run summary says how many and why, whichever thread or
// plugin found them. A run that skips silently trains on less data than the user thinks.

#include <cstdint>
#include <string>

namespace trainyard {

struct SkippedSamples {
  std::int64_t count = 0;
  std::string first_reason;  // "path: why" of the first one
};

// Thread-safe; `reason` names the file (and member) and what was wrong.
void report_skipped_sample(const std::string& reason);
SkippedSamples skipped_samples();

}  // namespace trainyard
