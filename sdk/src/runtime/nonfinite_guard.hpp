#pragma once
// What the engine does after a step whose gradients held inf or nan ([run] on_nonfinite). The
// strategy has already left the optimizer alone (judge_gradients), on every rank alike; this
// stops the run with a report naming where, or counts the skip and lets it train on. Internal
// to the SDK library.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/api/strategy.hpp"

namespace trainyard {

struct NonfiniteSettings {
  enum class Action { kStop, kSkip, kRollback };
  Action action = Action::kStop;  // on_nonfinite
  std::int64_t max_in_a_row = 5;  // skip: non-finite steps in a row before stopping
  bool precision_scales = false;  // fp16: its loss scale skips such steps itself
};

class NonfiniteGuard {
 public:
  NonfiniteGuard(const NonfiniteSettings& settings, std::function<void(const std::string&)> log);

  // Whether a skipped step is this guard's to act on (fp16's loss scale keeps its own).
  bool applies(const StepResult& result) const {
    return result.skipped && !settings_.precision_scales;
  }
  // After step `step` (counted from 1, as the console and the metrics count), trained on the
  // micro-batches whose samples are `samples` on this rank. Throws Error when the run must stop;
  // returns what went wrong when it must roll back (on_nonfinite = rollback).
  std::optional<std::string> after_step(std::int64_t step, const StepResult& result,
                                        const std::vector<std::vector<std::int64_t>>& samples);

  std::int64_t skipped() const { return skipped_; }

 private:
  // Where the step went wrong, in one line.
  static std::string describe(std::int64_t step, const StepResult& result,
                              const std::vector<std::vector<std::int64_t>>& samples);

  NonfiniteSettings settings_;
  std::function<void(const std::string&)> log_;
  std::int64_t skipped_ = 0;
  std::int64_t in_a_row_ = 0;
};

}  // namespace trainyard
