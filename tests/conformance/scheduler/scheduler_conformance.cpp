// Scheduler conformance: a pure, finite function of the step within [0, base_lr], with a
// rising warm-up when the schedule has one.

#include <algorithm>
#include <cmath>

#include "conformance.hpp"
#include "trainyard/api/scheduler.hpp"

namespace {

using namespace trainyard;

constexpr std::int64_t kTotal = 100;
constexpr double kBase = 0.5;

class SchedulerConformance : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<LrScheduler> build(std::shared_ptr<Table> options = {}) {
    return conformance::registry().create<LrScheduler>(
        GetParam(), conformance::under_test("scheduler", std::move(options)),
        conformance::classification_context());
  }

  static void check_range(const LrScheduler& schedule, const std::string& label) {
    for (std::int64_t step = 0; step <= kTotal; ++step) {
      const double lr = schedule.learning_rate(step, kTotal, kBase);
      ASSERT_TRUE(std::isfinite(lr)) << label << " step " << step;
      ASSERT_GE(lr, 0.0) << label << " step " << step;
      ASSERT_LE(lr, kBase * (1 + 1e-12)) << label << " step " << step;
      ASSERT_EQ(lr, schedule.learning_rate(step, kTotal, kBase))
          << label << ": not a pure function of the step (step " << step << ")";
    }
  }
};

TEST_P(SchedulerConformance, DefaultsStayWithinBaseAndAreDeterministic) {
  auto schedule = build();
  check_range(*schedule, "defaults");
  // A second instance gives the same rates: no hidden state.
  auto other = build();
  for (std::int64_t step = 0; step <= kTotal; step += 7) {
    EXPECT_EQ(schedule->learning_rate(step, kTotal, kBase), other->learning_rate(step, kTotal, kBase));
  }
  // Calls out of order give the same answers as in order.
  const double late = schedule->learning_rate(kTotal - 1, kTotal, kBase);
  (void)schedule->learning_rate(3, kTotal, kBase);
  EXPECT_EQ(late, schedule->learning_rate(kTotal - 1, kTotal, kBase));
}

TEST_P(SchedulerConformance, ZeroBaseRateGivesZero) {
  auto schedule = build();
  for (std::int64_t step = 0; step <= kTotal; step += 5) {
    EXPECT_EQ(schedule->learning_rate(step, kTotal, 0.0), 0.0) << "step " << step;
  }
}

TEST_P(SchedulerConformance, ConstantReturnsBase) {
  if (GetParam() != "constant") GTEST_SKIP() << "only for the schedule named 'constant'";
  auto schedule = build();
  for (std::int64_t step = 0; step <= kTotal; ++step) {
    EXPECT_EQ(schedule->learning_rate(step, kTotal, kBase), kBase) << "step " << step;
  }
}

TEST_P(SchedulerConformance, WarmupRampsUpToBase) {
  if (!conformance::has_option("scheduler", GetParam(), "warmup_steps")) {
    GTEST_SKIP() << "no warmup_steps option";
  }
  constexpr std::int64_t kWarmup = 10;
  auto table = std::make_shared<Table>();
  table->set("warmup_steps", Value(kWarmup));
  auto schedule = build(table);
  check_range(*schedule, "warmup_steps=10");
  double previous = -1;
  for (std::int64_t step = 0; step < kWarmup; ++step) {
    const double lr = schedule->learning_rate(step, kTotal, kBase);
    EXPECT_GT(lr, previous) << "warm-up must rise (step " << step << ")";
    previous = lr;
  }
  EXPECT_LT(schedule->learning_rate(0, kTotal, kBase), kBase / 2)
      << "the first warm-up step must be well below the base rate";
  const double peak = std::max(schedule->learning_rate(kWarmup - 1, kTotal, kBase),
                               schedule->learning_rate(kWarmup, kTotal, kBase));
  EXPECT_NEAR(peak, kBase, 1e-9) << "warm-up must reach the base rate";
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(SchedulerConformance, "scheduler");
