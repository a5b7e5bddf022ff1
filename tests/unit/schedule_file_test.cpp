// Schedules written out and read back (parse_schedule_csv, format_schedule_csv, `trainyard
// schedule --as-file / --file`): every built schedule round-trips, and a file that is not one
// training step is refused naming the rank, the action and the reason.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard::testing {
namespace {

TEST(ScheduleFile, EveryBuiltScheduleRoundTrips) {
  const std::vector<std::pair<std::string, PipelineShape>> built = {{"gpipe", {2, 4, 1}},
                                                                    {"1f1b", {4, 8, 1}},
                                                                    {"interleaved_1f1b", {2, 4, 2}},
                                                                    {"zero_bubble", {4, 8, 1}},
                                                                    {"zero_bubble_v", {4, 8, 2}}};
  for (const auto& [name, shape] : built) {
    const PipelineSchedule schedule = build_pipeline_schedule(name, shape);
    const PipelineSchedule read = parse_schedule_csv(format_schedule_csv(schedule), "written");
    EXPECT_EQ(read.rank_actions, schedule.rank_actions) << name;
    EXPECT_EQ(read.shape.ranks, shape.ranks) << name;
    EXPECT_EQ(read.shape.micro_batches, shape.micro_batches) << name;
    EXPECT_EQ(read.shape.virtual_stages, shape.virtual_stages) << name;
    // The placement follows from which rank lists which stage.
    EXPECT_EQ(read.shape.placement, schedule.shape.placement) << name;
  }
}

TEST(ScheduleFile, ReadsTorchSpellingWithCommentsAndSpaces) {
  const PipelineSchedule read = parse_schedule_csv(
      "# rank 0, then rank 1\n0F0, 0SEND_F0, 0RECV_B0, 0B0\n\n1RECV_F0, 1F0, 1I0, 1SEND_B0, 1W0\n",
      "hand.csv");
  ASSERT_EQ(read.rank_actions.size(), 2u);
  EXPECT_EQ(read.rank_actions[1][2], (PipelineAction{PipelineActionKind::kBackwardInput, 1, 0}));
  EXPECT_EQ(read.rank_actions[1][4], (PipelineAction{PipelineActionKind::kBackwardWeight, 1, 0}));
  EXPECT_NO_THROW(validate_schedule(read));
  EXPECT_NO_THROW(simulate_schedule(read));
}

// What is wrong with `text`, as validation and simulation say it.
std::string refusal(const std::string& text) {
  return error_of([&] {
    const PipelineSchedule schedule = parse_schedule_csv(text, "bad.csv");
    validate_schedule(schedule);
    simulate_schedule(schedule);
  });
}

TEST(ScheduleFile, MalformedSchedulesAreRefusedNamingRankActionAndReason) {
  // Rank 1 never runs the backward of micro-batch 1.
  EXPECT_HAS(refusal("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                     "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1SEND_B1\n"),
             "rank 1, Backward(stage 1, micro-batch 1): is missing");
  // Each rank first waits for what the other sends only later.
  EXPECT_HAS(refusal("0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"), "deadlock");
  // A weight gradient before its input gradient.
  EXPECT_HAS(refusal("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1W0,1I0,1SEND_B0\n"),
             "rank 1, BackwardWeight(stage 1, micro-batch 0)");
  EXPECT_HAS(refusal("0F0,0X0\n"), "bad.csv:1 (rank 0): '0X0' is not <stage><kind><micro-batch>");
  EXPECT_HAS(refusal("0F0,1F0\n1F0\n"),
             "bad.csv: rank 0, Forward(stage 1, micro-batch 0): stage 1 lives on rank 1");
  EXPECT_HAS(refusal("# nothing\n"), "bad.csv: no rank's actions");
}

TEST(ScheduleFile, HostCommandWritesAndChecksFiles) {
  TempDir dir;
  const CommandResult written = run_host(
      {"schedule", "zero_bubble", "--stages", "2", "--micro-batches", "4", "--as-file"}, {}, 60);
  ASSERT_EQ(written.exit_code, 0) << describe(written);
  const auto file = dir.write("zb.csv", written.out);
  const CommandResult checked = run_host({"schedule", "--file", file.string()}, {}, 60);
  ASSERT_EQ(checked.exit_code, 0) << describe(checked);
  EXPECT_HAS(checked.out, "formula 1F1B's (p-1)/(m+p-1)");
  const auto broken = dir.write("broken.csv", "0F0,0SEND_F0\n1RECV_F0,1F0\n");
  const CommandResult refused = run_host({"schedule", "--file", broken.string()}, {}, 60);
  EXPECT_EQ(refused.exit_code, 1) << describe(refused);
  EXPECT_HAS(refused.err, "is missing");
}

}  // namespace
}  // namespace trainyard::testing
