#include "trainyard/parallel/pipeline_schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "test_support.hpp"

namespace trainyard::testing {
namespace {

using Kind = PipelineActionKind;

struct GridPoint {
  std::string name;
  PipelineShape shape;
};

// p in {2, 4}, m in {p, 2p, 8}, v = 2 for interleaved (whose v = 1 is 1F1B with a longer
// warm-up) and ZB-V (which takes two) and 1 for the others.
std::vector<GridPoint> grid() {
  std::vector<GridPoint> points;
  for (const auto& name : pipeline_schedule_names()) {
    const int v = name == "interleaved_1f1b" || name == "zero_bubble_v" ? 2 : 1;
    for (int p : {2, 4}) {
      for (int m : {p, 2 * p, 8}) {
        if (m == 2 * p && m == 8) continue;  // p = 4: 2p is 8
        points.push_back({name, {p, m, v}});
      }
    }
  }
  return points;
}

std::string name_of(const GridPoint& point) {
  std::ostringstream out;
  out << point.name << " p=" << point.shape.ranks << " m=" << point.shape.micro_batches
      << " v=" << point.shape.virtual_stages;
  return out.str();
}

int total_idle(const PipelineSimulation& simulation) {
  int idle = 0;
  for (const auto& rank : simulation.ranks) idle += rank.idle;
  return idle;
}

// Removes `action` from `rank`'s list (which must hold it).
void remove_action(PipelineSchedule& schedule, int rank, const PipelineAction& action) {
  auto& actions = schedule.rank_actions[static_cast<std::size_t>(rank)];
  auto found = std::find(actions.begin(), actions.end(), action);
  ASSERT_NE(found, actions.end()) << to_string(action);
  actions.erase(found);
}

// Moves `action` to just after `anchor` on `rank`.
void move_after(PipelineSchedule& schedule, int rank, const PipelineAction& action,
                const PipelineAction& anchor) {
  remove_action(schedule, rank, action);
  auto& actions = schedule.rank_actions[static_cast<std::size_t>(rank)];
  auto found = std::find(actions.begin(), actions.end(), anchor);
  ASSERT_NE(found, actions.end()) << to_string(anchor);
  actions.insert(found + 1, action);
}

TEST(PipelineScheduleTest, EveryScheduleValidatesAndSimulatesOnTheGrid) {
  for (const auto& point : grid()) {
    SCOPED_TRACE(name_of(point));
    const PipelineSchedule schedule = build_pipeline_schedule(point.name, point.shape);
    ASSERT_EQ(schedule.rank_actions.size(), static_cast<std::size_t>(point.shape.ranks));
    EXPECT_NO_THROW(validate_schedule(schedule));
    PipelineSimulation simulation;
    ASSERT_NO_THROW(simulation = simulate_schedule(schedule));
    ASSERT_EQ(simulation.ranks.size(), static_cast<std::size_t>(point.shape.ranks));
    const PipelineCosts costs;
    // Every rank computes m forwards and m full backwards per stage it holds.
    const int work = point.shape.virtual_stages * point.shape.micro_batches *
                     (costs.forward + costs.full_backward());
    for (std::size_t rank = 0; rank < simulation.ranks.size(); ++rank) {
      const RankSimulation& result = simulation.ranks[rank];
      EXPECT_EQ(result.busy, work) << "rank " << rank;
      EXPECT_EQ(result.busy + result.idle, simulation.makespan) << "rank " << rank;
      EXPECT_EQ(result.actions.size(), schedule.rank_actions[rank].size());
      int previous_end = 0;
      for (const auto& timed : result.actions) {
        EXPECT_GE(timed.start, previous_end) << to_string(timed.action);
        EXPECT_EQ(timed.end - timed.start, costs.duration(timed.action.kind));
        previous_end = timed.end;
      }
    }
  }
}

TEST(PipelineScheduleTest, GPipeAndOneForwardOneBackwardIdleShareIsExactlyTheFormula) {
  for (const auto& point : grid()) {
    if (point.name != "gpipe" && point.name != "1f1b") continue;
    SCOPED_TRACE(name_of(point));
    const PipelineSchedule schedule = build_pipeline_schedule(point.name, point.shape);
    const PipelineSimulation simulation = simulate_schedule(schedule);
    const int p = point.shape.ranks;
    const int m = point.shape.micro_batches;
    for (std::size_t rank = 0; rank < simulation.ranks.size(); ++rank) {
      const RankSimulation& result = simulation.ranks[rank];
      // idle / (busy + idle) == (p-1) / (m+p-1), in integers.
      EXPECT_EQ(result.idle * (m + p - 1), (p - 1) * (result.busy + result.idle))
          << "rank " << rank << " idle " << result.idle << " of " << simulation.makespan;
    }
    EXPECT_DOUBLE_EQ(simulation.mean_idle_share(), static_cast<double>(p - 1) / (m + p - 1));
    EXPECT_DOUBLE_EQ(idle_share_formula(schedule, {}).value,
                     static_cast<double>(p - 1) / (m + p - 1));
  }
}

TEST(PipelineScheduleTest, InterleavedIdleShareIsAtMostTheFormulaAndBelowOneForwardOneBackward) {
  for (const auto& point : grid()) {
    if (point.name != "interleaved_1f1b") continue;
    SCOPED_TRACE(name_of(point));
    const int p = point.shape.ranks;
    const int m = point.shape.micro_batches;
    const int v = point.shape.virtual_stages;
    const PipelineSimulation simulation =
        simulate_schedule(build_pipeline_schedule(point.name, point.shape));
    const double bound = static_cast<double>(p - 1) / (v * m + p - 1);
    EXPECT_LE(simulation.mean_idle_share(), bound + 1e-12);
    const PipelineSimulation plain = simulate_schedule(one_forward_one_backward_schedule({p, m}));
    EXPECT_LT(simulation.mean_idle_share(), plain.mean_idle_share());
  }
}

// ZB-H1's bubble is (p-1)(F+I-W) per rank against 1F1B's (p-1)(F+I+W): a third with equal
// costs. The shares are not in that ratio (the step shortens with the bubble): for p = 4,
// m = 8 they are 3/27 and 9/33.
TEST(PipelineScheduleTest, ZeroBubbleIdleTimeIsAtMostAThirdOfOneForwardOneBackwards) {
  for (const auto& point : grid()) {
    if (point.name != "zero_bubble") continue;
    SCOPED_TRACE(name_of(point));
    const PipelineSchedule schedule = build_pipeline_schedule(point.name, point.shape);
    const PipelineSimulation zero_bubble = simulate_schedule(schedule);
    const PipelineSimulation plain =
        simulate_schedule(one_forward_one_backward_schedule(point.shape));
    EXPECT_LE(3 * total_idle(zero_bubble), total_idle(plain));
    EXPECT_LT(zero_bubble.mean_idle_share(), plain.mean_idle_share());
    EXPECT_DOUBLE_EQ(zero_bubble.mean_idle_share(), idle_share_formula(schedule, {}).value);
    for (std::size_t rank = 0; rank < zero_bubble.ranks.size(); ++rank) {
      // The memory of 1F1B's first rank, on every rank.
      EXPECT_LE(zero_bubble.ranks[rank].peak_held_micro_batches, point.shape.ranks)
          << "rank " << rank;
    }
  }
}

// ZB-V: rank r holds stages r and 2p - 1 - r; the first and last stage share rank 0 and the
// middle two rank p - 1, which hand over without communication.
TEST(PipelineScheduleTest, ZeroBubbleVPlacesTwoStagesPerRankInAV) {
  const PipelineSchedule schedule = zero_bubble_v_schedule({4, 8, 2});
  EXPECT_EQ(schedule.shape.placement, StagePlacement::kV);
  const std::vector<int> ranks = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int stage = 0; stage < 8; ++stage) {
    EXPECT_EQ(schedule.shape.rank_of_stage(stage), ranks[static_cast<std::size_t>(stage)]);
  }
  for (std::size_t rank = 0; rank < 4; ++rank) {
    for (const PipelineAction& action : schedule.rank_actions[rank]) {
      EXPECT_EQ(schedule.shape.rank_of_stage(action.stage), static_cast<int>(rank))
          << to_string(action);
      EXPECT_NE(action.kind, Kind::kBackward) << "every backward is split";
      // Rank 3's stages 3 and 4 hand over; rank 0's stage 7 has no next stage.
      if (rank == 3 && action.stage == 3) {
        EXPECT_NE(action.kind, Kind::kSendActivation);
      }
      if (rank == 3 && action.stage == 4) {
        EXPECT_NE(action.kind, Kind::kReceiveActivation);
      }
    }
  }
  // The looped placement of the same numbers puts stage 4 on rank 0.
  EXPECT_EQ((PipelineShape{4, 8, 2}).rank_of_stage(4), 0);
}

// With equal costs the only idle time is the ramp: p - 1 forwards before the last rank's first
// stage starts, and as long after the first rank's last input gradient; the formula gives it
// exactly, and it is below ZB-H1's and interleaved 1F1B's. Each rank holds at most 2p
// (stage, micro-batch) activations of stages half the size of 1F1B's: 1F1B's first rank's peak.
// Every m from 1 builds and runs (fewer micro-batches than ranks, too).
TEST(PipelineScheduleTest, ZeroBubbleVIdlesOnlyOnItsRampAtOneForwardOneBackwardsMemory) {
  for (int p : {1, 2, 3, 4}) {
    for (int m = 1; m <= 12; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const PipelineSchedule schedule = zero_bubble_v_schedule({p, m, 2});
      ASSERT_NO_THROW(validate_schedule(schedule));
      const PipelineSimulation simulation = simulate_schedule(schedule);
      for (const RankSimulation& rank : simulation.ranks) {
        EXPECT_LE(rank.peak_held_micro_batches, 2 * p);
        if (m >= 2 * p - 1) {
          EXPECT_EQ(rank.idle, p - 1);
        }
      }
      if (m < 2 * p - 1) continue;
      EXPECT_DOUBLE_EQ(simulation.mean_idle_share(), idle_share_formula(schedule, {}).value);
      if (p == 1 || m % p != 0) continue;
      EXPECT_LT(simulation.mean_idle_share(),
                simulate_schedule(zero_bubble_schedule({p, m})).mean_idle_share());
      EXPECT_LT(simulation.mean_idle_share(),
                simulate_schedule(interleaved_schedule({p, m, 2})).mean_idle_share());
    }
  }
  // Where the input gradient costs more than the forward, the ramp is p - 1 of them.
  PipelineCosts costs;
  costs.backward_input = 2;
  const PipelineSchedule schedule = zero_bubble_v_schedule({4, 12, 2});
  EXPECT_DOUBLE_EQ(simulate_schedule(schedule, costs).mean_idle_share(),
                   idle_share_formula(schedule, costs).value);
}

TEST(PipelineScheduleTest, ZeroBubbleSplitsEveryBackward) {
  const PipelineSchedule schedule = zero_bubble_schedule({4, 8});
  for (const auto& actions : schedule.rank_actions) {
    EXPECT_EQ(std::count_if(actions.begin(), actions.end(),
                            [](const auto& a) { return a.kind == Kind::kBackward; }),
              0);
    EXPECT_EQ(std::count_if(actions.begin(), actions.end(),
                            [](const auto& a) { return a.kind == Kind::kBackwardWeight; }),
              8);
  }
}

TEST(PipelineScheduleTest, OneForwardOneBackwardHoldsAtMostPMicroBatchesAndGPipeHoldsM) {
  for (const auto& point : grid()) {
    if (point.name != "gpipe" && point.name != "1f1b") continue;
    SCOPED_TRACE(name_of(point));
    const PipelineSimulation simulation =
        simulate_schedule(build_pipeline_schedule(point.name, point.shape));
    const int p = point.shape.ranks;
    const int m = point.shape.micro_batches;
    for (int rank = 0; rank < p; ++rank) {
      const int peak = simulation.ranks[static_cast<std::size_t>(rank)].peak_held_micro_batches;
      EXPECT_EQ(peak, point.name == "gpipe" ? m : p - rank) << "rank " << rank;
    }
  }
}

TEST(PipelineScheduleTest, CommunicationIsLoweredAroundTheComputeItServes) {
  const PipelineSchedule schedule = one_forward_one_backward_schedule({2, 2});
  const std::vector<PipelineAction> rank0 = {
      {Kind::kForward, 0, 0},         {Kind::kSendActivation, 0, 0},  {Kind::kForward, 0, 1},
      {Kind::kSendActivation, 0, 1},  {Kind::kReceiveGradient, 0, 0}, {Kind::kBackward, 0, 0},
      {Kind::kReceiveGradient, 0, 1}, {Kind::kBackward, 0, 1}};
  const std::vector<PipelineAction> rank1 = {
      {Kind::kReceiveActivation, 1, 0}, {Kind::kForward, 1, 0},           {Kind::kBackward, 1, 0},
      {Kind::kSendGradient, 1, 0},      {Kind::kReceiveActivation, 1, 1}, {Kind::kForward, 1, 1},
      {Kind::kBackward, 1, 1},          {Kind::kSendGradient, 1, 1}};
  EXPECT_EQ(schedule.rank_actions[0], rank0);
  EXPECT_EQ(schedule.rank_actions[1], rank1);
}

// A stage posts the receives its next compute action needs before it runs the current one, so
// that the transfer overlaps compute: in 1F1B's list for {2, 2} above, rank 1 posts the
// activation of micro-batch 1 before Backward(1, 0), and rank 0 the gradient of micro-batch 0
// before Forward(0, 1).
TEST(PipelineScheduleTest, ReceivesArePostedOneComputeActionAheadOfTheComputeTheyFeed) {
  const PipelineSchedule small = one_forward_one_backward_schedule({2, 2});
  const auto& rank0 = small.rank_actions[0];
  const auto& rank1 = small.rank_actions[1];
  EXPECT_EQ(receives_to_post_before(rank1, 2), std::vector<std::size_t>{4});  // before B(1, 0)
  EXPECT_TRUE(receives_to_post_before(rank1, 1).empty());  // F(1, 0): B(1, 0) needs none
  EXPECT_TRUE(receives_to_post_before(rank1, 4).empty());  // a receive is not compute
  EXPECT_EQ(receives_to_post_before(rank0, 2), std::vector<std::size_t>{4});  // before F(0, 1)
  EXPECT_EQ(receives_to_post_before(rank0, 5), std::vector<std::size_t>{6});  // before B(0, 0)
  EXPECT_TRUE(receives_to_post_before(rank0, 7).empty());                     // the last action

  // On the whole grid: a receive listed after a compute action is posted exactly once, before
  // the last compute action listed ahead of it (one compute action early, never more); the
  // receives listed before a rank's first compute action are posted where they stand.
  for (const GridPoint& point : grid()) {
    const PipelineSchedule schedule = build_pipeline_schedule(point.name, point.shape);
    for (std::size_t rank = 0; rank < schedule.rank_actions.size(); ++rank) {
      const auto& actions = schedule.rank_actions[rank];
      std::vector<int> posted_before(actions.size(), -1);
      for (std::size_t i = 0; i < actions.size(); ++i) {
        for (std::size_t receive : receives_to_post_before(actions, i)) {
          ASSERT_EQ(posted_before[receive], -1) << name_of(point) << " rank " << rank;
          posted_before[receive] = static_cast<int>(i);
        }
      }
      int last_compute = -1;
      for (std::size_t i = 0; i < actions.size(); ++i) {
        if (is_compute(actions[i].kind)) last_compute = static_cast<int>(i);
        const bool receive = actions[i].kind == Kind::kReceiveActivation ||
                             actions[i].kind == Kind::kReceiveGradient;
        EXPECT_EQ(posted_before[i], receive ? last_compute : -1)
            << name_of(point) << " rank " << rank << " " << to_string(actions[i]);
      }
    }
  }
}

TEST(PipelineScheduleTest, InterleavedPlacesStagesLoopedAndHandsOverLocallyOnOneRank) {
  const PipelineSchedule looped = interleaved_schedule({2, 4, 2});
  for (int rank = 0; rank < 2; ++rank) {
    for (const auto& action : looped.rank_actions[static_cast<std::size_t>(rank)]) {
      EXPECT_EQ(action.stage % 2, rank) << to_string(action);
    }
  }
  // One rank holding every stage: no communication at all, and still a valid schedule.
  const PipelineSchedule single = interleaved_schedule({1, 3, 3});
  for (const auto& action : single.rank_actions[0]) EXPECT_TRUE(is_compute(action.kind));
  EXPECT_NO_THROW(validate_schedule(single));
  EXPECT_EQ(simulate_schedule(single).ranks[0].idle, 0);
}

TEST(PipelineScheduleTest, ValidationRefusesAMissingBackward) {
  PipelineSchedule schedule = one_forward_one_backward_schedule({2, 4});
  remove_action(schedule, 1, {Kind::kBackward, 1, 2});
  EXPECT_EQ(error_of([&] { validate_schedule(schedule); }),
            "rank 1, Backward(stage 1, micro-batch 2): is missing (neither Backward nor "
            "BackwardInput/BackwardWeight)");
}

TEST(PipelineScheduleTest, SwappedSendOrderIsRefusedByValidationAndSimulation) {
  PipelineSchedule schedule = gpipe_schedule({2, 4});
  move_after(schedule, 0, {Kind::kSendActivation, 0, 1}, {Kind::kSendActivation, 0, 2});
  EXPECT_EQ(error_of([&] { validate_schedule(schedule); }),
            "rank 1, ReceiveActivation(stage 1, micro-batch 1): is the 2nd activation rank 1 "
            "receives from rank 0, but rank 0's 2nd activation send is SendActivation(stage 0, "
            "micro-batch 2): sends and receives are out of order");
  EXPECT_EQ(error_of([&] { simulate_schedule(schedule); }),
            "rank 1, ReceiveActivation(stage 1, micro-batch 1): the next activation from rank 0 "
            "is SendActivation(stage 0, micro-batch 2)'s: sends and receives are out of order");
}

TEST(PipelineScheduleTest, AReceiveWithoutASendIsRefusedByValidationAndDeadlocksInSimulation) {
  PipelineSchedule schedule = one_forward_one_backward_schedule({2, 4});
  remove_action(schedule, 0, {Kind::kSendActivation, 0, 3});
  EXPECT_EQ(error_of([&] { validate_schedule(schedule); }),
            "rank 1, ReceiveActivation(stage 1, micro-batch 3): receives without a send (rank 0 "
            "sends rank 1 3 activations, this is the 4th receive)");
  EXPECT_EQ(error_of([&] { simulate_schedule(schedule); }),
            "schedule '1f1b' deadlocks: rank 0, ReceiveGradient(stage 0, micro-batch 3) waits "
            "for SendGradient(stage 1, micro-batch 3) on rank 1; rank 1, "
            "ReceiveActivation(stage 1, micro-batch 3) waits for SendActivation(stage 0, "
            "micro-batch 3) on rank 0");
}

// Every action is where validation wants it, but each rank waits for the other before sending:
// only running the lists finds it.
TEST(PipelineScheduleTest, SimulationFindsADeadlockValidationCannotSee) {
  PipelineSchedule schedule = one_forward_one_backward_schedule({2, 2});
  // Rank 0 waits for the first gradient before sending the second activation; rank 1 waits for
  // the second activation before sending the first gradient.
  move_after(schedule, 0, {Kind::kReceiveGradient, 0, 0}, {Kind::kForward, 0, 1});
  move_after(schedule, 1, {Kind::kReceiveActivation, 1, 1}, {Kind::kForward, 1, 0});
  EXPECT_NO_THROW(validate_schedule(schedule));
  EXPECT_EQ(error_of([&] { simulate_schedule(schedule); }),
            "schedule '1f1b' deadlocks: rank 0, ReceiveGradient(stage 0, micro-batch 0) waits "
            "for SendGradient(stage 1, micro-batch 0) on rank 1; rank 1, "
            "ReceiveActivation(stage 1, micro-batch 1) waits for SendActivation(stage 0, "
            "micro-batch 1) on rank 0");
}

TEST(PipelineScheduleTest, ValidationNamesTheRankTheActionAndTheProblem) {
  struct Case {
    std::string what;
    PipelineSchedule schedule;
    std::string error;
  };
  std::vector<Case> cases;
  {
    PipelineSchedule s = zero_bubble_schedule({2, 2});
    move_after(s, 1, {Kind::kBackwardInput, 1, 1}, {Kind::kBackwardWeight, 1, 1});
    cases.push_back({"W before I", s,
                     "rank 1, BackwardWeight(stage 1, micro-batch 1): runs before its "
                     "BackwardInput"});
  }
  {
    PipelineSchedule s = zero_bubble_schedule({2, 2});
    remove_action(s, 0, {Kind::kBackwardWeight, 0, 1});
    cases.push_back({"I without W", s,
                     "rank 0, BackwardWeight(stage 0, micro-batch 1): is missing after its "
                     "BackwardInput"});
  }
  {
    PipelineSchedule s = gpipe_schedule({2, 2});
    s.rank_actions[1].push_back({Kind::kBackwardWeight, 1, 0});
    cases.push_back({"B and W", s,
                     "rank 1, Backward(stage 1, micro-batch 0): runs besides a split backward "
                     "(BackwardInput/BackwardWeight)"});
  }
  {
    PipelineSchedule s = gpipe_schedule({2, 2});
    s.rank_actions[1].push_back({Kind::kForward, 1, 0});
    cases.push_back({"a second forward", s,
                     "rank 1, Forward(stage 1, micro-batch 0): appears twice (positions 1 and 8 "
                     "of the rank's list)"});
  }
  {
    PipelineSchedule s = gpipe_schedule({2, 2});
    s.rank_actions[0].push_back({Kind::kForward, 1, 0});
    cases.push_back({"a stage on the wrong rank", s,
                     "rank 0, Forward(stage 1, micro-batch 0): stage 1 lives on rank 1"});
  }
  {
    PipelineSchedule s = gpipe_schedule({2, 2});
    s.rank_actions[1].push_back({Kind::kSendActivation, 1, 0});
    cases.push_back({"a send past the last stage", s,
                     "rank 1, SendActivation(stage 1, micro-batch 0): stage 1 has no next stage "
                     "to communicate with"});
  }
  {
    PipelineSchedule s = one_forward_one_backward_schedule({2, 2});
    move_after(s, 1, {Kind::kForward, 1, 1}, {Kind::kBackward, 1, 1});
    cases.push_back({"backward before forward", s,
                     "rank 1, Backward(stage 1, micro-batch 1): runs before Forward(stage 1, "
                     "micro-batch 1)"});
  }
  {
    PipelineSchedule s = one_forward_one_backward_schedule({2, 2});
    move_after(s, 1, {Kind::kReceiveActivation, 1, 0}, {Kind::kForward, 1, 0});
    cases.push_back({"a forward before its activation arrives", s,
                     "rank 1, Forward(stage 1, micro-batch 0): runs before "
                     "ReceiveActivation(stage 1, micro-batch 0)"});
  }
  {
    PipelineSchedule s = gpipe_schedule({2, 2});
    move_after(s, 0, {Kind::kForward, 0, 1}, {Kind::kSendActivation, 0, 1});
    cases.push_back({"a send before its forward", s,
                     "rank 0, SendActivation(stage 0, micro-batch 1): runs before Forward(stage "
                     "0, micro-batch 1) produces it"});
  }
  {
    PipelineSchedule s = one_forward_one_backward_schedule({2, 2});
    move_after(s, 0, {Kind::kReceiveGradient, 0, 1}, {Kind::kBackward, 0, 1});
    cases.push_back({"a backward before its gradient arrives", s,
                     "rank 0, Backward(stage 0, micro-batch 1): runs before "
                     "ReceiveGradient(stage 0, micro-batch 1)"});
  }
  {
    // One rank, two stages: stage 1's forward needs stage 0's, handed over on the rank.
    PipelineSchedule s = interleaved_schedule({1, 1, 2});
    move_after(s, 0, {Kind::kForward, 0, 0}, {Kind::kForward, 1, 0});
    cases.push_back({"a forward before the previous stage's", s,
                     "rank 0, Forward(stage 1, micro-batch 0): runs before Forward(stage 0, "
                     "micro-batch 0)"});
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(error_of([&] { validate_schedule(c.schedule); }), c.error);
  }
}

TEST(PipelineScheduleTest, InvalidCombinationsGiveOneLineErrorsNamingTheNumbers) {
  struct Case {
    std::string name;
    PipelineShape shape;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"1f1b",
       {4, 2, 1},
       "1f1b schedule: needs at least as many micro-batches as ranks (m >= p), got p = 4, m = 2, "
       "v = 1"},
      {"zero_bubble",
       {4, 3, 1},
       "zero_bubble schedule: needs at least as many micro-batches as ranks (m >= p), got p = 4, "
       "m = 3, v = 1"},
      {"interleaved_1f1b",
       {4, 6, 2},
       "interleaved_1f1b schedule: needs the micro-batches to be a multiple of the ranks "
       "(m % p == 0), got p = 4, m = 6, v = 2"},
      {"1f1b",
       {2, 4, 2},
       "1f1b schedule: takes one stage per rank (v = 1), got p = 2, m = 4, v = 2"},
      {"gpipe",
       {2, 4, 2},
       "gpipe schedule: takes one stage per rank (v = 1), got p = 2, m = 4, v = 2"},
      {"zero_bubble",
       {2, 4, 2},
       "zero_bubble schedule: takes one stage per rank (v = 1), got p = 2, m = 4, v = 2"},
      {"gpipe",
       {0, 4, 1},
       "gpipe schedule: needs at least one rank (p >= 1), got p = 0, m = 4, v = 1"},
      {"gpipe",
       {2, 0, 1},
       "gpipe schedule: needs at least one micro-batch (m >= 1), got p = 2, m = 0, v = 1"},
      {"interleaved_1f1b",
       {2, 4, 0},
       "interleaved_1f1b schedule: needs at least one stage per rank (v >= 1), got p = 2, m = 4, "
       "v = 0"},
      {"looped_bfs",
       {2, 4, 1},
       "unknown pipeline schedule 'looped_bfs' (known: gpipe, 1f1b, interleaved_1f1b, "
       "zero_bubble, zero_bubble_v)"},
      {"zero_bubble_v",
       {2, 4, 1},
       "zero_bubble_v schedule: takes two stages per rank (v = 2), got p = 2, m = 4, v = 1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(error_of([&] { build_pipeline_schedule(c.name, c.shape); }), c.error);
  }
  // GPipe runs with fewer micro-batches than ranks.
  EXPECT_NO_THROW(validate_schedule(gpipe_schedule({4, 2})));
}

TEST(PipelineScheduleTest, CostsShapeTheSimulation) {
  PipelineCosts costs;
  costs.forward = 2;
  costs.backward = 5;
  const PipelineSimulation simulation =
      simulate_schedule(one_forward_one_backward_schedule({2, 4}), costs);
  // (m + p - 1) (F + B): the bubble is (p - 1) (F + B) whatever the costs.
  EXPECT_EQ(simulation.makespan, 5 * 7);
  EXPECT_EQ(simulation.ranks[0].busy, 4 * 7);
  costs.forward = 0;
  EXPECT_EQ(error_of([&] {
              simulate_schedule(gpipe_schedule({2, 2}), costs);
            }),
            "pipeline cost forward must be >= 1, got 0");
}

TEST(PipelineScheduleTest, TransfersBetweenRanksDelayWhatWaitsForThemAndHandOversTakeNone) {
  PipelineCosts costs;
  costs.forward = 2;
  costs.backward = 5;
  const int transfer = 3;
  const auto delay = [&](const PipelineSchedule& schedule) {
    return simulate_schedule(schedule, costs, transfer).makespan -
           simulate_schedule(schedule, costs).makespan;
  };
  // One micro-batch through every stage and back: 2 (p - 1) transfers on its path.
  EXPECT_EQ(delay(gpipe_schedule({2, 1})), 2 * transfer);
  EXPECT_EQ(delay(gpipe_schedule({4, 1})), 6 * transfer);
  // GPipe's forwards and backwards run back to back: only its two ramps wait (41 against 35).
  EXPECT_EQ(delay(gpipe_schedule({2, 4})), 2 * transfer);
  // 1F1B on 2 ranks waits for each micro-batch's round trip in its steady state: rank 0's
  // backwards start at 15, 22, 35 and 42 instead of 9, 16, 23 and 30 (47 against 35).
  EXPECT_EQ(simulate_schedule(one_forward_one_backward_schedule({2, 4}), costs, transfer).makespan,
            47);
  // ZB-V on 2 ranks hands stage 1's output to stage 2 on rank 1: two of its three boundaries
  // cross ranks, each passed forward and backward.
  EXPECT_EQ(delay(zero_bubble_v_schedule({2, 1, 2})), 4 * transfer);
  EXPECT_EQ(error_of([&] {
              simulate_schedule(gpipe_schedule({2, 2}), costs, -1);
            }),
            "pipeline transfer time must be >= 0, got -1");
}

TEST(PipelineScheduleTest, TimelineHasOneColumnPerTimeUnit) {
  const PipelineSchedule schedule = one_forward_one_backward_schedule({2, 2});
  EXPECT_EQ(format_timeline(schedule, simulate_schedule(schedule)),
            "1f1b: 2 ranks, 2 micro-batches; F=1 B=2 I=1 W=1, one column per time unit, "
            "makespan 9\n"
            "rank 0 |F0 F1 .  .  B0 B0 .  B1 B1 | idle 3/9 = 33.3%, holds at most 2 "
            "micro-batches\n"
            "rank 1 |.  F0 B0 B0 F1 B1 B1 .  .  | idle 3/9 = 33.3%, holds at most 1 micro-batch\n"
            "mean idle share 33.3%, formula (p-1)/(m+p-1) = 33.3%\n");
}

TEST(PipelineScheduleTest, TimelineNamesTheStageWhenRanksHoldSeveral) {
  const PipelineSchedule schedule = interleaved_schedule({2, 2, 2});
  const std::string timeline = format_timeline(schedule, simulate_schedule(schedule));
  EXPECT_HAS(timeline, "rank 0 |0F0 0F1 2F0 2F1 ");
  EXPECT_HAS(timeline, "rank 1 |.   1F0 1F1 3F0 3B0 3B0 ");
  EXPECT_HAS(timeline, "formula (p-1)/(v*m+p-1) at most 20.0%");
}

TEST(PipelineScheduleTest, HostCommandPrintsTheTimelineAndRefusesInvalidCombinations) {
  const CommandResult printed =
      run_host({"schedule", "1f1b", "--stages", "4", "--micro-batches", "8"}, {}, 60);
  ASSERT_EQ(printed.exit_code, 0) << describe(printed);
  EXPECT_HAS(printed.out,
             "rank 0 |F0 F1 F2 F3 .  .  .  .  .  .  B0 B0 F4 B1 B1 F5 B2 B2 F6 B3 B3 F7 B4 B4 .  "
             "B5 B5 .  B6 B6 .  B7 B7 | idle 9/33 = 27.3%");
  EXPECT_HAS(printed.out,
             "rank 3 |.  .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 B6 B6 F7 "
             "B7 B7 .  .  .  .  .  .  | idle 9/33 = 27.3%");
  EXPECT_HAS(printed.out, "mean idle share 27.3%, formula (p-1)/(m+p-1) = 27.3%");
  EXPECT_EQ(std::count(printed.out.begin(), printed.out.end(), '\n'), 6);

  const CommandResult refused = run_host({"schedule", "interleaved_1f1b", "--stages", "4",
                                          "--micro-batches", "6", "--virtual-stages", "2"},
                                         {}, 60);
  EXPECT_EQ(refused.exit_code, 1) << describe(refused);
  EXPECT_EQ(refused.out, "");
  EXPECT_EQ(refused.err,
            "trainyard: error: interleaved_1f1b schedule: needs the micro-batches to be a "
            "multiple of the ranks (m % p == 0), got p = 4, m = 6, v = 2\n");
}

}  // namespace
}  // namespace trainyard::testing
