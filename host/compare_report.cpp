#include "compare_report.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "compare_charts.hpp"
#include "compare_format.hpp"
#include "compare_pipeline.hpp"
#include "compare_table.hpp"

namespace trainyard {
namespace {

// The side-by-side table fits a page 1000 px wide (tools/compare/check_report_layout.py checks
// it): its headings wrap (breakable_html), its values wrap between words (words_html), it is set
// smaller and tighter than the other tables, and it sits in a box that scrolls sideways should it
// still not fit. Charts shrink to the page's width (their viewBox keeps their proportions).
const char* kStyle = R"(body{font-family:sans-serif;margin:16px 24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}
pre{background:#f4f4f4;padding:6px 8px;white-space:pre-wrap;font-size:12px;margin:4px 0}
svg{max-width:100%;height:auto}svg text{font-family:sans-serif;font-size:12px}
div.table-scroll{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px;white-space:nowrap}td.error{white-space:normal}
#compare-table{font-size:12px}#compare-table td,#compare-table th{padding:2px}
#compare-table th{font-size:11px;font-weight:normal;background:#f2f2f2;white-space:normal}
#compare-table th{vertical-align:bottom}#compare-table td.label{white-space:normal}
#compare-table td.words{white-space:normal}#compare-table td.words span{white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums}tr.failed td{background:#fdecea}
td.error{color:#b00020}h3{font-size:14px;margin:16px 0 4px}p.error{color:#b00020}
@media (max-width:1100px){body{margin:12px}#compare-table{font-size:10px}#compare-table th{font-size:9.5px}})";

// `text` escaped for HTML, with a line-break opportunity (<wbr>) after each character that is in
// `after`: on a narrow page "dp/dp_shard calls" may wrap after its '/' and '_'.
std::string breakable_html(const std::string& text, const std::string& after) {
  std::string out;
  for (char c : text) {
    out += html_escape(std::string(1, c));
    if (after.find(c) != std::string::npos) out += "<wbr>";
  }
  return out;
}

// `text` escaped for HTML, each space-separated word in a <span> that does not wrap: its cell may
// wrap between words ("399.2 MiB", "accuracy 0.1579") but never inside one ("2.38e-07").
std::string words_html(const std::string& text) {
  std::string out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = text.find(' ', start);
    out += "<span>" + html_escape(text.substr(start, end - start)) + "</span>";
    if (end == std::string::npos) return out;
    out += ' ';
    start = end + 1;
  }
}

// The side-by-side table (table_cells) inside a box that scrolls sideways. Headings may wrap
// after '/' and '_', variant labels after '.', '=', '_', '/' and ',' (and at spaces), values
// with spaces between their words; numbers and short values do not wrap.
std::string side_by_side_table(const std::vector<VariantResult>& variants) {
  const auto rows = table_cells(variants);
  const std::size_t columns = rows.front().size();
  std::ostringstream html;
  html << "<div class=\"table-scroll\"><table id=\"compare-table\">\n";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    const bool failed = r > 0 && row.size() < columns;
    html << (failed ? "<tr class=\"failed\">" : "<tr>");
    for (std::size_t c = 0; c < row.size(); ++c) {
      const char* tag = r == 0 ? "th" : "td";
      const bool error = failed && c + 1 == row.size();
      const bool number = r > 0 && !error && c != 1 && c != 2;
      const bool words = number && row[c].find(' ') != std::string::npos;
      html << "<" << tag;
      if (error) {
        html << " class=\"error\" colspan=\"" << columns - c << "\"";
      } else if (r > 0 && c == 1) {
        html << " class=\"label\"";
      } else if (number) {
        html << (words ? " class=\"num words\"" : " class=\"num\"");
      }
      if (r > 0 && c == 0)
        html << " style=\"border-left:6px solid " << variant_colour(r - 1) << "\"";
      html << ">";
      if (r == 0) {
        html << breakable_html(row[c], "/_");
      } else if (c == 1 && !error) {
        html << breakable_html(row[c], "._=/,");
      } else {
        html << (words ? words_html(row[c]) : html_escape(row[c]));
      }
      html << "</" << tag << ">";
    }
    html << "</tr>\n";
  }
  html << "</table></div>\n";
  return html.str();
}

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

namespace {

double relative_tolerance(const std::string& dtype) {
  if (dtype == "bfloat16") return 1.6e-2;
  if (dtype == "float16") return 1e-3;
  return 1.3e-6;
}

}  // namespace

bool losses_match(double reference, double loss, const std::string& reference_dtype,
                  const std::string& dtype) {
  if (std::isnan(reference) || std::isnan(loss)) return std::isnan(reference) && std::isnan(loss);
  const double rtol = std::max(relative_tolerance(reference_dtype), relative_tolerance(dtype));
  return std::abs(loss - reference) <= 1e-5 + rtol * std::abs(reference);
}

void compute_speeds(std::vector<VariantResult>& variants, const BootstrapSettings& settings) {
  const VariantResult* reference = nullptr;
  for (auto& v : variants) {
    v.step_time.reset();
    v.speed.reset();
    if (!v.succeeded) continue;
    bool timed = false;
    for (const auto& run : v.step_times) timed = timed || !run.empty();
    if (!timed) continue;
    v.step_time = estimate_step_time(v.step_times, settings);
    if (!reference) {
      reference = &v;
      continue;
    }
    v.speed = compare_speed(reference->step_times, v.step_times, settings);
  }
}

void compute_divergences(std::vector<VariantResult>& variants) {
  const VariantResult* reference = nullptr;
  for (auto& v : variants) {
    v.reference = false;
    v.divergence.reset();
    v.same_numerics.reset();
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
      const bool match =
          losses_match(it->second, p.loss, reference->compute_dtype, v.compute_dtype);
      v.same_numerics = v.same_numerics.value_or(true) && match;
    }
  }
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

  html << "<h2>Side by side</h2>\n" << side_by_side_table(variants);
  html << "<p>Step times, phases and throughput are step-weighted means over the logged "
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

  html << "<h2>Variants</h2>\n<div class=\"table-scroll\"><table id=\"variant-list\">\n"
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
  html << "</table></div>\n<h2>Command</h2>\n<pre>";
  for (std::size_t i = 0; i < report.command_line.size(); ++i) {
    html << (i ? " " : "") << html_escape(report.command_line[i]);
  }
  html << "</pre>\n</body>\n</html>\n";
  return html.str();
}

}  // namespace trainyard
