// The step phase clock: phases are the time between marks, data wait is host time, spans tile
// each step, cancelled steps leave nothing behind; and the bottleneck classification.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "trainyard/api/step_phases.hpp"

namespace trainyard {
namespace {

void busy_for(std::chrono::milliseconds duration) {
  const auto until = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(PhaseClock, PhasesAreTheTimeBetweenMarksAndAddUpToTheStep) {
  PhaseClock clock(nullptr, 0, /*keep_spans=*/true);
  const auto started = std::chrono::steady_clock::now();
  for (int step = 0; step < 3; ++step) {
    clock.begin_step(step);
    busy_for(std::chrono::milliseconds(4));
    clock.end_data_wait();
    clock.mark(StepPhase::HostToDevice);
    busy_for(std::chrono::milliseconds(6));
    clock.mark(StepPhase::Forward);
    busy_for(std::chrono::milliseconds(8));
    clock.mark(StepPhase::Backward);
    busy_for(std::chrono::milliseconds(2));
    clock.end_step();
  }
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  PhaseRollup rollup = clock.rollup();
  EXPECT_EQ(rollup.steps, 3);
  EXPECT_GE(rollup.at(StepPhase::DataWait), 12.0);
  EXPECT_GE(rollup.at(StepPhase::Forward), 18.0);
  EXPECT_GE(rollup.at(StepPhase::Backward), 24.0);
  EXPECT_GE(rollup.at(StepPhase::Optimizer), 6.0);
  EXPECT_EQ(rollup.at(StepPhase::CommWait), 0.0);
  double total = 0;
  for (double ms : rollup.total_ms) total += ms;
  EXPECT_LE(total, wall_ms + 1e-6);
  EXPECT_GE(total, 0.95 * wall_ms);
  // Five spans per step (comm wait was never marked), back to back.
  ASSERT_EQ(rollup.spans.size(), 15u);
  for (std::size_t i = 1; i < rollup.spans.size(); ++i) {
    const PhaseSpan& previous = rollup.spans[i - 1];
    const PhaseSpan& span = rollup.spans[i];
    if (span.step != previous.step) continue;
    EXPECT_NEAR(span.start_us, previous.start_us + previous.duration_us, 1e-3);
  }
  EXPECT_EQ(rollup.spans.front().phase, StepPhase::DataWait);
  EXPECT_EQ(rollup.spans.back().phase, StepPhase::Optimizer);
  // The next rollup starts empty.
  EXPECT_EQ(clock.rollup().steps, 0);
}

TEST(PhaseClock, CancelledStepsAndMarksOutsideStepsAreNotCounted) {
  PhaseClock clock(nullptr, 0, false);
  clock.mark(StepPhase::Forward);  // a strategy driven outside the step loop
  clock.begin_step(0);
  clock.cancel_step();  // the epoch ran out of data
  clock.begin_step(0);
  clock.end_data_wait();
  clock.mark(StepPhase::Forward);
  clock.end_step();
  PhaseRollup rollup = clock.rollup();
  EXPECT_EQ(rollup.steps, 1);
  EXPECT_TRUE(rollup.spans.empty());
}

TEST(PhaseClock, AStepOpenAtTheRollupIsKeptForTheNext) {
  PhaseClock clock(nullptr, 0, false);
  clock.begin_step(0);
  clock.end_data_wait();
  clock.end_step();
  clock.begin_step(1);
  EXPECT_EQ(clock.rollup().steps, 1);
  clock.end_data_wait();
  busy_for(std::chrono::milliseconds(3));
  clock.end_step();
  PhaseRollup rollup = clock.rollup();
  EXPECT_EQ(rollup.steps, 1);
  EXPECT_GE(rollup.at(StepPhase::Optimizer), 3.0);
}

TEST(PhaseClock, BeginningAStepTwiceIsAnError) {
  PhaseClock clock(nullptr, 0, false);
  clock.begin_step(0);
  EXPECT_THROW(clock.begin_step(1), std::exception);
}

std::array<double, kStepPhaseCount> phases(double data, double copy, double forward,
                                           double backward, double comm, double optimizer) {
  return {data, copy, forward, backward, comm, optimizer};
}

TEST(Bottleneck, NamesTheLargestWaitThatCrossesItsThreshold) {
  auto verdict = [](const std::array<double, kStepPhaseCount>& total) {
    auto lines = describe_bottleneck(total, 10, 10.0, std::nullopt);
    EXPECT_EQ(lines.size(), 2u);
    return lines.size() == 2 ? lines[1] : std::string();
  };
  EXPECT_EQ(verdict(phases(50, 0, 20, 20, 0, 10)).rfind("data-bound: steps wait 50%", 0), 0u);
  EXPECT_EQ(verdict(phases(5, 0, 30, 30, 30, 5)).rfind("communication-bound: 30%", 0), 0u);
  EXPECT_EQ(verdict(phases(5, 20, 30, 40, 0, 5)).rfind("copy-bound", 0), 0u);
  EXPECT_EQ(verdict(phases(5, 5, 40, 40, 5, 5))
                .rfind("compute-bound: forward, backward and optimizer take 85%", 0),
            0u);
  // The breakdown line carries the numbers: per-step milliseconds and shares.
  auto lines = describe_bottleneck(phases(50, 0, 20, 20, 0, 10), 10, 10.0, std::nullopt);
  EXPECT_NE(lines[0].find("step time 10.00 ms over 10 steps"), std::string::npos);
  EXPECT_NE(lines[0].find("data_wait 5.00 ms (50%)"), std::string::npos);
  EXPECT_TRUE(describe_bottleneck(phases(0, 0, 0, 0, 0, 0), 0, 0, std::nullopt).empty());
}

}  // namespace
}  // namespace trainyard
