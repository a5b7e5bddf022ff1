#include "nonfinite_guard.hpp"

#include <cmath>
#include <sstream>

#include "trainyard/api/error.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {
namespace {

// The first few sample indices of the step's batches and how many there were.
std::string describe_samples(const std::vector<std::vector<std::int64_t>>& samples) {
  constexpr std::size_t kShown = 16;
  std::ostringstream out;
  std::size_t count = 0;
  for (const auto& micro_batch : samples) {
    for (std::int64_t index : micro_batch) {
      if (count < kShown) out << (count == 0 ? "" : ", ") << index;
      ++count;
    }
  }
  if (count == 0) return "unknown";
  if (count > kShown) out << ", ... (" << count << " in all)";
  return out.str();
}

}  // namespace

NonfiniteGuard::NonfiniteGuard(const NonfiniteSettings& settings,
                               std::function<void(const std::string&)> log)
    : settings_(settings), log_(std::move(log)) {}

std::optional<std::string> NonfiniteGuard::after_step(
    std::int64_t step, const StepResult& result,
    const std::vector<std::vector<std::int64_t>>& samples) {
  if (!applies(result)) {
    in_a_row_ = 0;
    return std::nullopt;
  }
  ++skipped_;
  ++in_a_row_;
  const std::string where = describe(step, result, samples);
  using Action = NonfiniteSettings::Action;
  if (settings_.action == Action::kStop) {
    throw Error(where +
                "; the optimizer did not step. [run] on_nonfinite = \"skip\" trains on, "
                "\"rollback\" goes back to the last checkpoint without this batch");
  }
  if (settings_.action == Action::kRollback) return where;
  if (in_a_row_ >= settings_.max_in_a_row) {
    throw Error(where + "; " + std::to_string(in_a_row_) +
                " steps in a row were non-finite (run.max_nonfinite_in_a_row), stopping");
  }
  log_("trainyard: " + where + "; skipped (on_nonfinite = skip, " + std::to_string(skipped_) +
       " so far)");
  return std::nullopt;
}

std::string NonfiniteGuard::describe(std::int64_t step, const StepResult& result,
                                     const std::vector<std::vector<std::int64_t>>& samples) {
  std::ostringstream out;
  out << "step " << step << ": non-finite gradients (";
  if (result.nonfinite_parameter.empty()) {
    out << "this rank's part is finite: another rank holds the first";
  } else {
    out << "the first on this rank in " << result.nonfinite_parameter;
  }
  out << "); the loss ";
  if (!result.loss.defined()) {
    out << "lives on another rank";
  } else {
    const double loss = result.loss.item<double>();
    out << (std::isfinite(loss) ? "was finite (" : "was already non-finite (") << loss << ")";
  }
  out << "; the batch's samples on this rank: " << describe_samples(samples);
  return out.str();
}

}  // namespace trainyard
