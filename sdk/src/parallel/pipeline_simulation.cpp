// The pipeline simulator: each rank's actions timed by their costs, the idle shares they leave,
// the formulas the literature gives for them, and the text timeline `trainyard schedule` prints.

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "schedule_messages.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {
namespace {

using namespace schedule_messages;

std::string percent(double share) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * share);
  return text;
}

}  // namespace

int PipelineCosts::duration(PipelineActionKind kind) const {
  switch (kind) {
    case Kind::kForward:
      return forward;
    case Kind::kBackward:
      return full_backward();
    case Kind::kBackwardInput:
      return backward_input;
    case Kind::kBackwardWeight:
      return backward_weight;
    default:
      return 0;
  }
}

double RankSimulation::idle_share() const {
  const int total = busy + idle;
  return total == 0 ? 0.0 : static_cast<double>(idle) / total;
}

double PipelineSimulation::mean_idle_share() const {
  if (ranks.empty()) return 0.0;
  double sum = 0;
  for (const auto& rank : ranks) sum += rank.idle_share();
  return sum / static_cast<double>(ranks.size());
}

PipelineSimulation simulate_schedule(const PipelineSchedule& schedule, const PipelineCosts& costs) {
  return simulate_schedule(schedule, costs, 0);
}

PipelineSimulation simulate_schedule(const PipelineSchedule& schedule, const PipelineCosts& costs,
                                     int transfer) {
  if (transfer < 0) {
    throw Error("pipeline transfer time must be >= 0, got " + std::to_string(transfer));
  }
  for (auto [name, value] : {std::pair{"forward", costs.forward},
                             {"backward_input", costs.backward_input},
                             {"backward_weight", costs.backward_weight},
                             {"backward", costs.full_backward()}}) {
    if (value < 1) {
      throw Error(std::string("pipeline cost ") + name + " must be >= 1, got " +
                  std::to_string(value));
    }
  }
  check_action_places(schedule);
  const PipelineShape& shape = schedule.shape;
  PipelineSimulation simulation;
  simulation.costs = costs;
  simulation.ranks.resize(static_cast<std::size_t>(shape.ranks));
  std::vector<std::size_t> next(static_cast<std::size_t>(shape.ranks), 0);
  std::vector<int> free_at(static_cast<std::size_t>(shape.ranks), 0);
  std::vector<int> held(static_cast<std::size_t>(shape.ranks), 0);
  struct Message {
    PipelineAction send;
    int time = 0;
  };
  std::map<Channel, std::deque<Message>> in_flight;

  // Each action's time depends only on its rank's previous action and its send, so running the
  // ranks as far as they go in any order gives the same times.
  bool progress = true;
  while (progress) {
    progress = false;
    for (int rank = 0; rank < shape.ranks; ++rank) {
      const auto r = static_cast<std::size_t>(rank);
      const auto& actions = schedule.rank_actions[r];
      RankSimulation& result = simulation.ranks[r];
      while (next[r] < actions.size()) {
        const PipelineAction& action = actions[next[r]];
        int start = free_at[r];
        if (is_receive(action.kind)) {
          auto& messages = in_flight[channel_of(shape, rank, action)];
          if (messages.empty()) break;
          if (messages.front().send != counterpart(action)) {
            throw Error(at(rank, action) + ": the next " +
                        (is_activation(action.kind) ? "activation" : "gradient") + " from rank " +
                        std::to_string(shape.rank_of_stage(peer_stage(action))) + " is " +
                        to_string(messages.front().send) +
                        "'s: sends and receives are out of order");
          }
          start = std::max(start, messages.front().time);
          messages.pop_front();
        } else if (is_send(action.kind)) {
          in_flight[channel_of(shape, rank, action)].push_back({action, start + transfer});
        }
        const int end = start + costs.duration(action.kind);
        if (action.kind == Kind::kForward) {
          result.peak_held_micro_batches = std::max(result.peak_held_micro_batches, ++held[r]);
        } else if (action.kind == Kind::kBackward || action.kind == Kind::kBackwardWeight) {
          --held[r];
        }
        result.busy += end - start;
        result.actions.push_back({action, start, end});
        free_at[r] = end;
        ++next[r];
        progress = true;
      }
    }
  }

  std::string blocked;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    const auto r = static_cast<std::size_t>(rank);
    if (next[r] == schedule.rank_actions[r].size()) continue;
    const PipelineAction& action = schedule.rank_actions[r][next[r]];
    blocked += (blocked.empty() ? "" : "; ") + at(rank, action) + " waits for " +
               to_string(counterpart(action)) + " on rank " +
               std::to_string(shape.rank_of_stage(peer_stage(action)));
  }
  if (!blocked.empty()) {
    throw Error("schedule '" + schedule.name + "' deadlocks: " + blocked);
  }

  for (int end : free_at) simulation.makespan = std::max(simulation.makespan, end);
  for (auto& rank : simulation.ranks) rank.idle = simulation.makespan - rank.busy;
  return simulation;
}

IdleShareFormula idle_share_formula(const PipelineSchedule& schedule, const PipelineCosts& costs) {
  const double p = schedule.shape.ranks;
  const double m = schedule.shape.micro_batches;
  const double v = schedule.shape.virtual_stages;
  if (schedule.name == "interleaved_1f1b") {
    return {"(p-1)/(v*m+p-1)", (p - 1) / (v * m + p - 1), true};
  }
  if (schedule.name == "zero_bubble") {
    // ZB-H1's bubble is (p-1)(F+I-W) per rank, against 1F1B's (p-1)(F+I+W).
    const double f = costs.forward;
    const double i = costs.backward_input;
    const double w = costs.backward_weight;
    const double bubble = (p - 1) * std::max(0.0, f + i - w);
    return {"(p-1)(F+I-W)/(m(F+I+W)+(p-1)(F+I-W))", bubble / (m * (f + i + w) + bubble), false};
  }
  if (schedule.name == "zero_bubble_v") {
    // Each rank's stages cost F, I and W per micro-batch; what stays idle is the ramp: the last
    // rank's first stage waits for p - 1 forwards, the first rank's last input gradients for p - 1
    // more (the simulation gives exactly this where F >= I and I <= 2W, and more otherwise).
    const double f = costs.forward;
    const double i = costs.backward_input;
    const double w = costs.backward_weight;
    const double ramp = (p - 1) * std::max(f, i);
    return {"(p-1)max(F,I)/(2m(F+I+W)+(p-1)max(F,I))", ramp / (2 * m * (f + i + w) + ramp), false};
  }
  const auto& names = pipeline_schedule_names();
  if (std::find(names.begin(), names.end(), schedule.name) == names.end()) {
    // A schedule from a file has no formula of its own: 1F1B's is the yardstick.
    return {"1F1B's (p-1)/(m+p-1)", (p - 1) / (m + p - 1), false};
  }
  return {"(p-1)/(m+p-1)", (p - 1) / (m + p - 1), false};
}

std::string format_timeline(const PipelineSchedule& schedule,
                            const PipelineSimulation& simulation) {
  const PipelineShape& shape = schedule.shape;
  auto label = [&](const PipelineAction& action) {
    static const std::array<const char*, 4> kLetters = {"F", "B", "I", "W"};
    std::string text =
        kLetters[static_cast<std::size_t>(action.kind)] + std::to_string(action.micro_batch);
    return shape.virtual_stages > 1 ? std::to_string(action.stage) + text : text;
  };
  std::vector<std::vector<std::string>> cells(
      simulation.ranks.size(),
      std::vector<std::string>(static_cast<std::size_t>(simulation.makespan), "."));
  std::size_t width = 1;
  for (std::size_t rank = 0; rank < simulation.ranks.size(); ++rank) {
    for (const auto& timed : simulation.ranks[rank].actions) {
      if (!is_compute(timed.action.kind)) continue;
      const std::string text = label(timed.action);
      width = std::max(width, text.size());
      for (int t = timed.start; t < timed.end; ++t) cells[rank][static_cast<std::size_t>(t)] = text;
    }
  }
  const PipelineCosts& costs = simulation.costs;
  std::ostringstream out;
  out << schedule.name << ": " << shape.ranks << " ranks, " << shape.micro_batches
      << " micro-batches";
  if (shape.virtual_stages > 1) out << ", " << shape.virtual_stages << " stages per rank";
  out << "; F=" << costs.forward << " B=" << costs.full_backward() << " I=" << costs.backward_input
      << " W=" << costs.backward_weight << ", one column per time unit, makespan "
      << simulation.makespan << "\n";
  for (std::size_t rank = 0; rank < simulation.ranks.size(); ++rank) {
    const RankSimulation& result = simulation.ranks[rank];
    out << "rank " << rank << " |";
    for (const auto& cell : cells[rank]) out << cell << std::string(width + 1 - cell.size(), ' ');
    out << "| idle " << result.idle << "/" << result.busy + result.idle << " = "
        << percent(result.idle_share()) << ", holds at most " << result.peak_held_micro_batches
        << (result.peak_held_micro_batches == 1 ? " micro-batch\n" : " micro-batches\n");
  }
  const IdleShareFormula formula = idle_share_formula(schedule, costs);
  out << "mean idle share " << percent(simulation.mean_idle_share()) << ", formula "
      << formula.formula << (formula.upper_bound ? " at most " : " = ") << percent(formula.value)
      << "\n";
  return out.str();
}

}  // namespace trainyard
