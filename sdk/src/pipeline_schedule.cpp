#include "trainyard/pipeline_schedule.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "trainyard/error.hpp"

namespace trainyard {

namespace {

using Kind = PipelineActionKind;

constexpr int kKindCount = 8;

std::string numbers(const PipelineShape& shape) {
  return "p = " + std::to_string(shape.ranks) + ", m = " + std::to_string(shape.micro_batches) +
         ", v = " + std::to_string(shape.virtual_stages);
}

struct ShapeNeeds {
  bool one_stage_per_rank = true;
  bool micro_batches_at_least_ranks = true;
  bool micro_batches_multiple_of_ranks = false;
};

void check_shape(std::string_view name, const PipelineShape& shape, const ShapeNeeds& needs) {
  auto refuse = [&](const std::string& what) {
    throw Error(std::string(name) + " schedule: " + what + ", got " + numbers(shape));
  };
  if (shape.ranks < 1) refuse("needs at least one rank (p >= 1)");
  if (shape.micro_batches < 1) refuse("needs at least one micro-batch (m >= 1)");
  if (shape.virtual_stages < 1) refuse("needs at least one stage per rank (v >= 1)");
  if (needs.one_stage_per_rank && shape.virtual_stages != 1) {
    refuse("takes one stage per rank (v = 1)");
  }
  if (needs.micro_batches_at_least_ranks && shape.micro_batches < shape.ranks) {
    refuse("needs at least as many micro-batches as ranks (m >= p)");
  }
  if (needs.micro_batches_multiple_of_ranks && shape.micro_batches % shape.ranks != 0) {
    refuse("needs the micro-batches to be a multiple of the ranks (m % p == 0)");
  }
}

// Appends a rank's compute actions with their communication lowered around them: a receive
// just before the compute that needs it, a send just after the compute that produces it.
class RankListWriter {
 public:
  RankListWriter(const PipelineShape& shape, int rank, std::vector<PipelineAction>& out)
      : shape_(shape), rank_(rank), out_(out) {}

  void forward(int stage, int micro_batch) {
    if (stage > 0 && remote(stage - 1)) add(Kind::kReceiveActivation, stage, micro_batch);
    add(Kind::kForward, stage, micro_batch);
    if (stage + 1 < shape_.stages() && remote(stage + 1)) {
      add(Kind::kSendActivation, stage, micro_batch);
    }
  }

  // `kind` is Backward or BackwardInput: the backwards the previous stage waits for.
  void backward(Kind kind, int stage, int micro_batch) {
    if (stage + 1 < shape_.stages() && remote(stage + 1)) {
      add(Kind::kReceiveGradient, stage, micro_batch);
    }
    add(kind, stage, micro_batch);
    if (stage > 0 && remote(stage - 1)) add(Kind::kSendGradient, stage, micro_batch);
  }

  void backward_weight(int stage, int micro_batch) {
    add(Kind::kBackwardWeight, stage, micro_batch);
  }

 private:
  bool remote(int stage) const { return shape_.rank_of_stage(stage) != rank_; }
  void add(Kind kind, int stage, int micro_batch) { out_.push_back({kind, stage, micro_batch}); }

  const PipelineShape& shape_;
  int rank_;
  std::vector<PipelineAction>& out_;
};

PipelineSchedule empty_schedule(std::string name, const PipelineShape& shape) {
  PipelineSchedule schedule;
  schedule.name = std::move(name);
  schedule.shape = shape;
  schedule.rank_actions.resize(static_cast<std::size_t>(shape.ranks));
  return schedule;
}

bool is_receive(Kind kind) {
  return kind == Kind::kReceiveActivation || kind == Kind::kReceiveGradient;
}
bool is_send(Kind kind) { return kind == Kind::kSendActivation || kind == Kind::kSendGradient; }
bool is_activation(Kind kind) {
  return kind == Kind::kSendActivation || kind == Kind::kReceiveActivation;
}

// The stage at the other end of a communication action.
int peer_stage(const PipelineAction& action) {
  const bool towards_next =
      action.kind == Kind::kSendActivation || action.kind == Kind::kReceiveGradient;
  return towards_next ? action.stage + 1 : action.stage - 1;
}

// The action on the peer rank that a communication action pairs with.
PipelineAction counterpart(const PipelineAction& action) {
  static const std::map<Kind, Kind> kPair = {{Kind::kSendActivation, Kind::kReceiveActivation},
                                             {Kind::kReceiveActivation, Kind::kSendActivation},
                                             {Kind::kSendGradient, Kind::kReceiveGradient},
                                             {Kind::kReceiveGradient, Kind::kSendGradient}};
  return {kPair.at(action.kind), peer_stage(action), action.micro_batch};
}

// A one-way message stream: (sending rank, receiving rank, activations or gradients).
using Channel = std::tuple<int, int, bool>;

Channel channel_of(const PipelineShape& shape, int rank, const PipelineAction& action) {
  const int peer = shape.rank_of_stage(peer_stage(action));
  return is_send(action.kind) ? Channel{rank, peer, is_activation(action.kind)}
                              : Channel{peer, rank, is_activation(action.kind)};
}

std::string ordinal(std::size_t index) {
  const std::size_t n = index + 1;
  const char* suffix = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  return std::to_string(n) + suffix;
}

std::string percent(double share) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * share);
  return text;
}

std::string at(int rank, const PipelineAction& action) {
  return "rank " + std::to_string(rank) + ", " + to_string(action);
}

// Checks that every action names a stage on its own rank and an existing micro-batch, and that
// communication has a peer stage on another rank: what the simulator needs to run at all.
void check_action_places(const PipelineSchedule& schedule) {
  const PipelineShape& shape = schedule.shape;
  if (shape.ranks < 1 || shape.micro_batches < 1 || shape.virtual_stages < 1) {
    throw Error("schedule '" + schedule.name + "' has an impossible shape: " + numbers(shape));
  }
  if (schedule.rank_actions.size() != static_cast<std::size_t>(shape.ranks)) {
    throw Error("schedule '" + schedule.name + "' has " +
                std::to_string(schedule.rank_actions.size()) + " rank lists for " +
                std::to_string(shape.ranks) + " ranks");
  }
  for (int rank = 0; rank < shape.ranks; ++rank) {
    for (const auto& action : schedule.rank_actions[static_cast<std::size_t>(rank)]) {
      auto refuse = [&](const std::string& what) { throw Error(at(rank, action) + ": " + what); };
      if (action.stage < 0 || action.stage >= shape.stages()) {
        refuse("no such stage (the schedule has " + std::to_string(shape.stages()) + ")");
      }
      if (action.micro_batch < 0 || action.micro_batch >= shape.micro_batches) {
        refuse("no such micro-batch (the schedule has " + std::to_string(shape.micro_batches) +
               ")");
      }
      if (shape.rank_of_stage(action.stage) != rank) {
        refuse("stage " + std::to_string(action.stage) + " lives on rank " +
               std::to_string(shape.rank_of_stage(action.stage)));
      }
      if (is_compute(action.kind)) continue;
      const int peer = peer_stage(action);
      if (peer < 0 || peer >= shape.stages()) {
        refuse(std::string("stage ") + std::to_string(action.stage) + " has no " +
               (peer < 0 ? "previous" : "next") + " stage to communicate with");
      }
      if (shape.rank_of_stage(peer) == rank) {
        refuse("stage " + std::to_string(peer) +
               " is on the same rank, which hands over without communication");
      }
    }
  }
}

// Where each action sits in its rank's list, by (kind, stage, micro-batch); -1 when absent.
class ActionIndex {
 public:
  explicit ActionIndex(const PipelineSchedule& schedule) : shape_(schedule.shape) {
    positions_.assign(static_cast<std::size_t>(kKindCount * shape_.stages() * shape_.micro_batches),
                      -1);
    for (int rank = 0; rank < shape_.ranks; ++rank) {
      const auto& actions = schedule.rank_actions[static_cast<std::size_t>(rank)];
      for (std::size_t i = 0; i < actions.size(); ++i) {
        int& slot = positions_[slot_of(actions[i])];
        if (slot >= 0) {
          throw Error(at(rank, actions[i]) + ": appears twice (positions " + std::to_string(slot) +
                      " and " + std::to_string(i) + " of the rank's list)");
        }
        slot = static_cast<int>(i);
      }
    }
  }

  int position(Kind kind, int stage, int micro_batch) const {
    return positions_[slot_of({kind, stage, micro_batch})];
  }
  bool has(Kind kind, int stage, int micro_batch) const {
    return position(kind, stage, micro_batch) >= 0;
  }

 private:
  std::size_t slot_of(const PipelineAction& action) const {
    return static_cast<std::size_t>(
        (static_cast<int>(action.kind) * shape_.stages() + action.stage) * shape_.micro_batches +
        action.micro_batch);
  }

  const PipelineShape& shape_;
  std::vector<int> positions_;
};

void check_compute_counts(const PipelineSchedule& schedule, const ActionIndex& index) {
  const PipelineShape& shape = schedule.shape;
  for (int stage = 0; stage < shape.stages(); ++stage) {
    const int rank = shape.rank_of_stage(stage);
    for (int mb = 0; mb < shape.micro_batches; ++mb) {
      auto refuse = [&](Kind kind, const std::string& what) {
        throw Error(at(rank, {kind, stage, mb}) + ": " + what);
      };
      if (!index.has(Kind::kForward, stage, mb)) refuse(Kind::kForward, "is missing");
      const bool full = index.has(Kind::kBackward, stage, mb);
      const bool input = index.has(Kind::kBackwardInput, stage, mb);
      const bool weight = index.has(Kind::kBackwardWeight, stage, mb);
      if (full && (input || weight)) {
        refuse(Kind::kBackward, "runs besides a split backward (BackwardInput/BackwardWeight)");
      }
      if (!full && !input && !weight) {
        refuse(Kind::kBackward, "is missing (neither Backward nor BackwardInput/BackwardWeight)");
      }
      if (input && !weight) refuse(Kind::kBackwardWeight, "is missing after its BackwardInput");
      if (weight && !input) refuse(Kind::kBackwardInput, "is missing before its BackwardWeight");
      if (input && index.position(Kind::kBackwardWeight, stage, mb) <
                       index.position(Kind::kBackwardInput, stage, mb)) {
        refuse(Kind::kBackwardWeight, "runs before its BackwardInput");
      }
    }
  }
}

// Every send has exactly one receive on the peer rank, and each stream is received in the order
// it was sent.
void check_message_order(const PipelineSchedule& schedule) {
  const PipelineShape& shape = schedule.shape;
  std::map<Channel, std::vector<PipelineAction>> sent;
  std::map<Channel, std::vector<PipelineAction>> received;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    for (const auto& action : schedule.rank_actions[static_cast<std::size_t>(rank)]) {
      if (is_compute(action.kind)) continue;
      auto& stream = is_send(action.kind) ? sent : received;
      stream[channel_of(shape, rank, action)].push_back(action);
    }
  }
  std::set<Channel> channels;
  for (const auto& [channel, actions] : sent) channels.insert(channel);
  for (const auto& [channel, actions] : received) channels.insert(channel);
  for (const auto& channel : channels) {
    const auto& [from, to, activations] = channel;
    const std::string what = activations ? "activation" : "gradient";
    const auto& sends = sent[channel];
    const auto& receives = received[channel];
    for (std::size_t i = 0; i < std::max(sends.size(), receives.size()); ++i) {
      if (i >= sends.size()) {
        throw Error(at(to, receives[i]) + ": receives without a send (rank " +
                    std::to_string(from) + " sends rank " + std::to_string(to) + " " +
                    std::to_string(sends.size()) + " " + what + "s, this is the " + ordinal(i) +
                    " receive)");
      }
      if (i >= receives.size()) {
        throw Error(at(from, sends[i]) + ": no receive on rank " + std::to_string(to) +
                    " matches this send (rank " + std::to_string(to) + " receives " +
                    std::to_string(receives.size()) + " " + what + "s, this is the " + ordinal(i) +
                    " send)");
      }
      if (counterpart(sends[i]) != receives[i]) {
        throw Error(at(to, receives[i]) + ": is the " + ordinal(i) + " " + what + " rank " +
                    std::to_string(to) + " receives from rank " + std::to_string(from) +
                    ", but rank " + std::to_string(from) + "'s " + ordinal(i) + " " + what +
                    " send is " + to_string(sends[i]) + ": sends and receives are out of order");
      }
    }
  }
}

// Forward before backward, and each compute after what it consumes: the previous stage's
// forward (next stage's backward) on the same rank, or a receive of it, whose matching send
// follows the producing compute on the peer rank.
void check_dependencies(const PipelineSchedule& schedule, const ActionIndex& index) {
  const PipelineShape& shape = schedule.shape;
  const int stages = shape.stages();
  for (int stage = 0; stage < stages; ++stage) {
    const int rank = shape.rank_of_stage(stage);
    for (int mb = 0; mb < shape.micro_batches; ++mb) {
      const Kind backward_kind =
          index.has(Kind::kBackward, stage, mb) ? Kind::kBackward : Kind::kBackwardInput;
      const int forward = index.position(Kind::kForward, stage, mb);
      const int backward = index.position(backward_kind, stage, mb);
      auto refuse = [&](Kind kind, int at_stage, const std::string& what) {
        throw Error(at(shape.rank_of_stage(at_stage), {kind, at_stage, mb}) + ": " + what);
      };
      if (backward < forward) {
        refuse(backward_kind, stage, "runs before " + to_string({Kind::kForward, stage, mb}));
      }
      // A compute on this stage that consumes what `producer` makes on a neighbouring stage.
      auto check_input = [&](Kind consumer, int consumer_position, Kind producer,
                             int producer_stage, Kind receive, Kind send) {
        const PipelineAction produced{producer, producer_stage, mb};
        const int produced_at = index.position(producer, producer_stage, mb);
        if (shape.rank_of_stage(producer_stage) == rank) {
          if (consumer_position < produced_at) {
            refuse(consumer, stage, "runs before " + to_string(produced));
          }
          return;
        }
        const int received_at = index.position(receive, stage, mb);
        if (received_at < 0) {
          refuse(consumer, stage, "has no " + to_string({receive, stage, mb}) + " before it");
        }
        if (consumer_position < received_at) {
          refuse(consumer, stage, "runs before " + to_string({receive, stage, mb}));
        }
        const int sent_at = index.position(send, producer_stage, mb);
        if (sent_at < 0) refuse(send, producer_stage, "is missing");
        if (sent_at < produced_at) {
          refuse(send, producer_stage, "runs before " + to_string(produced) + " produces it");
        }
      };
      if (stage > 0) {
        check_input(Kind::kForward, forward, Kind::kForward, stage - 1, Kind::kReceiveActivation,
                    Kind::kSendActivation);
      }
      if (stage + 1 < stages) {
        const Kind next_backward =
            index.has(Kind::kBackward, stage + 1, mb) ? Kind::kBackward : Kind::kBackwardInput;
        check_input(backward_kind, backward, next_backward, stage + 1, Kind::kReceiveGradient,
                    Kind::kSendGradient);
      }
    }
  }
}

}  // namespace

const char* action_kind_name(PipelineActionKind kind) {
  switch (kind) {
    case Kind::kForward:
      return "Forward";
    case Kind::kBackward:
      return "Backward";
    case Kind::kBackwardInput:
      return "BackwardInput";
    case Kind::kBackwardWeight:
      return "BackwardWeight";
    case Kind::kSendActivation:
      return "SendActivation";
    case Kind::kReceiveActivation:
      return "ReceiveActivation";
    case Kind::kSendGradient:
      return "SendGradient";
    case Kind::kReceiveGradient:
      return "ReceiveGradient";
  }
  return "?";
}

bool is_compute(PipelineActionKind kind) {
  return kind == Kind::kForward || kind == Kind::kBackward || kind == Kind::kBackwardInput ||
         kind == Kind::kBackwardWeight;
}

std::string to_string(const PipelineAction& action) {
  return std::string(action_kind_name(action.kind)) + "(stage " + std::to_string(action.stage) +
         ", micro-batch " + std::to_string(action.micro_batch) + ")";
}

PipelineSchedule gpipe_schedule(const PipelineShape& shape) {
  check_shape("gpipe", shape, {.micro_batches_at_least_ranks = false});
  PipelineSchedule schedule = empty_schedule("gpipe", shape);
  for (int rank = 0; rank < shape.ranks; ++rank) {
    RankListWriter writer(shape, rank, schedule.rank_actions[static_cast<std::size_t>(rank)]);
    for (int mb = 0; mb < shape.micro_batches; ++mb) writer.forward(rank, mb);
    for (int mb = 0; mb < shape.micro_batches; ++mb) writer.backward(Kind::kBackward, rank, mb);
  }
  return schedule;
}

PipelineSchedule one_forward_one_backward_schedule(const PipelineShape& shape) {
  check_shape("1f1b", shape, {});
  PipelineSchedule schedule = empty_schedule("1f1b", shape);
  const int m = shape.micro_batches;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    RankListWriter writer(shape, rank, schedule.rank_actions[static_cast<std::size_t>(rank)]);
    // Enough forwards in flight that the last stage's first backward reaches this rank just as
    // its warm-up ends.
    const int warmup = shape.ranks - 1 - rank;
    for (int mb = 0; mb < warmup; ++mb) writer.forward(rank, mb);
    for (int step = 0; step < m - warmup; ++step) {
      writer.forward(rank, warmup + step);
      writer.backward(Kind::kBackward, rank, step);
    }
    for (int mb = m - warmup; mb < m; ++mb) writer.backward(Kind::kBackward, rank, mb);
  }
  return schedule;
}

PipelineSchedule interleaved_schedule(const PipelineShape& shape) {
  check_shape("interleaved_1f1b", shape,
              {.one_stage_per_rank = false, .micro_batches_multiple_of_ranks = true});
  PipelineSchedule schedule = empty_schedule("interleaved_1f1b", shape);
  const int p = shape.ranks;
  const int v = shape.virtual_stages;
  const int total = shape.micro_batches * v;
  // The k-th forward (backward) of a rank: micro-batches advance p at a time through the
  // chunks (depth first), backwards through the chunks in reverse.
  auto micro_batch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward_chunk = [&](int k) { return (k % (p * v)) / p; };
  auto backward_chunk = [&](int k) { return v - 1 - (k % (p * v)) / p; };
  for (int rank = 0; rank < p; ++rank) {
    RankListWriter writer(shape, rank, schedule.rank_actions[static_cast<std::size_t>(rank)]);
    auto forward = [&](int k) { writer.forward(forward_chunk(k) * p + rank, micro_batch_of(k)); };
    auto backward = [&](int k) {
      writer.backward(Kind::kBackward, backward_chunk(k) * p + rank, micro_batch_of(k));
    };
    // Megatron-LM's warm-up: the first chunk round of every later rank, plus two steps per hop
    // for the first backward to travel back.
    const int warmup = std::min(2 * (p - 1 - rank) + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int step = 0; step < total - warmup; ++step) {
      forward(warmup + step);
      backward(step);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return schedule;
}

PipelineSchedule zero_bubble_schedule(const PipelineShape& shape) {
  check_shape("zero_bubble", shape, {});
  PipelineSchedule schedule = empty_schedule("zero_bubble", shape);
  const int m = shape.micro_batches;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    RankListWriter writer(shape, rank, schedule.rank_actions[static_cast<std::size_t>(rank)]);
    const int warmup = shape.ranks - 1 - rank;
    int next_weight = 0;
    for (int mb = 0; mb < warmup; ++mb) writer.forward(rank, mb);
    // Rank r would wait for input gradients during its first r steady steps in 1F1B; here it
    // spends that wait on later forwards and input gradients, and catches up on the deferred
    // weight gradients at the end, where 1F1B's cool-down bubble was.
    for (int step = 0; step < m - warmup; ++step) {
      writer.forward(rank, warmup + step);
      writer.backward(Kind::kBackwardInput, rank, step);
      if (step >= rank) writer.backward_weight(rank, next_weight++);
    }
    for (int mb = m - warmup; mb < m; ++mb) {
      writer.backward(Kind::kBackwardInput, rank, mb);
      writer.backward_weight(rank, next_weight++);
    }
    while (next_weight < m) writer.backward_weight(rank, next_weight++);
  }
  return schedule;
}

const std::vector<std::string>& pipeline_schedule_names() {
  static const std::vector<std::string> kNames = {"gpipe", "1f1b", "interleaved_1f1b",
                                                  "zero_bubble"};
  return kNames;
}

PipelineSchedule build_pipeline_schedule(std::string_view name, const PipelineShape& shape) {
  if (name == "gpipe") return gpipe_schedule(shape);
  if (name == "1f1b") return one_forward_one_backward_schedule(shape);
  if (name == "interleaved_1f1b") return interleaved_schedule(shape);
  if (name == "zero_bubble") return zero_bubble_schedule(shape);
  std::string known;
  for (const auto& each : pipeline_schedule_names()) known += (known.empty() ? "" : ", ") + each;
  throw Error("unknown pipeline schedule '" + std::string(name) + "' (known: " + known + ")");
}

void validate_schedule(const PipelineSchedule& schedule) {
  check_action_places(schedule);
  const ActionIndex index(schedule);
  check_compute_counts(schedule, index);
  check_message_order(schedule);
  check_dependencies(schedule, index);
}

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
          in_flight[channel_of(shape, rank, action)].push_back({action, start});
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
