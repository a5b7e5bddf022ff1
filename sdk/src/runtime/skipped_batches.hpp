#pragma once
// Loader batches a run never trains on: those of a step a loss spike rolled back
// (spike_guard.hpp), and those the recipe lists (run.skip_batches). Kept in every checkpoint, so
// a resumed run skips them as well. Internal to the SDK library.

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace trainyard {

struct Batch;

class SkippedBatches {
 public:
  // "EPOCH:BATCH" entries (the loader's batch index within the epoch). Throws Error naming a
  // malformed one.
  void add_entries(const std::vector<std::string>& entries);
  void add(std::int64_t epoch, std::int64_t batch) { batches_.emplace(epoch, batch); }
  bool contains(std::int64_t epoch, std::int64_t batch) const {
    return batches_.count({epoch, batch}) != 0;
  }
  bool empty() const { return batches_.empty(); }

  // "E:B,E:B" for checkpoint metadata, and back (added to those already here).
  std::string save() const;
  void load(const std::string& text);

 private:
  std::set<std::pair<std::int64_t, std::int64_t>> batches_;
};

// Test hook, as test_failure_hook: TRAINYARD_TEST_CORRUPT_BATCH="EPOCH:BATCH[:nan][,...]"
// multiplies the floating-point input of those loader batches by 1000, a corrupted batch whose
// loss spikes (or, with ":nan", fills it with nan, a batch whose gradients are not finite).
void test_corrupt_batch_hook(std::int64_t epoch, std::int64_t index, Batch& batch);

}  // namespace trainyard
