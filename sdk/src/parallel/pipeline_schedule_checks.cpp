// validate_schedule: the checks a schedule passes before anything runs it (every action on its
// rank, every compute once, messages paired and in order, dependencies before their users).

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "schedule_messages.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {
namespace {

using namespace schedule_messages;

constexpr int kKindCount = 8;

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

// Checks that every action names a stage on its own rank and an existing micro-batch, and that
// communication has a peer stage on another rank: what the simulator needs to run at all.
void schedule_messages::check_action_places(const PipelineSchedule& schedule) {
  const PipelineShape& shape = schedule.shape;
  if (shape.ranks < 1 || shape.micro_batches < 1 || shape.virtual_stages < 1) {
    throw Error("schedule '" + schedule.name +
                "' has an impossible shape: " + shape_numbers(shape));
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

void validate_schedule(const PipelineSchedule& schedule) {
  check_action_places(schedule);
  const ActionIndex index(schedule);
  check_compute_counts(schedule, index);
  check_message_order(schedule);
  check_dependencies(schedule, index);
}

}  // namespace trainyard
