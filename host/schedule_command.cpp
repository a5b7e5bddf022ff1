#include "schedule_command.hpp"

#include <iostream>
#include <string>

#include "cli.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace po = boost::program_options;

namespace trainyard {
namespace {

constexpr const char* kScheduleUsage =
    R"(usage: trainyard schedule NAME --stages P --micro-batches M [--virtual-stages V] [options]
       trainyard schedule --file FILE [options]

NAME is gpipe, 1f1b, interleaved_1f1b, zero_bubble or zero_bubble_v (with V = 2); FILE a
schedule written out, one line per rank (as --as-file prints one, and strategy.schedule_file
reads it). Prints one row per rank, one column per time unit (F3: forward of micro-batch 3, B
full backward, I input gradient, W weight gradient, 2F3: stage 2's when ranks hold several
stages, '.' idle), each rank's idle share, and the share the literature gives. With
--transfer-cost, each message between ranks takes that long: the waits it causes show as idle. Exits 1 when the schedule cannot be built for these numbers, or
the file does not read or is not one training step (naming the rank, the action and why).)";

}  // namespace

int command_schedule(const std::vector<std::string>& args) {
  std::string name;
  std::string file;
  bool as_file = false;
  PipelineShape shape;
  PipelineCosts costs;
  int transfer = 0;
  po::options_description options("schedule options");
  options.add_options()("name", po::value(&name), "the schedule")(
      "file", po::value(&file), "a schedule file to check and simulate instead of NAME")(
      "as-file", po::bool_switch(&as_file),
      "print the schedule as a schedule file instead of its timeline")(
      "stages", po::value(&shape.ranks)->default_value(0),
      "P: pipeline ranks (the stages, with one stage per rank)")(
      "micro-batches", po::value(&shape.micro_batches)->default_value(0),
      "M: micro-batches per step")("virtual-stages",
                                   po::value(&shape.virtual_stages)->default_value(1),
                                   "V: stages per rank (interleaved_1f1b; 2 for zero_bubble_v)")(
      "forward-cost", po::value(&costs.forward)->default_value(1), "F, in time units")(
      "input-gradient-cost", po::value(&costs.backward_input)->default_value(1),
      "I, in time units")("weight-gradient-cost",
                          po::value(&costs.backward_weight)->default_value(1),
                          "W, in time units (a full backward B costs I + W)")(
      "transfer-cost", po::value(&transfer)->default_value(0),
      "T, in time units: a message between ranks arrives T after its send (0: at once)");
  po::positional_options_description positional;
  positional.add("name", 1);
  auto values = parse(args, options, positional, kScheduleUsage);
  if (!values) return 0;
  if (name.empty() == file.empty()) {
    throw Error("schedule: give a schedule NAME or --file FILE (one of them)");
  }
  PipelineSchedule schedule;
  if (file.empty()) {
    if (shape.ranks < 1 || shape.micro_batches < 1) {
      throw Error("schedule: NAME needs --stages P and --micro-batches M");
    }
    schedule = build_pipeline_schedule(name, shape);
  } else {
    schedule = read_schedule_file(file);
  }
  validate_schedule(schedule);
  if (as_file) {
    std::cout << format_schedule_csv(schedule);
    return 0;
  }
  std::cout << format_timeline(schedule, simulate_schedule(schedule, costs, transfer));
  return 0;
}

}  // namespace trainyard
