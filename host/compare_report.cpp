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
