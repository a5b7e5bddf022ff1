#include "trainyard/parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <tuple>

#include "schedule_messages.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {

namespace {

using namespace schedule_messages;

struct ShapeNeeds {
  bool one_stage_per_rank = true;
  bool micro_batches_at_least_ranks = true;
  bool micro_batches_multiple_of_ranks = false;
};

void check_shape(std::string_view name, const PipelineShape& shape, const ShapeNeeds& needs) {
  auto refuse = [&](const std::string& what) {
    throw Error(std::string(name) + " schedule: " + what + ", got " + shape_numbers(shape));
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

std::vector<std::size_t> receives_to_post_before(const std::vector<PipelineAction>& actions,
                                                 std::size_t index) {
  std::vector<std::size_t> receives;
  if (index >= actions.size() || !is_compute(actions[index].kind)) return receives;
  for (std::size_t next = index + 1; next < actions.size(); ++next) {
    if (is_compute(actions[next].kind)) break;
    if (is_receive(actions[next].kind)) receives.push_back(next);
  }
  return receives;
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

namespace {

// One rank's list for ZB-V: its two stages (down the ranks, then back up) counted separately, so
// that each phase names only which stage computes; the construction runs as if there were at
// least 2p - 1 micro-batches, so that every phase is whole, and writes none of the actions of
// micro-batches past the step's.
class VRankList {
 public:
  VRankList(const PipelineShape& shape, int rank, std::vector<PipelineAction>& out)
      : writer_(shape, rank, out),
        stages_{rank, shape.stages() - 1 - rank},
        micro_batches_(shape.micro_batches) {}

  void forward(int chunk) {
    const int mb = counts_[chunk].forward++;
    if (mb < micro_batches_) writer_.forward(stages_[chunk], mb);
  }
  void input_gradient(int chunk) {
    const int mb = counts_[chunk].input++;
    if (mb < micro_batches_) writer_.backward(Kind::kBackwardInput, stages_[chunk], mb);
  }
  void weight_gradient(int chunk) {
    const int mb = counts_[chunk].weight++;
    if (mb < micro_batches_) writer_.backward_weight(stages_[chunk], mb);
  }
  int forwards(int chunk) const { return counts_[chunk].forward; }
  bool weights_pending(int chunk) const { return counts_[chunk].weight < counts_[chunk].input; }

 private:
  struct Counts {
    int forward = 0;
    int input = 0;
    int weight = 0;
  };
  RankListWriter writer_;
  int stages_[2];
  Counts counts_[2];
  int micro_batches_;
};

}  // namespace

PipelineSchedule zero_bubble_v_schedule(const PipelineShape& requested) {
  PipelineShape shape = requested;
  shape.placement = StagePlacement::kV;
  check_shape("zero_bubble_v", shape,
              {.one_stage_per_rank = false, .micro_batches_at_least_ranks = false});
  if (shape.virtual_stages != 2) {
    throw Error("zero_bubble_v schedule: takes two stages per rank (v = 2), got " +
                shape_numbers(requested));
  }
  PipelineSchedule schedule = empty_schedule("zero_bubble_v", shape);
  const int p = shape.ranks;
  const int planned = std::max(2 * p - 1, shape.micro_batches);
  for (int rank = 0; rank < p; ++rank) {
    VRankList list(shape, rank, schedule.rank_actions[static_cast<std::size_t>(rank)]);
    // Warm-up: the down stage fills the ranks below; then the up stage's forwards start as the
    // first micro-batches come back, and its first backwards follow at once.
    for (int k = 0; k < 2 * (p - rank) - 1; ++k) list.forward(0);
    for (int k = 0; k < rank; ++k) {
      list.forward(1);
      list.forward(0);
    }
    for (int k = 0; k < p - rank; ++k) {
      list.forward(1);
      list.input_gradient(1);
      list.weight_gradient(1);
    }
    // Steady: each stage's forward, input gradient and weight gradient in turn.
    while (list.forwards(1) < list.forwards(0) || list.forwards(0) < planned) {
      if (list.forwards(0) < planned) list.forward(0);
      list.input_gradient(0);
      list.weight_gradient(0);
      list.forward(1);
      list.input_gradient(1);
      list.weight_gradient(1);
    }
    // Cool-down: the input gradients the ranks below wait for first, the weight gradients last.
    for (int k = 0; k < rank; ++k) {
      list.input_gradient(0);
      list.input_gradient(1);
    }
    for (int k = 0; k < p - rank; ++k) {
      list.input_gradient(0);
      list.weight_gradient(0);
    }
    while (list.weights_pending(1)) list.weight_gradient(1);
    while (list.weights_pending(0)) list.weight_gradient(0);
  }
  return schedule;
}

const std::vector<std::string>& pipeline_schedule_names() {
  static const std::vector<std::string> kNames = {"gpipe", "1f1b", "interleaved_1f1b",
                                                  "zero_bubble", "zero_bubble_v"};
  return kNames;
}

PipelineSchedule build_pipeline_schedule(std::string_view name, const PipelineShape& shape) {
  if (name == "gpipe") return gpipe_schedule(shape);
  if (name == "1f1b") return one_forward_one_backward_schedule(shape);
  if (name == "interleaved_1f1b") return interleaved_schedule(shape);
  if (name == "zero_bubble") return zero_bubble_schedule(shape);
  if (name == "zero_bubble_v") return zero_bubble_v_schedule(shape);
  std::string known;
  for (const auto& each : pipeline_schedule_names()) known += (known.empty() ? "" : ", ") + each;
  throw Error("unknown pipeline schedule '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace trainyard
