#include "compare_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include "trainyard/api/error.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard {
namespace {

std::optional<double> value_of(const MetricsRecord& record, const std::string& key) {
  auto it = record.values.find(key);
  if (it == record.values.end()) return std::nullopt;
  return it->second;
}

}  // namespace

std::vector<MetricsRecord> read_records(const std::filesystem::path& file) {
  std::vector<MetricsRecord> records;
  std::ifstream in(file);
  if (!in) throw Error("compare: the run wrote no metrics file " + file.string());
  std::size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.empty()) continue;
    const nlohmann::json object =
        parse_strict_json(line, file.string() + ":" + std::to_string(number));
    if (!object.is_object()) {
      throw Error(file.string() + ":" + std::to_string(number) +
                  ": a record must be a JSON object");
    }
    MetricsRecord record;
    for (const auto& [name, value] : object.items()) {
      if (name == "phase" && value.is_string()) {
        record.phase = value.get<std::string>();
      } else if (name == "step" && value.is_number()) {
        record.step = value.get<std::int64_t>();
      } else if (name == "epoch" || name == "rank" || name == "elapsed_s") {
        continue;
      } else if (value.is_number()) {
        record.values[name] = value.get<double>();
      } else if (value.is_null()) {
        record.values[name] = std::numeric_limits<double>::quiet_NaN();
      }
    }
    records.push_back(std::move(record));
  }
  return records;
}

// Fills the curves and figures of `v` from its records.
void summarize(const std::vector<MetricsRecord>& records, VariantResult& v) {
  std::vector<const MetricsRecord*> train;
  std::vector<std::int64_t> interval_steps;
  std::int64_t previous = 0;
  for (const auto& record : records) {
    if (record.phase == "train") {
      train.push_back(&record);
      interval_steps.push_back(std::max<std::int64_t>(1, record.step - previous));
      previous = record.step;
      if (auto loss = value_of(record, "loss")) v.train_loss.push_back({record.step, *loss});
      v.steps = std::max(v.steps, record.step);
    } else if (record.phase == "eval") {
      if (auto loss = value_of(record, "loss")) {
        v.eval_loss.push_back({record.step, *loss});
        v.eval_loss_final = *loss;
      }
      v.eval_metric.reset();
      for (const auto& [name, value] : record.values) {
        if (name != "loss" && name != "samples") {
          v.eval_metric = std::make_pair(name, value);
          break;
        }
      }
    } else if (record.phase == "summary") {
      if (auto loss = value_of(record, "final_train_loss")) v.final_train_loss = *loss;
      if (auto steps = value_of(record, "steps")) v.steps = static_cast<std::int64_t>(*steps);
      if (auto peak = value_of(record, "memory_step_peak_bytes")) v.measured_step_peak = *peak;
    }
    if (auto peak = value_of(record, "memory_peak_bytes"); peak && std::isfinite(*peak)) {
      v.peak_memory_bytes = std::max(v.peak_memory_bytes.value_or(0.0), *peak);
    }
  }
  if (!v.final_train_loss && !v.train_loss.empty()) v.final_train_loss = v.train_loss.back().loss;

  // The first interval holds the warm-up (allocations, first-touch of the data); it is left out
  // when later intervals exist. Per-step times average over steps, rates over time.
  const std::size_t first = train.size() > 1 ? 1 : 0;
  std::vector<double> interval_ms;
  for (std::size_t i = first; i < train.size(); ++i) {
    auto value = value_of(*train[i], "step_time_ms");
    if (value && std::isfinite(*value)) interval_ms.push_back(*value);
  }
  v.step_times = {interval_ms};
  std::vector<std::string> per_step = {"step_time_ms"};
  for (const auto& key : compare_phase_keys()) per_step.push_back(key);
  for (const auto& key : per_step) {
    double sum = 0, weight = 0;
    for (std::size_t i = first; i < train.size(); ++i) {
      auto value = value_of(*train[i], key);
      if (!value || !std::isfinite(*value)) continue;
      sum += *value * static_cast<double>(interval_steps[i]);
      weight += static_cast<double>(interval_steps[i]);
    }
    if (weight > 0) v.steady[key] = sum / weight;
  }
  // An interval has a group's collective counts only when its steps issued some there: absent
  // is zero.
  std::set<std::string> collective_keys;
  for (const MetricsRecord* record : train) {
    for (const auto& [name, value] : record->values) {
      if (is_collective_count_key(name)) collective_keys.insert(name);
    }
  }
  for (const auto& key : collective_keys) {
    double sum = 0, weight = 0;
    for (std::size_t i = first; i < train.size(); ++i) {
      auto value = value_of(*train[i], key);
      if (value && !std::isfinite(*value)) continue;
      sum += value.value_or(0.0) * static_cast<double>(interval_steps[i]);
      weight += static_cast<double>(interval_steps[i]);
    }
    if (weight > 0) v.steady[key] = sum / weight;
  }
  for (const std::string key : {"samples_per_s", "tokens_per_s", "mfu"}) {
    double sum = 0, weight = 0;
    for (std::size_t i = first; i < train.size(); ++i) {
      auto value = value_of(*train[i], key);
      auto step_ms = value_of(*train[i], "step_time_ms");
      if (!value || !std::isfinite(*value)) continue;
      const double seconds = (step_ms && std::isfinite(*step_ms) ? *step_ms : 1.0) *
                             static_cast<double>(interval_steps[i]);
      sum += *value * seconds;
      weight += seconds;
    }
    if (weight > 0) v.steady[key] = sum / weight;
  }
}

}  // namespace trainyard
