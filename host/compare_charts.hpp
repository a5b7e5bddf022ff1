#pragma once
// The compare page's inline SVG charts: the loss curves, the horizontal bar charts and the
// pipeline timelines (one row per pp rank, one box per compute action, idle time left blank).

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "compare_report.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {

// Every variant's train loss per logged interval (eval loss as circles) against the step.
std::string loss_chart(const std::vector<VariantResult>& variants);

// One horizontal bar per variant; a failed or unmeasured variant gets a label and no bar.
// `segments` splits a bar into stacked parts (key, title); empty: one bar of `key`.
std::string bar_chart(const std::string& id, const std::vector<VariantResult>& variants,
                      const std::string& key, const std::string& unit,
                      const std::vector<std::pair<std::string, std::string>>& segments,
                      bool memory);

// One compute action's box, from its start to its end in the drawing's unit.
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

// The drawing as an SVG tagged with the variant's 1-based number.
std::string timeline_svg(const TimelineDrawing& drawing, std::size_t variant_number);

}  // namespace trainyard
