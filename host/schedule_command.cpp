#include "schedule_command.hpp"

#include <iostream>

#include "cli.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace po = boost::program_options;

namespace trainyard {
namespace {

constexpr const char* kScheduleUsage =
    R"(usage: trainyard schedule NAME --stages P --micro-batches M [--virtual-stages V] [options]

NAME is gpipe, 1f1b, interleaved_1f1b or zero_bubble. Prints one row per rank, one column per
time unit (F3: forward of micro-batch 3, B full backward, I input gradient, W weight gradient,
2F3: stage 2's when ranks hold several stages, '.' idle), each rank's idle share, and the
share the literature gives. Exits 1 when the schedule cannot be built for these numbers.)";

}  // namespace

int command_schedule(const std::vector<std::string>& args) {
  std::string name;
  PipelineShape shape;
  PipelineCosts costs;
  po::options_description options("schedule options");
  options.add_options()("name", po::value(&name)->required(), "the schedule")(
      "stages", po::value(&shape.ranks)->required(),
      "P: pipeline ranks (the stages, with one stage per rank)")(
      "micro-batches", po::value(&shape.micro_batches)->required(), "M: micro-batches per step")(
      "virtual-stages", po::value(&shape.virtual_stages)->default_value(1),
      "V: stages per rank (interleaved_1f1b)")(
      "forward-cost", po::value(&costs.forward)->default_value(1), "F, in time units")(
      "input-gradient-cost", po::value(&costs.backward_input)->default_value(1),
      "I, in time units")("weight-gradient-cost",
                          po::value(&costs.backward_weight)->default_value(1),
                          "W, in time units (a full backward B costs I + W)");
  po::positional_options_description positional;
  positional.add("name", 1);
  auto values = parse(args, options, positional, kScheduleUsage);
  if (!values) return 0;
  const PipelineSchedule schedule = build_pipeline_schedule(name, shape);
  validate_schedule(schedule);
  std::cout << format_timeline(schedule, simulate_schedule(schedule, costs));
  return 0;
}

}  // namespace trainyard
