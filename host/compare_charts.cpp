#include "compare_charts.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "compare_format.hpp"

namespace trainyard {
namespace {

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

}  // namespace

std::string variant_colour(std::size_t index) {
  static const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return colours[index % 10];
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

}  // namespace trainyard
