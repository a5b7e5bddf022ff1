#include "compare_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "trainyard/error.hpp"
#include "trainyard/pipeline_schedule.hpp"

namespace trainyard {
namespace {

struct Column {
  std::string key;    // a key of VariantResult::steady
  std::string title;  // its heading
  int decimals = 2;   // kBytes: shown as bytes with a unit
};
constexpr int kBytes = -1;

std::string fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "nan";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string significant(double value, int digits) {
  if (!std::isfinite(value)) return "nan";
  char text[64];
  std::snprintf(text, sizeof text, "%.*g", digits, value);
  return text;
}

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return fixed(bytes, unit == 0 ? 0 : 1) + " " + units[unit];
}

std::string divergence_text(const VariantResult& v) {
  if (v.reference) return "ref";
  if (!v.divergence) return "-";
  return significant(*v.divergence, 3) + " @" + std::to_string(v.divergence_step);
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
    all.push_back({"comm_" + group + "_calls", group + " calls", 1});
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
  for (const char* title : {"final loss", "eval loss", "eval metric", "max |loss diff|"}) {
    heading.push_back(title);
  }
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
      } else {
        row.push_back(column.decimals == kBytes ? bytes_text(it->second)
                                                : fixed(it->second, column.decimals));
      }
    }
    if (memory) row.push_back(v.peak_memory_bytes ? bytes_text(*v.peak_memory_bytes) : "-");
    row.push_back(v.final_train_loss ? fixed(*v.final_train_loss, 4) : "-");
    row.push_back(v.eval_loss_final ? fixed(*v.eval_loss_final, 4) : "-");
    row.push_back(eval_metric_text(v));
    row.push_back(divergence_text(v));
    rows.push_back(row);
  }
  return rows;
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Round tick spacing (1, 2 or 5 times a power of ten) giving about `count` ticks over the range.
std::vector<double> ticks(double low, double high, int count) {
  std::vector<double> out;
  const double range = high - low;
  if (!(range > 0) || !std::isfinite(range)) return {low};
  const double raw = range / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double factor : {1.0, 2.0, 5.0, 10.0}) {
    step = factor * power;
    if (raw <= step) break;
  }
  for (double tick = std::ceil(low / step) * step; tick <= high + step * 1e-9; tick += step) {
    out.push_back(std::abs(tick) < step * 1e-9 ? 0.0 : tick);
  }
  return out;
}

std::string dash_pattern(std::size_t index) {
  // Later variants are dashed so that identical curves (a determinism check) stay visible.
  static const char* patterns[] = {"", "9 5", "3 4", "14 5 3 5"};
  return patterns[index % 4];
}

std::string legend(const std::vector<VariantResult>& variants, double left, double top) {
  std::ostringstream svg;
  double y = top;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& v = variants[i];
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + 28 << "\" y2=\"" << y
        << "\" stroke=\"" << variant_colour(i) << "\" stroke-width=\"3\"";
    if (!dash_pattern(i).empty()) svg << " stroke-dasharray=\"" << dash_pattern(i) << "\"";
    svg << "/><text x=\"" << left + 36 << "\" y=\"" << y + 4 << "\">" << i + 1 << ". "
        << html_escape(v.label) << (v.succeeded ? "" : " (failed)") << "</text>\n";
    y += 18;
  }
  return svg.str();
}

std::string loss_chart(const std::vector<VariantResult>& variants) {
  const double width = 1100, plot_left = 70, plot_right = 1080;
  const double legend_height = 18.0 * static_cast<double>(variants.size()) + 10;
  const double plot_top = 20 + legend_height, plot_height = 320;
  const double plot_bottom = plot_top + plot_height, height = plot_bottom + 50;

  double min_step = std::numeric_limits<double>::infinity(), max_step = -min_step;
  double min_loss = min_step, max_loss = -min_step;
  for (const auto& v : variants) {
    for (const auto* series : {&v.train_loss, &v.eval_loss}) {
      for (const auto& p : *series) {
        if (!std::isfinite(p.loss)) continue;
        min_step = std::min(min_step, static_cast<double>(p.step));
        max_step = std::max(max_step, static_cast<double>(p.step));
        min_loss = std::min(min_loss, p.loss);
        max_loss = std::max(max_loss, p.loss);
      }
    }
  }
  std::ostringstream svg;
  svg << "<svg id=\"loss-chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width
      << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << " " << height << "\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
      << legend(variants, plot_left, 20);
  if (!std::isfinite(min_step)) {
    svg << "<text x=\"" << plot_left << "\" y=\"" << plot_top + 40
        << "\">no variant logged a finite training loss</text>\n</svg>\n";
    return svg.str();
  }
  if (max_step == min_step) max_step = min_step + 1;
  const double pad = (max_loss - min_loss) * 0.05;
  double low = min_loss - pad, high = max_loss + pad;
  if (!(high > low)) {
    low = min_loss - 0.5;
    high = max_loss + 0.5;
  }
  auto x_of = [&](double step) {
    return plot_left + (step - min_step) / (max_step - min_step) * (plot_right - plot_left);
  };
  auto y_of = [&](double loss) { return plot_bottom - (loss - low) / (high - low) * plot_height; };

  svg << "<g class=\"axes\" stroke=\"#d0d0d0\" stroke-width=\"1\">\n";
  for (double tick : ticks(low, high, 6)) {
    svg << "<line x1=\"" << plot_left << "\" y1=\"" << fixed(y_of(tick), 1) << "\" x2=\""
        << plot_right << "\" y2=\"" << fixed(y_of(tick), 1) << "\"/>\n";
  }
  for (double tick : ticks(min_step, max_step, 8)) {
    svg << "<line x1=\"" << fixed(x_of(tick), 1) << "\" y1=\"" << plot_top << "\" x2=\""
        << fixed(x_of(tick), 1) << "\" y2=\"" << plot_bottom << "\"/>\n";
  }
  svg << "</g>\n<g class=\"labels\" fill=\"#333333\">\n";
  for (double tick : ticks(low, high, 6)) {
    svg << "<text x=\"" << plot_left - 6 << "\" y=\"" << fixed(y_of(tick) + 4, 1)
        << "\" text-anchor=\"end\">" << significant(tick, 4) << "</text>\n";
  }
  for (double tick : ticks(min_step, max_step, 8)) {
    svg << "<text x=\"" << fixed(x_of(tick), 1) << "\" y=\"" << plot_bottom + 18
        << "\" text-anchor=\"middle\">" << significant(tick, 7) << "</text>\n";
  }
  svg << "<text x=\"" << (plot_left + plot_right) / 2 << "\" y=\"" << plot_bottom + 40
      << "\" text-anchor=\"middle\">step</text>\n"
      << "<text x=\"16\" y=\"" << plot_top + plot_height / 2 << "\" text-anchor=\"middle\" "
      << "transform=\"rotate(-90 16 " << plot_top + plot_height / 2 << ")\">train loss</text>\n"
      << "</g>\n<rect x=\"" << plot_left << "\" y=\"" << plot_top << "\" width=\""
      << plot_right - plot_left << "\" height=\"" << plot_height
      << "\" fill=\"none\" stroke=\"#888888\"/>\n";

  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& v = variants[i];
    if (v.train_loss.empty()) continue;
    svg << "<polyline class=\"loss-curve\" data-variant=\"" << i + 1 << "\" data-label=\""
        << html_escape(v.label) << "\" fill=\"none\" stroke=\"" << variant_colour(i)
        << "\" stroke-width=\"2.5\" stroke-linejoin=\"round\"";
    if (!dash_pattern(i).empty()) svg << " stroke-dasharray=\"" << dash_pattern(i) << "\"";
    svg << " points=\"";
    bool first = true;
    for (const auto& p : v.train_loss) {
      if (!std::isfinite(p.loss)) continue;  // a diverged interval leaves a gap in the points
      svg << (first ? "" : " ") << fixed(x_of(static_cast<double>(p.step)), 1) << ","
          << fixed(y_of(p.loss), 1);
      first = false;
    }
    svg << "\"/>\n";
    for (const auto& p : v.eval_loss) {
      if (!std::isfinite(p.loss)) continue;
      svg << "<circle class=\"eval-point\" data-variant=\"" << i + 1 << "\" cx=\""
          << fixed(x_of(static_cast<double>(p.step)), 1) << "\" cy=\"" << fixed(y_of(p.loss), 1)
          << "\" r=\"4.5\" fill=\"#ffffff\" stroke=\"" << variant_colour(i)
          << "\" stroke-width=\"2\"><title>eval loss " << fixed(p.loss, 4) << "</title></circle>\n";
    }
  }
  svg << "</svg>\n";
  return svg.str();
}

// One horizontal bar per variant; a failed or unmeasured variant gets a label and no bar.
// `segments` splits a bar into stacked parts (key, title); empty: one bar of `key`.
std::string bar_chart(const std::string& id, const std::vector<VariantResult>& variants,
                      const std::string& key, const std::string& unit,
                      const std::vector<std::pair<std::string, std::string>>& segments,
                      bool memory) {
  const double label_width = 340, bar_left = label_width + 10, bar_width = 620, row = 26;
  const double legend_rows = segments.empty() ? 0 : 1;
  const double top = 10 + legend_rows * 24;
  const double height = top + row * static_cast<double>(variants.size()) + 10;
  auto value_of = [&](const VariantResult& v) -> std::optional<double> {
    if (!v.succeeded) return std::nullopt;
    if (memory) return v.peak_memory_bytes;
    auto it = v.steady.find(key);
    if (it == v.steady.end()) return std::nullopt;
    return it->second;
  };
  double largest = 0;
  for (const auto& v : variants) {
    if (auto value = value_of(v)) largest = std::max(largest, *value);
  }
  std::ostringstream svg;
  svg << "<svg id=\"" << id << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"1100\" height=\""
      << height << "\" viewBox=\"0 0 1100 " << height << "\">\n";
  // Stacked phases use a palette apart from the variants' (the colour strip at the left of
  // each row marks the variant), so a curve's colour appears nowhere else at full strength.
  static const char* segment_colours[] = {"#b3b3b3", "#8da0cb", "#66c2a5",
                                          "#a6d854", "#e78ac3", "#ffd92f"};
  if (!segments.empty()) {
    double x = bar_left;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      svg << "<rect x=\"" << x << "\" y=\"6\" width=\"14\" height=\"12\" fill=\""
          << segment_colours[s % 6] << "\"/><text x=\"" << x + 18 << "\" y=\"17\">"
          << html_escape(segments[s].second) << "</text>\n";
      x += 110;
    }
  }
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& v = variants[i];
    const double y = top + row * static_cast<double>(i);
    svg << "<rect x=\"0\" y=\"" << y + 4 << "\" width=\"6\" height=\"" << row - 8 << "\" fill=\""
        << variant_colour(i) << "\"/><text x=\"12\" y=\"" << y + row / 2 + 4 << "\">" << i + 1
        << ". " << html_escape(v.label.size() > 44 ? v.label.substr(0, 41) + "..." : v.label)
        << "</text>\n";
    auto value = value_of(v);
    if (!value || largest <= 0) {
      svg << "<text x=\"" << bar_left << "\" y=\"" << y + row / 2 + 4 << "\" fill=\"#888888\">"
          << (v.succeeded ? "not recorded" : "failed") << "</text>\n";
      continue;
    }
    const double length = *value / largest * bar_width;
    if (segments.empty()) {
      // Bars are the variant's colour at partial opacity: only curves use the full colour.
      svg << "<rect class=\"bar\" data-variant=\"" << i + 1 << "\" x=\"" << bar_left << "\" y=\""
          << y + 4 << "\" width=\"" << fixed(length, 1) << "\" height=\"" << row - 8 << "\" fill=\""
          << variant_colour(i) << "\" fill-opacity=\"0.55\"/>\n";
    } else {
      double x = bar_left;
      for (std::size_t s = 0; s < segments.size(); ++s) {
        auto it = v.steady.find(segments[s].first);
        if (it == v.steady.end() || !(it->second > 0)) continue;
        const double part = it->second / largest * bar_width;
        svg << "<rect class=\"bar-segment\" x=\"" << fixed(x, 1) << "\" y=\"" << y + 4
            << "\" width=\"" << fixed(part, 1) << "\" height=\"" << row - 8 << "\" fill=\""
            << segment_colours[s % 6] << "\"><title>" << html_escape(segments[s].second) << " "
            << fixed(it->second, 2) << " ms</title></rect>\n";
        x += part;
      }
      svg << "<rect x=\"" << bar_left << "\" y=\"" << y + 4 << "\" width=\"" << fixed(length, 1)
          << "\" height=\"" << row - 8 << "\" fill=\"none\" stroke=\"#555555\"/>\n";
    }
    svg << "<text x=\"" << fixed(bar_left + length + 6, 1) << "\" y=\"" << y + row / 2 + 4 << "\">"
        << (memory ? bytes_text(*value) : fixed(*value, 2) + " " + unit) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

// Pipeline timelines: one row per pp rank, one box per compute action, idle time left blank.

// Schedules larger than this many compute actions are described, not drawn.
constexpr std::int64_t kMaxDrawnActions = 4096;

std::string percent(double share) { return fixed(100 * share, 1) + "%"; }

const char* compute_colour(PipelineActionKind kind) {
  switch (kind) {
    case PipelineActionKind::kForward:
      return "#4e79a7";
    case PipelineActionKind::kBackward:
      return "#e15759";
    case PipelineActionKind::kBackwardInput:
      return "#f28e2b";
    case PipelineActionKind::kBackwardWeight:
      return "#59a14f";
    default:
      return "#bab0ac";
  }
}

// As `trainyard schedule` writes them: F3, B3, I3, W3, and 2F3 for stage 2 when ranks hold
// several stages.
std::string box_label(const PipelineAction& action, int virtual_stages) {
  const char* letters[] = {"F", "B", "I", "W"};
  std::string text = letters[static_cast<int>(action.kind)] + std::to_string(action.micro_batch);
  return virtual_stages > 1 ? std::to_string(action.stage) + text : text;
}

struct TimelineBox {
  PipelineAction action;
  double start = 0;
  double end = 0;
};

// What one timeline SVG shows; times in the drawing's unit (time units or microseconds).
struct TimelineDrawing {
  std::string kind;  // "simulated" or "measured"
  int virtual_stages = 1;
  std::vector<std::vector<TimelineBox>> rows;  // per pp rank, compute actions only
  std::vector<std::string> notes;              // per pp rank, at the row's right
  double span = 1;                             // the time axis runs from 0 to here
  bool microseconds = false;
};

std::string timeline_svg(const TimelineDrawing& drawing, std::size_t variant_number) {
  const double plot_left = 80, plot_right = 900, note_left = 912, row = 28, box = 20;
  const double top = 30;
  const double axis_y = top + row * static_cast<double>(drawing.rows.size()) + 4;
  const double height = axis_y + 40;
  const double span = drawing.span > 0 ? drawing.span : 1;
  // Measured axes read in milliseconds once the step is long enough for them.
  const bool in_ms = drawing.microseconds && span >= 2000;
  const double per_label_unit = in_ms ? 1000 : 1;
  auto x_of = [&](double t) { return plot_left + t / span * (plot_right - plot_left); };

  std::ostringstream svg;
  svg << "<svg class=\"pipeline-timeline\" data-timeline=\"" << drawing.kind << "\" data-variant=\""
      << variant_number << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"1100\" height=\""
      << height << "\" viewBox=\"0 0 1100 " << height << "\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  // The legend names the kinds this drawing has, in schedule order.
  double legend_x = plot_left;
  for (auto kind : {PipelineActionKind::kForward, PipelineActionKind::kBackward,
                    PipelineActionKind::kBackwardInput, PipelineActionKind::kBackwardWeight}) {
    const bool present = std::any_of(drawing.rows.begin(), drawing.rows.end(), [&](const auto& r) {
      return std::any_of(r.begin(), r.end(),
                         [&](const TimelineBox& b) { return b.action.kind == kind; });
    });
    if (!present) continue;
    svg << "<rect class=\"pipeline-legend\" x=\"" << legend_x << "\" y=\"8\" width=\"14\" "
        << "height=\"12\" fill=\"" << compute_colour(kind) << "\"/><text x=\"" << legend_x + 18
        << "\" y=\"18\">" << action_kind_name(kind) << "</text>\n";
    legend_x += 130;
  }
  for (std::size_t rank = 0; rank < drawing.rows.size(); ++rank) {
    const double y = top + row * static_cast<double>(rank);
    svg << "<g class=\"pipeline-rank\" data-rank=\"" << rank << "\">\n<text x=\"6\" y=\""
        << y + box / 2 + 4 << "\">rank " << rank << "</text>\n<line x1=\"" << plot_left
        << "\" y1=\"" << y + box + 0.5 << "\" x2=\"" << plot_right << "\" y2=\"" << y + box + 0.5
        << "\" stroke=\"#e0e0e0\"/>\n";
    for (const TimelineBox& b : drawing.rows[rank]) {
      const double x = x_of(b.start), width = x_of(b.end) - x;
      svg << "<rect class=\"pipeline-action\" data-rank=\"" << rank << "\" data-kind=\""
          << action_kind_name(b.action.kind) << "\" data-stage=\"" << b.action.stage
          << "\" data-micro-batch=\"" << b.action.micro_batch << "\" x=\"" << fixed(x, 2)
          << "\" y=\"" << y << "\" width=\"" << fixed(width, 2) << "\" height=\"" << box
          << "\" fill=\"" << compute_colour(b.action.kind)
          << "\" stroke=\"#ffffff\" stroke-width=\"0.5\"><title>" << to_string(b.action) << ": "
          << significant(b.start, 7) << " to " << significant(b.end, 7)
          << (drawing.microseconds ? " us" : " time units") << "</title></rect>\n";
      // A label only where it fits; the box's title always names it.
      const std::string label = box_label(b.action, drawing.virtual_stages);
      if (width >= 7.0 * static_cast<double>(label.size()) + 2) {
        svg << "<text class=\"pipeline-label\" x=\"" << fixed(x + width / 2, 2) << "\" y=\""
            << y + box / 2 + 4 << "\" text-anchor=\"middle\" fill=\"#ffffff\">" << label
            << "</text>\n";
      }
    }
    svg << "<text class=\"pipeline-idle\" data-rank=\"" << rank << "\" x=\"" << note_left
        << "\" y=\"" << y + box / 2 + 4 << "\">" << html_escape(drawing.notes[rank])
        << "</text>\n</g>\n";
  }
  svg << "<g class=\"axes\" fill=\"#333333\">\n<line x1=\"" << plot_left << "\" y1=\"" << axis_y
      << "\" x2=\"" << plot_right << "\" y2=\"" << axis_y << "\" stroke=\"#888888\"/>\n";
  for (double tick : ticks(0, span / per_label_unit, 10)) {
    const double x = x_of(tick * per_label_unit);
    svg << "<line x1=\"" << fixed(x, 2) << "\" y1=\"" << axis_y << "\" x2=\"" << fixed(x, 2)
        << "\" y2=\"" << axis_y + 5 << "\" stroke=\"#888888\"/><text x=\"" << fixed(x, 2)
        << "\" y=\"" << axis_y + 18 << "\" text-anchor=\"middle\">" << significant(tick, 6)
        << "</text>\n";
  }
  svg << "<text x=\"" << (plot_left + plot_right) / 2 << "\" y=\"" << axis_y + 34
      << "\" text-anchor=\"middle\">"
      << (drawing.microseconds ? (in_ms ? "ms since the ranks left the step's barrier"
                                        : "us since the ranks left the step's barrier")
                               : "time units")
      << "</text>\n</g>\n</svg>\n";
  return svg.str();
}

std::string shape_text(const std::string& schedule, const PipelineShape& shape) {
  std::string text = html_escape(schedule) + ", " + std::to_string(shape.ranks) +
                     (shape.ranks == 1 ? " rank, " : " ranks, ") +
                     std::to_string(shape.micro_batches) +
                     (shape.micro_batches == 1 ? " micro-batch" : " micro-batches");
  if (shape.virtual_stages > 1) {
    text += ", " + std::to_string(shape.virtual_stages) + " stages per rank";
  }
  return text;
}

std::string formula_text(const IdleShareFormula& formula) {
  return formula.formula + (formula.upper_bound ? " at most " : " = ") + percent(formula.value);
}

// Each kind's mean measured duration in whole microseconds (at least 1), as the costs the
// formula weighs (zero bubble's depends on F, I and W); `text` names the kinds measured.
struct MeasuredCosts {
  PipelineCosts costs;
  std::string text;  // "F=300 B=731 us"
};

MeasuredCosts measured_costs(const MeasuredPipelineTimeline& timeline) {
  double sum[4] = {0, 0, 0, 0};
  int count[4] = {0, 0, 0, 0};
  for (const auto& actions : timeline.rank_actions) {
    for (const auto& measured : actions) {
      if (!is_compute(measured.action.kind)) continue;
      const auto k = static_cast<std::size_t>(measured.action.kind);
      sum[k] += measured.end_us - measured.start_us;
      ++count[k];
    }
  }
  MeasuredCosts out;
  const char* letters[] = {"F", "B", "I", "W"};
  auto mean = [&](PipelineActionKind kind) -> std::optional<int> {
    const auto k = static_cast<std::size_t>(kind);
    if (count[k] == 0) return std::nullopt;
    const int value = std::max(1, static_cast<int>(std::lround(sum[k] / count[k])));
    out.text +=
        (out.text.empty() ? "" : " ") + std::string(letters[k]) + "=" + std::to_string(value);
    return value;
  };
  out.costs.forward = mean(PipelineActionKind::kForward).value_or(1);
  out.costs.backward = mean(PipelineActionKind::kBackward);
  out.costs.backward_input = mean(PipelineActionKind::kBackwardInput).value_or(1);
  out.costs.backward_weight = mean(PipelineActionKind::kBackwardWeight).value_or(1);
  if (!out.text.empty()) out.text += " us";
  return out;
}

// The formula for the measured shape and costs; nullopt when the schedule does not build.
std::optional<IdleShareFormula> measured_formula(const MeasuredPipelineTimeline& timeline) {
  try {
    const PipelineSchedule schedule = build_pipeline_schedule(
        timeline.schedule, {timeline.ranks, timeline.micro_batches, timeline.virtual_stages});
    return idle_share_formula(schedule, measured_costs(timeline).costs);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::string simulated_part(const PipelineVariant& variant, std::size_t number) {
  std::ostringstream html;
  if (!variant.declared) {
    html << "<p class=\"error\">The declared schedule does not read: "
         << html_escape(variant.declared_error) << "</p>\n";
    return html.str();
  }
  const std::string& name = variant.declared->schedule;
  const PipelineShape& shape = variant.declared->shape;
  const std::int64_t actions = 2LL * shape.stages() * shape.micro_batches;
  if (actions > kMaxDrawnActions) {
    html << "<p>Simulated: " << shape_text(name, shape) << ": too many actions to draw (" << actions
         << ").</p>\n";
    return html.str();
  }
  try {
    const PipelineSchedule schedule = build_pipeline_schedule(name, shape);
    validate_schedule(schedule);
    const PipelineSimulation simulation = simulate_schedule(schedule);
    TimelineDrawing drawing;
    drawing.kind = "simulated";
    drawing.virtual_stages = shape.virtual_stages;
    drawing.span = simulation.makespan;
    for (const RankSimulation& rank : simulation.ranks) {
      std::vector<TimelineBox> boxes;
      for (const TimedAction& timed : rank.actions) {
        if (!is_compute(timed.action.kind)) continue;
        boxes.push_back(
            {timed.action, static_cast<double>(timed.start), static_cast<double>(timed.end)});
      }
      drawing.rows.push_back(std::move(boxes));
      drawing.notes.push_back("idle " + percent(rank.idle_share()));
    }
    const PipelineCosts& costs = simulation.costs;
    html << "<p>Simulated: " << shape_text(name, shape) << "; costs F=" << costs.forward
         << " B=" << costs.full_backward() << " I=" << costs.backward_input
         << " W=" << costs.backward_weight << " time units, makespan " << simulation.makespan
         << ".</p>\n"
         << timeline_svg(drawing, number) << "<p class=\"pipeline-formula\">Idle share per rank: ";
    for (std::size_t rank = 0; rank < simulation.ranks.size(); ++rank) {
      html << (rank ? ", " : "") << "rank " << rank << " "
           << percent(simulation.ranks[rank].idle_share());
    }
    html << "; mean " << percent(simulation.mean_idle_share()) << "; formula "
         << html_escape(formula_text(idle_share_formula(schedule, costs))) << ".</p>\n";
  } catch (const Error& error) {
    html << "<p class=\"error\">Simulated: " << shape_text(name, shape)
         << ": the schedule does not build: " << html_escape(error.what()) << "</p>\n";
  }
  return html.str();
}

std::string measured_part(const PipelineVariant& p, const VariantResult& v, std::size_t number) {
  std::ostringstream html;
  if (!p.measured_error.empty()) {
    html << "<p class=\"error\">Measured: the timeline does not read: "
         << html_escape(p.measured_error) << "</p>\n";
    return html.str();
  }
  if (!p.measured) {
    html << "<p>Measured: the run recorded no pipeline timeline in " << html_escape(v.folder)
         << ".</p>\n";
    return html.str();
  }
  const MeasuredPipelineTimeline& m = *p.measured;
  const std::vector<double> shares = measured_idle_shares(m);
  TimelineDrawing drawing;
  drawing.kind = "measured";
  drawing.virtual_stages = m.virtual_stages;
  drawing.microseconds = true;
  drawing.span = 0;
  for (std::size_t rank = 0; rank < m.rank_actions.size(); ++rank) {
    std::vector<TimelineBox> boxes;
    for (const MeasuredAction& measured : m.rank_actions[rank]) {
      drawing.span = std::max(drawing.span, measured.end_us);
      if (!is_compute(measured.action.kind)) continue;
      boxes.push_back({measured.action, measured.start_us, measured.end_us});
    }
    drawing.rows.push_back(std::move(boxes));
    drawing.notes.push_back("idle " + percent(shares[rank]));
  }
  html << "<p>Measured: step " << m.step << ", "
       << shape_text(m.schedule, {m.ranks, m.micro_batches, m.virtual_stages})
       << "; drawn to scale, sends and receives (waits) left blank.</p>\n"
       << timeline_svg(drawing, number) << "<p class=\"pipeline-formula\">Measured idle share "
       << "(1 - compute time / makespan of the compute actions): ";
  double mean = 0;
  for (std::size_t rank = 0; rank < shares.size(); ++rank) {
    html << (rank ? ", " : "") << "rank " << rank << " " << percent(shares[rank]);
    mean += shares[rank] / static_cast<double>(shares.size());
  }
  html << "; mean " << percent(mean);
  if (auto formula = measured_formula(m)) {
    html << "; formula " << html_escape(formula_text(*formula)) << " (mean costs "
         << measured_costs(m).text << ")";
  }
  html << ".</p>\n";
  return html.str();
}

std::string pipeline_sections(const std::vector<VariantResult>& variants) {
  const bool any = std::any_of(variants.begin(), variants.end(),
                               [](const VariantResult& v) { return v.pipeline.has_value(); });
  if (!any) return "";
  std::ostringstream html;
  html << "<h2>Pipeline schedules</h2>\n<p>One row per pipeline rank, one box per compute action "
          "(forward, backward, or its input and weight halves), labelled with its micro-batch "
          "(after its stage when ranks hold several: 2F3); gaps are idle time.</p>\n";
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const VariantResult& v = variants[i];
    if (!v.pipeline) continue;
    html << "<section class=\"pipeline\" id=\"pipeline-variant-" << i + 1 << "\">\n<h3>" << i + 1
         << ". " << html_escape(v.label) << "</h3>\n"
         << simulated_part(*v.pipeline, i + 1) << measured_part(*v.pipeline, v, i + 1)
         << "</section>\n";
  }
  return html.str();
}

const char* kStyle = R"(body{font-family:sans-serif;margin:16px 24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}
pre{background:#f4f4f4;padding:6px 8px;white-space:pre-wrap;font-size:12px;margin:4px 0}
svg text{font-family:sans-serif;font-size:12px}
table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px;white-space:nowrap}td.error{white-space:normal}
td.num{text-align:right}tr.failed td{background:#fdecea}td.error{color:#b00020}
h3{font-size:14px;margin:16px 0 4px}p.error{color:#b00020})";

}  // namespace

const std::vector<std::string>& compare_phase_keys() {
  static const std::vector<std::string> keys = {"data_wait_ms", "h2d_ms",       "forward_ms",
                                                "backward_ms",  "comm_wait_ms", "optimizer_ms"};
  return keys;
}

bool is_collective_count_key(const std::string& key) {
  return key.starts_with("comm_") && (key.ends_with("_calls") || key.ends_with("_bytes")) &&
         key.size() > 5 + 6;
}

std::string variant_colour(std::size_t index) {
  static const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return colours[index % 10];
}

void compute_divergences(std::vector<VariantResult>& variants) {
  const VariantResult* reference = nullptr;
  for (auto& v : variants) {
    v.reference = false;
    v.divergence.reset();
    if (!v.succeeded) continue;
    if (!reference) {
      v.reference = true;
      reference = &v;
      continue;
    }
    std::map<std::int64_t, double> reference_loss;
    for (const auto& p : reference->train_loss) reference_loss[p.step] = p.loss;
    for (const auto& p : v.train_loss) {
      auto it = reference_loss.find(p.step);
      if (it == reference_loss.end()) continue;
      double difference = std::abs(p.loss - it->second);
      // A NaN on one side only is the largest divergence there is.
      if (std::isnan(difference)) {
        difference = std::isnan(p.loss) && std::isnan(it->second)
                         ? 0.0
                         : std::numeric_limits<double>::infinity();
      }
      if (!v.divergence || difference > *v.divergence) {
        v.divergence = difference;
        v.divergence_step = p.step;
      }
    }
  }
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

std::optional<PipelineVariant> pipeline_variant(const std::filesystem::path& output_dir) {
  PipelineVariant out;
  try {
    out.declared = read_declared_schedule(output_dir);
    if (!out.declared) return std::nullopt;
  } catch (const Error& error) {
    out.declared_error = error.what();
  }
  try {
    out.measured = read_measured_timeline(output_dir);
  } catch (const Error& error) {
    out.measured_error = error.what();
  }
  return out;
}

std::string format_pipeline_idle_shares(const std::vector<VariantResult>& variants) {
  std::ostringstream out;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const VariantResult& v = variants[i];
    if (!v.pipeline) continue;
    const std::string name = std::to_string(i + 1) + ". " + v.label;
    if (!v.pipeline->measured_error.empty()) {
      out << name << ": pipeline timeline: " << v.pipeline->measured_error << "\n";
      continue;
    }
    if (!v.pipeline->measured) continue;
    const MeasuredPipelineTimeline& m = *v.pipeline->measured;
    const auto formula = measured_formula(m);
    const std::vector<double> shares = measured_idle_shares(m);
    for (std::size_t rank = 0; rank < shares.size(); ++rank) {
      out << name << ": pipeline rank " << rank << " idle " << percent(shares[rank])
          << " measured (" << m.schedule << ", step " << m.step << "), formula "
          << (formula ? formula_text(*formula) : "unknown for this schedule") << "\n";
    }
  }
  return out.str();
}

std::string render_html(const CompareReport& report) {
  const auto& variants = report.variants;
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
       << "trainyard compare: " << html_escape(report.title) << "</title>\n<style>" << kStyle
       << "</style>\n</head>\n<body>\n<h1>trainyard compare: " << html_escape(report.title)
       << "</h1>\n";
  html << "<h2>Training loss</h2>\n" << loss_chart(variants);
  html << "<p>Solid and dashed lines: train loss per logged interval; circles: eval loss.</p>\n";

  html << "<h2>Side by side</h2>\n<table id=\"compare-table\">\n";
  auto rows = table_cells(variants);
  const std::size_t columns = rows.front().size();
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    const bool failed = r > 0 && row.size() < columns;
    html << (failed ? "<tr class=\"failed\">" : "<tr>");
    for (std::size_t c = 0; c < row.size(); ++c) {
      const char* tag = r == 0 ? "th" : "td";
      html << "<" << tag;
      if (failed && c + 1 == row.size()) {
        html << " class=\"error\" colspan=\"" << columns - c << "\"";
      } else if (r > 0 && c != 1 && c != 2) {
        html << " class=\"num\"";
      }
      if (r > 0 && c == 0)
        html << " style=\"border-left:6px solid " << variant_colour(r - 1) << "\"";
      html << ">" << html_escape(row[c]) << "</" << tag << ">";
    }
    html << "</tr>\n";
  }
  html << "</table>\n<p>Step times, phases and throughput are step-weighted means over the logged "
          "intervals after the first (warm-up); max |loss diff| is the largest difference of "
          "the train loss from variant 1 (ref) at a step both logged.</p>\n";

  std::vector<std::pair<std::string, std::string>> phases;
  for (const auto& key : compare_phase_keys()) {
    bool present = std::any_of(variants.begin(), variants.end(),
                               [&](const VariantResult& v) { return v.steady.count(key) != 0; });
    if (present && key != "data_wait_ms") phases.emplace_back(key, key.substr(0, key.size() - 3));
  }
  // The data wait alone is no breakdown; the step is split only when the engine's phases exist.
  if (!phases.empty()) phases.insert(phases.begin(), {"data_wait_ms", "data_wait"});
  html << "<h2>Step time</h2>\n"
       << bar_chart("step-time-chart", variants, "step_time_ms", "ms", phases, false);
  html << "<h2>Throughput</h2>\n"
       << bar_chart("throughput-chart", variants, "samples_per_s", "samples/s", {}, false);
  html << "<h2>Peak memory</h2>\n";
  if (any_memory(variants)) {
    html << bar_chart("memory-chart", variants, "", "", {}, true);
  } else {
    html << "<p>No variant recorded memory_peak_bytes.</p>\n";
  }
  html << pipeline_sections(variants);

  html << "<h2>Variants</h2>\n<table id=\"variant-list\">\n"
          "<tr><th>#</th><th>variant</th><th>output</th><th>wall s</th><th>result</th></tr>\n";
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& v = variants[i];
    html << "<tr" << (v.succeeded ? "" : " class=\"failed\"") << "><td>" << i + 1 << "</td><td>"
         << html_escape(v.label) << "</td><td>" << html_escape(v.folder)
         << "</td><td class=\"num\">" << fixed(v.wall_s, 1) << "</td><td"
         << (v.succeeded ? ">ok, " + std::to_string(v.steps) + " steps"
                         : " class=\"error\">" + html_escape(v.error))
         << "</td></tr>\n";
  }
  html << "</table>\n<h2>Command</h2>\n<pre>";
  for (std::size_t i = 0; i < report.command_line.size(); ++i) {
    html << (i ? " " : "") << html_escape(report.command_line[i]);
  }
  html << "</pre>\n</body>\n</html>\n";
  return html.str();
}

}  // namespace trainyard
