#pragma once
// compare's baselines: --save-baseline FILE keeps what a compare measured (per variant, every
// run's interval step times and the train losses), and --against FILE checks a later compare of
// the same recipes and variants against it, failing on a variant that is significantly slower
// (compare_statistics.hpp) or numerically another run.

#include <filesystem>
#include <string>
#include <vector>

#include "compare_report.hpp"
#include "compare_statistics.hpp"

namespace trainyard {

struct BaselineVariant {
  std::string label;
  std::string compute_dtype;
  RunStepTimes step_times;
  std::vector<LossPoint> train_loss;
};

struct Baseline {
  std::string title;  // the recipes' names, as compare's title
  std::vector<BaselineVariant> variants;
};

// Writes `report`'s successful variants to `file` (JSON, replaced whole or not at all).
void save_baseline(const std::filesystem::path& file, const CompareReport& report);

// Reads a baseline; throws Error naming the file and what is wrong with it.
Baseline load_baseline(const std::filesystem::path& file);

// Before anything runs: the baseline must be of the same recipes (`title`) and hold every one of
// `labels`. Throws Error (one line) otherwise.
void check_baseline_fits(const Baseline& baseline, const std::filesystem::path& file,
                         const std::string& title, const std::vector<std::string>& labels);

struct BaselineCheck {
  std::string text;        // a line per variant, for the terminal
  bool regressed = false;  // a variant significantly slower, numerically different, or failed
};

// Every variant of `results` against the baseline's of the same label.
BaselineCheck check_against_baseline(const Baseline& baseline,
                                     const std::vector<VariantResult>& results,
                                     const BootstrapSettings& settings);

}  // namespace trainyard
