#pragma once
// The record of a run's steps that another program replays (tools/parity/replay.py): one JSON
// line per optimizer step with its learning rate, its loss, and the training split's sample
// indices of each micro-batch, in the order the micro-batches ran.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

namespace trainyard {

class StepRecord {
 public:
  // Truncates `file` (creating its folder); throws Error when it cannot be written.
  explicit StepRecord(const std::filesystem::path& file);

  // Written and flushed at once, so a run that fails later leaves the steps it took.
  void write(std::int64_t step, double learning_rate, double loss,
             const std::vector<std::vector<std::int64_t>>& micro_batch_indices);

 private:
  std::filesystem::path file_;
  std::ofstream out_;
};

}  // namespace trainyard
