#pragma once
// What `trainyard compare` learned about each variant, and the two ways it shows them: a text
// table for the terminal and a self-contained HTML page (inline SVG, no scripts, fonts or styles
// fetched at view time).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainyard {

// Per-step train metrics whose mean over the run's steady intervals the table shows; the phase
// keys add up to step_time_ms (data_wait_ms first). Absent keys are left out of the table.
const std::vector<std::string>& compare_phase_keys();

struct LossPoint {
  std::int64_t step = 0;
  double loss = 0;
};

struct VariantResult {
  std::string label;   // what distinguishes it: "precision.plugin=bf16 strategy.plugin=ddp"
  std::string folder;  // its output folder, relative to the report's folder
  bool succeeded = false;
  std::string error;   // the child's one-line "trainyard: error: ..." when it failed
  double wall_s = 0;   // the child process' wall time

  std::vector<LossPoint> train_loss;  // one point per logged interval, in step order
  std::vector<LossPoint> eval_loss;
  // Step-weighted means of the train records after the first interval (warm-up), or of every
  // record when there is only one: step_time_ms, the phase keys, samples_per_s, tokens_per_s, mfu.
  std::map<std::string, double> steady;
  std::optional<double> peak_memory_bytes;  // largest memory_peak_bytes of any train record
  std::optional<double> final_train_loss;
  std::optional<double> eval_loss_final;
  std::optional<std::pair<std::string, double>> eval_metric;  // first non-loss eval value
  std::int64_t steps = 0;

  // Largest |loss - reference loss| over the steps both logged; empty for the reference itself
  // or when no step is shared.
  std::optional<double> divergence;
  std::int64_t divergence_step = 0;
  bool reference = false;
};

struct CompareReport {
  std::string title;                      // "fashion_mnist_mlp"
  std::vector<std::string> command_line;  // how it was made, shown on the page
  std::vector<VariantResult> variants;
};

// Fills each successful variant's divergence from the first successful one (the reference).
void compute_divergences(std::vector<VariantResult>& variants);

// The side-by-side table, one row per variant, columns only for values some variant has.
std::string format_table(const std::vector<VariantResult>& variants);

// The whole HTML page.
std::string render_html(const CompareReport& report);

// Stroke colour of the variant at `index` in the report's curves (also its bars' hue).
std::string variant_colour(std::size_t index);

}  // namespace trainyard
