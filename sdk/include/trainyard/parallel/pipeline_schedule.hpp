#pragma once
// Pipeline schedules as explicit per-rank action lists (in the manner of
// torch.distributed.pipelining): built for GPipe, 1F1B, interleaved 1F1B and zero bubble (ZB-H1),
// validated, and simulated with a cost model to measure bubbles, activation memory and
// deadlocks before a pipeline strategy executes them. Pure logic: no tensors, no communication.

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard {

enum class PipelineActionKind {
  kForward,
  kBackward,           // full backward: input and weight gradients
  kBackwardInput,      // I: the gradient of the stage's input, what the previous stage waits for
  kBackwardWeight,     // W: the gradient of the stage's weights, which nothing downstream waits for
  kSendActivation,     // the output of Forward(stage) to stage + 1
  kReceiveActivation,  // the input of Forward(stage) from stage - 1
  kSendGradient,       // the input gradient of Backward/BackwardInput(stage) to stage - 1
  kReceiveGradient,    // the output gradient Backward/BackwardInput(stage) needs, from stage + 1
};

const char* action_kind_name(PipelineActionKind kind);  // "Forward", "ReceiveGradient", ...
bool is_compute(PipelineActionKind kind);               // Forward and the three backwards

// One step of a rank's list. Communication actions name the stage on this rank; the peer is
// stage + 1 for activation sends and gradient receives, stage - 1 for the others.
struct PipelineAction {
  PipelineActionKind kind = PipelineActionKind::kForward;
  int stage = 0;
  int micro_batch = 0;
  bool operator==(const PipelineAction&) const = default;
};

// "Forward(stage 1, micro-batch 3)".
std::string to_string(const PipelineAction& action);

// The positions of the receives a rank posts before it runs the compute action at `index` of
// its list `actions`: those listed after it up to the next compute action, whose input they
// carry. Their transfers then complete while this action computes, rather than starting when
// the next one asks for them; each kind of receive runs at most one compute action ahead of the
// list, so at most one more of its buffers is allocated at a time. Empty unless `index` is a
// compute action.
std::vector<std::size_t> receives_to_post_before(const std::vector<PipelineAction>& actions,
                                                 std::size_t index);

// Where a pipeline's stages live. Looped: stage s on rank s % p, as Megatron-LM's and PyTorch's
// interleaved schedules place chunks. V: the stages go down the ranks and back up, so rank r holds
// stages r and 2p - 1 - r (and the pattern repeats for more chunks); the first and the last
// stage share rank 0, and the middle two rank p - 1, where they hand over without communication
// (ZB-V's placement, Qi et al. 2024).
enum class StagePlacement { kLooped, kV };

// p ranks, each holding v stages (p * v in all), m micro-batches per step.
struct PipelineShape {
  int ranks = 1;
  int micro_batches = 1;
  int virtual_stages = 1;
  StagePlacement placement = StagePlacement::kLooped;
  int stages() const { return ranks * virtual_stages; }
  int rank_of_stage(int stage) const {
    const int within = stage % ranks;
    const bool coming_back = placement == StagePlacement::kV && (stage / ranks) % 2 == 1;
    return coming_back ? ranks - 1 - within : within;
  }
};

// Per rank, the actions it executes in order. Messages between two ranks travel in order, one
// stream per direction and kind: a rank receives activations (gradients) from a peer in the
// order that peer sends them. Stages on the same rank hand over without communication.
struct PipelineSchedule {
  std::string name;
  PipelineShape shape;
  std::vector<std::vector<PipelineAction>> rank_actions;
};

// The builders. Each throws Error naming the numbers for shapes it cannot schedule: ranks or
// micro-batches < 1, virtual stages > 1 for the one-stage-per-rank schedules, fewer
// micro-batches than ranks (1F1B, zero bubble), micro-batches not a multiple of the ranks
// (interleaved).
//
// GPipe: every forward, then every backward.
PipelineSchedule gpipe_schedule(const PipelineShape& shape);
// 1F1B (PipeDream-Flush): rank r runs p - 1 - r forwards, then alternates one forward and one
// backward, then the remaining backwards; it holds at most p - r micro-batches' activations.
PipelineSchedule one_forward_one_backward_schedule(const PipelineShape& shape);
// Megatron-LM's interleaved 1F1B over v chunks per rank: forwards go through the chunks p
// micro-batches at a time (depth first), warm-up 2 (p - 1 - r) + (v - 1) p forwards, the bubble
// shrinks to (p - 1) / (v m + p - 1) of the step.
PipelineSchedule interleaved_schedule(const PipelineShape& shape);
// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B with each backward split into
// BackwardInput, on the critical path, and BackwardWeight, deferred on rank r for r steps so
// that it fills the bubble; at most p micro-batches in flight per rank, as 1F1B's first rank.
PipelineSchedule zero_bubble_schedule(const PipelineShape& shape);

// ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"; PyTorch's
// ScheduleZBVZeroBubble): two stages per rank in the V placement, each backward split into I and
// W. Rank r warms up with 2 (p - r) - 1 forwards of its first stage, then r forwards alternating
// between its stages, then p - r rounds of its second stage's F, I, W; the steady phase runs each
// stage's F, I and W in turn; the cool-down drains the input gradients first and the deferred
// weight gradients last. With F = I = W its bubble vanishes, at 1F1B's peak activation memory:
// rank 0 holds at most 2p half-model (stage, micro-batch) activations, p whole-model ones.
// Needs v = 2 and m >= p; the shape's placement is set to V.
PipelineSchedule zero_bubble_v_schedule(const PipelineShape& shape);

// The schedules by command-line name: "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble",
// "zero_bubble_v".
const std::vector<std::string>& pipeline_schedule_names();
PipelineSchedule build_pipeline_schedule(std::string_view name, const PipelineShape& shape);

// A schedule written out, one line per rank holding its actions in order, comma-separated, each
// as torch.distributed.pipelining writes an action: <stage><kind><micro-batch> with kind F, B
// (a full backward), I (input gradient), W (weight gradient), SEND_F, RECV_F, SEND_B or RECV_B,
// e.g. "0F1" or "1SEND_B0". parse_schedule_csv skips blank lines and lines starting with '#'. The
// shape follows from the actions: ranks = lines, stages = the largest stage + 1 (a multiple of
// the ranks), micro-batches = the largest + 1, and the placement is the one every action's stage
// agrees with (looped, else V). It throws Error naming the line and the entry that does not
// read, or a stage on a rank neither placement puts it on; what the actions do is
// validate_schedule's to check.
PipelineSchedule parse_schedule_csv(std::string_view text, const std::string& name);
// parse_schedule_csv of `file`'s text, named by its path; throws Error when it cannot be read.
PipelineSchedule read_schedule_file(const std::filesystem::path& file);
std::string format_schedule_csv(const PipelineSchedule& schedule);

// Checks that `schedule` computes one training step: per stage and micro-batch one Forward, and
// one Backward or one BackwardInput and one BackwardWeight (W after I), on the stage's rank;
// backward after forward; a forward after the previous stage's forward (on the same rank, or
// received after the peer sent it), a backward after the next stage's; every communication
// action placed after the compute that produces it or before the compute that needs it, with
// exactly one matching action on the peer rank, in the same order. Throws Error naming the
// rank, the action and what is wrong.
void validate_schedule(const PipelineSchedule& schedule);

// Durations in whole time units (so that a timeline has one column per unit). A full backward
// costs I + W unless set.
struct PipelineCosts {
  int forward = 1;
  int backward_input = 1;
  int backward_weight = 1;
  std::optional<int> backward;
  int full_backward() const { return backward ? *backward : backward_input + backward_weight; }
  int duration(PipelineActionKind kind) const;  // 0 for communication
};

struct TimedAction {
  PipelineAction action;
  int start = 0;
  int end = 0;
};

struct RankSimulation {
  std::vector<TimedAction> actions;  // the rank's list, in order, with times
  int busy = 0;                      // time spent computing
  int idle = 0;                      // the rest of the step: makespan - busy
  // The most (stage, micro-batch) pairs on this rank whose forward has run and whose backward
  // has not completed (Backward, or BackwardWeight: the weight gradient still needs the
  // stage's inputs): the activations the rank holds at its peak, in micro-batches.
  int peak_held_micro_batches = 0;
  double idle_share() const;  // idle / (busy + idle)
};

struct PipelineSimulation {
  PipelineCosts costs;
  int makespan = 0;
  std::vector<RankSimulation> ranks;
  double mean_idle_share() const;  // averaged over ranks
};

// Runs every rank's list in order: an action starts when its rank is free and, for a receive,
// when the matching send has run; communication takes no time. Throws Error when a receive
// gets another message than it names, or on deadlock (no rank can progress), naming each
// blocked rank's action.
PipelineSimulation simulate_schedule(const PipelineSchedule& schedule,
                                     const PipelineCosts& costs = {});
// The same with each message between ranks arriving `transfer` time units after its send (a
// stage handed over on its own rank takes none): what a link's latency and bytes add to the
// schedule's makespan, where a receive is on its critical path.
PipelineSimulation simulate_schedule(const PipelineSchedule& schedule, const PipelineCosts& costs,
                                     int transfer);

// The idle share the literature gives for a schedule (Narayanan et al. 2021; Qi et al. 2023).
struct IdleShareFormula {
  std::string formula;  // "(p-1)/(m+p-1)"
  double value = 0;
  bool upper_bound = false;  // the simulated share may be lower (interleaved)
};
IdleShareFormula idle_share_formula(const PipelineSchedule& schedule, const PipelineCosts& costs);

// One row per rank, one column per time unit: F3 / B3 / I3 / W3 with the micro-batch (and the
// stage in front, 2F3, when ranks hold several stages), '.' for idle; then each rank's idle
// share and the formula's value.
std::string format_timeline(const PipelineSchedule& schedule, const PipelineSimulation& simulation);

}  // namespace trainyard
