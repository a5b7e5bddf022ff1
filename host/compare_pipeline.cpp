#include "compare_pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "compare_charts.hpp"
#include "compare_format.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {
namespace {

// Schedules larger than this many compute actions are described, not drawn.
constexpr std::int64_t kMaxDrawnActions = 4096;

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

}  // namespace

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

}  // namespace trainyard
