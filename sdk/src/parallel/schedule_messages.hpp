#pragma once
// What the schedule checks and the simulator share about a schedule's communication actions:
// which peer each pairs with and on which one-way message stream it travels. Internal to the SDK.

#include <map>
#include <string>
#include <tuple>

#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard::schedule_messages {

using Kind = PipelineActionKind;

// "p = 2, m = 4, v = 1": a shape in the literature's letters, for errors.
inline std::string shape_numbers(const PipelineShape& shape) {
  return "p = " + std::to_string(shape.ranks) + ", m = " + std::to_string(shape.micro_batches) +
         ", v = " + std::to_string(shape.virtual_stages) +
         (shape.placement == StagePlacement::kV ? " (V placement)" : "");
}

inline bool is_receive(Kind kind) {
  return kind == Kind::kReceiveActivation || kind == Kind::kReceiveGradient;
}
inline bool is_send(Kind kind) {
  return kind == Kind::kSendActivation || kind == Kind::kSendGradient;
}
inline bool is_activation(Kind kind) {
  return kind == Kind::kSendActivation || kind == Kind::kReceiveActivation;
}

// The stage at the other end of a communication action.
inline int peer_stage(const PipelineAction& action) {
  const bool towards_next =
      action.kind == Kind::kSendActivation || action.kind == Kind::kReceiveGradient;
  return towards_next ? action.stage + 1 : action.stage - 1;
}

// The action on the peer rank that a communication action pairs with.
inline PipelineAction counterpart(const PipelineAction& action) {
  static const std::map<Kind, Kind> kPair = {{Kind::kSendActivation, Kind::kReceiveActivation},
                                             {Kind::kReceiveActivation, Kind::kSendActivation},
                                             {Kind::kSendGradient, Kind::kReceiveGradient},
                                             {Kind::kReceiveGradient, Kind::kSendGradient}};
  return {kPair.at(action.kind), peer_stage(action), action.micro_batch};
}

// A one-way message stream: (sending rank, receiving rank, activations or gradients).
using Channel = std::tuple<int, int, bool>;

inline Channel channel_of(const PipelineShape& shape, int rank, const PipelineAction& action) {
  const int peer = shape.rank_of_stage(peer_stage(action));
  return is_send(action.kind) ? Channel{rank, peer, is_activation(action.kind)}
                              : Channel{peer, rank, is_activation(action.kind)};
}

// "rank 1, Forward(stage 1, micro-batch 3)": where an action sits, for errors.
inline std::string at(int rank, const PipelineAction& action) {
  return "rank " + std::to_string(rank) + ", " + to_string(action);
}

// Checks that every action names a stage on its own rank and an existing micro-batch, and that
// communication has a peer stage on another rank: what the simulator needs to run at all.
// Throws Error naming the first action that does not.
void check_action_places(const PipelineSchedule& schedule);

}  // namespace trainyard::schedule_messages
