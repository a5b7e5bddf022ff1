#include "compare_table.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "compare_format.hpp"

namespace trainyard {
namespace {

struct Column {
  std::string key;    // a key of VariantResult::steady
  std::string title;  // its heading
  int decimals = 2;   // kBytes: shown as bytes with a unit; kCount: as a count
};
constexpr int kBytes = -1;
constexpr int kCount = -2;

std::string divergence_text(const VariantResult& v) {
  if (v.reference) return "ref";
  if (!v.divergence) return "-";
  return significant(*v.divergence, 3) + " @" + std::to_string(v.divergence_step);
}

std::string numerics_text(const VariantResult& v) {
  if (v.reference) return "ref";
  if (!v.same_numerics) return "-";
  return *v.same_numerics ? "same" : "differs";
}

// The step time: the steady mean of one run, or over repeats the median and its 95% interval.
std::string step_time_text(const VariantResult& v, double steady_ms) {
  if (v.step_times.size() < 2 || !v.step_time) return fixed(steady_ms, 2);
  return fixed(v.step_time->median_ms, 2) + " [" + fixed(v.step_time->low_ms, 2) + ", " +
         fixed(v.step_time->high_ms, 2) + "]";
}

std::string speed_text(const VariantResult& v) {
  if (v.reference) return "ref";
  return v.speed ? describe_verdict(*v.speed) : "-";
}

// A mean count per step: a whole number without decimals ("2", not "2.0"), also when it is whole
// but for rounding; else with up to two decimals ("0.5", "2.33") or, below 0.005, two significant
// digits ("0.004"); "nan" when not finite.
std::string count_text(double value) {
  const double whole = std::round(value);
  if (!std::isfinite(value) || std::abs(value - whole) < 1e-6) return fixed(whole + 0.0, 0);
  std::string text = fixed(value, 2);
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text == "0" ? significant(value, 2) : text;  // 0.004, not 0
}

std::string eval_metric_text(const VariantResult& v) {
  if (!v.eval_metric) return "-";
  return v.eval_metric->first + " " + fixed(v.eval_metric->second, 4);
}

// The steady-state columns some variant has, in display order.
std::vector<Column> present_columns(const std::vector<VariantResult>& variants) {
  std::vector<Column> all = {{"step_time_ms", "step ms", 2}};
  const std::map<std::string, std::string> phase_titles = {
      {"data_wait_ms", "data ms"}, {"h2d_ms", "h2d ms"},        {"forward_ms", "fwd ms"},
      {"backward_ms", "bwd ms"},   {"comm_wait_ms", "comm ms"}, {"optimizer_ms", "opt ms"}};
  for (const auto& key : compare_phase_keys()) all.push_back({key, phase_titles.at(key), 2});
  all.push_back({"samples_per_s", "samples/s", 1});
  all.push_back({"tokens_per_s", "tokens/s", 0});
  all.push_back({"mfu", "mfu", 4});
  std::set<std::string> groups;
  for (const auto& v : variants) {
    for (const auto& [key, value] : v.steady) {
      if (is_collective_count_key(key) && key.ends_with("_calls")) {
        groups.insert(key.substr(5, key.size() - 5 - 6));
      }
    }
  }
  for (const auto& group : groups) {
    all.push_back({"comm_" + group + "_calls", group + " calls", kCount});
    all.push_back({"comm_" + group + "_bytes", group + " bytes", kBytes});
  }
  std::vector<Column> out;
  for (const auto& column : all) {
    bool present = std::any_of(variants.begin(), variants.end(), [&](const VariantResult& v) {
      return v.steady.count(column.key) != 0;
    });
    if (present) out.push_back(column);
  }
  return out;
}

}  // namespace

bool any_memory(const std::vector<VariantResult>& variants) {
  return std::any_of(variants.begin(), variants.end(),
                     [](const VariantResult& v) { return v.peak_memory_bytes.has_value(); });
}

// The table's cells, headings first; a failed variant's row ends with its error in one cell.
std::vector<std::vector<std::string>> table_cells(const std::vector<VariantResult>& variants) {
  const auto columns = present_columns(variants);
  const bool memory = any_memory(variants);
  std::vector<std::string> heading = {"#", "variant", "status"};
  for (const auto& column : columns) heading.push_back(column.title);
  if (memory) heading.push_back("peak mem");
  const bool planned = std::any_of(variants.begin(), variants.end(), [](const VariantResult& v) {
    return v.planned_step_peak.has_value() || v.measured_step_peak.has_value();
  });
  if (planned) heading.push_back("step peak plan / measured");
  for (const char* title : {"final loss", "eval loss", "eval metric", "max |loss diff|"}) {
    heading.push_back(title);
  }
  heading.push_back("numerics");
  const bool speeds = std::any_of(variants.begin(), variants.end(),
                                  [](const VariantResult& v) { return v.speed.has_value(); });
  if (speeds) heading.push_back("speed vs ref");
  std::vector<std::vector<std::string>> rows = {heading};
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const VariantResult& v = variants[i];
    std::vector<std::string> row = {std::to_string(i + 1), v.label};
    if (!v.succeeded) {
      row.push_back("FAILED");
      row.push_back(v.error);
      rows.push_back(row);
      continue;
    }
    row.push_back("ok");
    for (const auto& column : columns) {
      auto it = v.steady.find(column.key);
      if (it == v.steady.end()) {
        row.push_back("-");
      } else if (column.key == "step_time_ms") {
        row.push_back(step_time_text(v, it->second));
      } else if (column.decimals == kBytes) {
        row.push_back(bytes_text(it->second));
      } else if (column.decimals == kCount) {
        row.push_back(count_text(it->second));
      } else {
        row.push_back(fixed(it->second, column.decimals));
      }
    }
    if (memory) row.push_back(v.peak_memory_bytes ? bytes_text(*v.peak_memory_bytes) : "-");
    if (planned) {
      row.push_back((v.planned_step_peak ? bytes_text(*v.planned_step_peak) : "-") + " / " +
                    (v.measured_step_peak ? bytes_text(*v.measured_step_peak) : "-"));
    }
    row.push_back(v.final_train_loss ? fixed(*v.final_train_loss, 4) : "-");
    row.push_back(v.eval_loss_final ? fixed(*v.eval_loss_final, 4) : "-");
    row.push_back(eval_metric_text(v));
    row.push_back(divergence_text(v));
    row.push_back(numerics_text(v));
    if (speeds) row.push_back(speed_text(v));
    rows.push_back(row);
  }
  return rows;
}

std::string format_table(const std::vector<VariantResult>& variants) {
  auto rows = table_cells(variants);
  const std::size_t columns = rows.front().size();
  std::vector<std::size_t> widths(columns, 0);
  for (const auto& row : rows) {
    // A failed row's error cell runs to the end of the line; it does not widen a column.
    const bool failed = row.size() < columns;
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (failed && c + 1 == row.size()) continue;
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  std::ostringstream out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const bool last = c + 1 == row.size();
      const bool left = c == 1 || c == 2 || last;  // label, status and the error read left to right
      std::string cell = row[c];
      if (!last) {
        std::string padding(widths[c] - std::min(widths[c], cell.size()), ' ');
        cell = left ? cell + padding : padding + cell;
      }
      line += (c == 0 ? "" : "  ") + cell;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
  return out.str();
}

}  // namespace trainyard
