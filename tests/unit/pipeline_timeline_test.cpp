#include "trainyard/parallel/pipeline_timeline.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;
using Kind = PipelineActionKind;

MeasuredAction at(Kind kind, int stage, int micro_batch, double start_us, double end_us) {
  return {{kind, stage, micro_batch}, start_us, end_us};
}

// One rank of a 2-rank 1F1B step over 2 micro-batches; `shift` tells ranks' files apart.
RankTimeline rank_timeline(int rank, int pp_rank, int dp_rank, double shift = 0) {
  RankTimeline t;
  t.schedule = "1f1b";
  t.ranks = 2;
  t.micro_batches = 2;
  t.virtual_stages = 1;
  t.step = 3;
  t.rank = rank;
  t.pp_rank = pp_rank;
  t.dp_rank = dp_rank;
  if (pp_rank == 0) {
    t.actions = {at(Kind::kForward, 0, 0, 0 + shift, 100 + shift),
                 at(Kind::kSendActivation, 0, 0, 100 + shift, 101.25 + shift),
                 at(Kind::kForward, 0, 1, 101.25 + shift, 200 + shift),
                 at(Kind::kReceiveGradient, 0, 0, 200 + shift, 390 + shift),
                 at(Kind::kBackward, 0, 0, 390 + shift, 590 + shift)};
  } else {
    t.actions = {at(Kind::kReceiveActivation, 1, 0, 0 + shift, 101.5 + shift),
                 at(Kind::kForward, 1, 0, 101.5 + shift, 190 + shift),
                 at(Kind::kBackwardInput, 1, 0, 190 + shift, 290 + shift),
                 at(Kind::kBackwardWeight, 1, 0, 290 + shift, 380 + shift),
                 at(Kind::kSendGradient, 1, 0, 380 + shift, 390 + shift)};
  }
  return t;
}

void expect_same_actions(const std::vector<MeasuredAction>& got,
                         const std::vector<MeasuredAction>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].action, want[i].action) << to_string(got[i].action);
    EXPECT_EQ(got[i].start_us, want[i].start_us) << i;
    EXPECT_EQ(got[i].end_us, want[i].end_us) << i;
  }
}

TEST(PipelineTimelineTest, RoundTripKeepsEveryFieldInTheDocumentedFormat) {
  TempDir dir;
  RankTimeline written = rank_timeline(0, 0, 0);
  written.ranks = 1;
  written.schedule = "gpipe";
  for (auto& measured : written.actions) measured.action.stage = 0;
  // A time that needs all 17 digits survives.
  written.actions.push_back(at(Kind::kForward, 0, 1, 0.1 + 0.2, 1e9 + 0.5));
  const fs::path file = measured_timeline_file(dir.path(), 0, 1);
  EXPECT_EQ(file, dir / "pipeline_timeline.json");
  write_measured_timeline(file, written);

  const std::string text = read_text(file);
  EXPECT_EQ(text.rfind("{\"schedule\":\"gpipe\",\"ranks\":1,\"micro_batches\":2,"
                       "\"virtual_stages\":1,\"step\":3,\"rank\":0,\"pp_rank\":0,\"dp_rank\":0,",
                       0),
            0u)
      << text;
  EXPECT_HAS(text,
             "{\"kind\":\"Forward\",\"stage\":0,\"micro_batch\":0,\"start_us\":0.0,"
             "\"end_us\":100.0}");
  EXPECT_HAS(text, "\"start_us\":100.0,\"end_us\":101.25}");
  EXPECT_FALSE(fs::exists(dir / "pipeline_timeline.json.partial"));

  const RankTimeline read = read_rank_timeline(file);
  EXPECT_EQ(read.schedule, "gpipe");
  EXPECT_EQ(read.ranks, 1);
  EXPECT_EQ(read.micro_batches, 2);
  EXPECT_EQ(read.virtual_stages, 1);
  EXPECT_EQ(read.step, 3);
  EXPECT_EQ(read.rank, 0);
  EXPECT_EQ(read.pp_rank, 0);
  EXPECT_EQ(read.dp_rank, 0);
  expect_same_actions(read.actions, written.actions);

  auto run = read_measured_timeline(dir.path());
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->schedule, "gpipe");
  EXPECT_EQ(run->step, 3);
  ASSERT_EQ(run->rank_actions.size(), 1u);
  expect_same_actions(run->rank_actions[0], written.actions);
}

TEST(PipelineTimelineTest, AFolderWithoutTimelinesHasNone) {
  TempDir dir;
  dir.write("metrics.jsonl", "{}\n");
  dir.write("pipeline_timeline.rankx.json", "not ours");
  EXPECT_FALSE(read_measured_timeline(dir.path()).has_value());
  EXPECT_FALSE(read_measured_timeline(dir / "missing").has_value());
  EXPECT_TRUE(measured_timeline_files(dir / "missing").empty());
}

TEST(PipelineTimelineTest, SeveralRanksGiveOneRowPerPpRankFromDpRankZero) {
  // pp 2 x dp 2: pp outermost, so ranks 0 and 1 are pp rank 0, ranks 2 and 3 pp rank 1.
  TempDir dir;
  std::vector<RankTimeline> ranks = {rank_timeline(0, 0, 0), rank_timeline(1, 0, 1, 7),
                                     rank_timeline(2, 1, 0), rank_timeline(3, 1, 1, 7)};
  for (const auto& t : ranks) {
    write_measured_timeline(measured_timeline_file(dir.path(), t.rank, 4), t);
  }
  EXPECT_TRUE(fs::exists(dir / "pipeline_timeline.rank3.json"));
  // A one-process file left beside rank files is not the run's.
  write_measured_timeline(dir / "pipeline_timeline.json", rank_timeline(0, 0, 0, 50));
  const auto files = measured_timeline_files(dir.path());
  ASSERT_EQ(files.size(), 5u);
  EXPECT_EQ(files.front().filename(), "pipeline_timeline.json");
  EXPECT_EQ(files.back().filename(), "pipeline_timeline.rank3.json");

  auto run = read_measured_timeline(dir.path());
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->schedule, "1f1b");
  EXPECT_EQ(run->ranks, 2);
  EXPECT_EQ(run->micro_batches, 2);
  EXPECT_EQ(run->virtual_stages, 1);
  EXPECT_EQ(run->step, 3);
  ASSERT_EQ(run->rank_actions.size(), 2u);
  expect_same_actions(run->rank_actions[0], ranks[0].actions);
  expect_same_actions(run->rank_actions[1], ranks[2].actions);
}

TEST(PipelineTimelineTest, RanksAreOrderedByNumberNotByName) {
  TempDir dir;
  for (int rank : {10, 2}) {
    write_measured_timeline(measured_timeline_file(dir.path(), rank, 12),
                            rank_timeline(rank, rank == 2 ? 0 : 1, 0));
  }
  const auto files = measured_timeline_files(dir.path());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].filename(), "pipeline_timeline.rank2.json");
  EXPECT_EQ(files[1].filename(), "pipeline_timeline.rank10.json");
  auto run = read_measured_timeline(dir.path());
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->rank_actions[1].front().action.kind, Kind::kReceiveActivation);
}

TEST(PipelineTimelineTest, MalformedFilesAreOneLineErrorsNamingTheFile) {
  const std::string head =
      R"({"schedule":"1f1b","ranks":2,"micro_batches":4,"virtual_stages":1,"step":3,"rank":0,)"
      R"("pp_rank":0,"dp_rank":0,"actions":)";
  struct Case {
    std::string text;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"{\"schedule\": \"1f1b\",", "invalid JSON at byte"},
      {"[1, 2]", "expected a JSON object"},
      {R"({"schedule":"1f1b","ranks":2,"micro_batches":4,"virtual_stages":1,"step":3,"rank":0,)"
       R"("dp_rank":0,"actions":[]})",
       "missing \"pp_rank\""},
      {R"({"schedule":1,"ranks":2})", "\"schedule\" must be a string"},
      {head + "{}}", "\"actions\" must be an array"},
      {head + R"([{"kind":"Forward","stage":"0","micro_batch":0,"start_us":0,"end_us":1}]})",
       "actions[0]: \"stage\" must be a number"},
      {head + R"([{"kind":"Forward","stage":0,"micro_batch":0,"start_us":0,"end_us":1},)"
              R"({"kind":"Fwd","stage":0,"micro_batch":1,"start_us":1,"end_us":2}]})",
       "actions[1]: unknown action kind \"Fwd\""},
      {head + R"([{"kind":"Forward","stage":0,"micro_batch":4,"start_us":0,"end_us":1}]})",
       "actions[0]: \"micro_batch\" must be an integer in [0, 3], got 4"},
      {head + R"([{"kind":"Forward","stage":2,"micro_batch":0,"start_us":0,"end_us":1}]})",
       "actions[0]: \"stage\" must be an integer in [0, 1], got 2"},
      {head + R"([{"kind":"Forward","stage":0,"micro_batch":0,"start_us":5,"end_us":1}]})",
       "actions[0]: needs 0 <= start_us <= end_us, got 5 and 1"},
      {head + R"([{"kind":"Forward","stage":0,"micro_batch":0,"start_us":0}]})",
       "actions[0]: missing \"end_us\""},
      {R"({"schedule":"1f1b","ranks":2,"micro_batches":4,"virtual_stages":1,"step":3,"rank":0,)"
       R"("pp_rank":2,"dp_rank":0,"actions":[]})",
       "\"pp_rank\" must be an integer in [0, 1], got 2"},
      {R"({"schedule":"1f1b","ranks":2.5,"micro_batches":4})", "\"ranks\" must be an integer"},
  };
  for (const auto& c : cases) {
    TempDir dir;
    const fs::path file = dir.write("pipeline_timeline.json", c.text);
    const std::string message = error_of([&] { read_measured_timeline(dir.path()); });
    EXPECT_EQ(message.rfind(file.string() + ": ", 0), 0u) << message;
    EXPECT_HAS(message, c.reason);
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(PipelineTimelineTest, FilesThatDisagreeOrMissARankAreErrors) {
  {
    TempDir dir;
    RankTimeline later = rank_timeline(1, 1, 0);
    later.step = 4;
    write_measured_timeline(dir / "pipeline_timeline.rank0.json", rank_timeline(0, 0, 0));
    write_measured_timeline(dir / "pipeline_timeline.rank1.json", later);
    const std::string message = error_of([&] { read_measured_timeline(dir.path()); });
    EXPECT_HAS(message, (dir / "pipeline_timeline.rank1.json").string() +
                            ": schedule '1f1b', 2 ranks, 2 micro-batches, 1 virtual stages, "
                            "step 4 differs from pipeline_timeline.rank0.json's");
  }
  {
    TempDir dir;
    write_measured_timeline(dir / "pipeline_timeline.rank0.json", rank_timeline(0, 0, 0));
    write_measured_timeline(dir / "pipeline_timeline.rank1.json", rank_timeline(2, 1, 0));
    EXPECT_HAS(error_of([&] { read_measured_timeline(dir.path()); }),
               "pipeline_timeline.rank1.json: holds the timeline of rank 2, but its name says "
               "rank 1");
  }
  {
    TempDir dir;
    write_measured_timeline(dir / "pipeline_timeline.rank0.json", rank_timeline(0, 0, 0));
    write_measured_timeline(dir / "pipeline_timeline.rank1.json", rank_timeline(1, 1, 1));
    EXPECT_EQ(error_of([&] { read_measured_timeline(dir.path()); }),
              dir.path().string() +
                  ": no pipeline timeline of pp rank 1 from dp rank 0 (the run has 2 pp ranks)");
  }
  {
    TempDir dir;
    write_measured_timeline(dir / "pipeline_timeline.rank0.json", rank_timeline(0, 0, 0));
    write_measured_timeline(dir / "pipeline_timeline.rank1.json", rank_timeline(1, 0, 0));
    EXPECT_HAS(error_of([&] { read_measured_timeline(dir.path()); }),
               "pipeline_timeline.rank1.json: pp rank 0 of dp rank 0 is also in "
               "pipeline_timeline.rank0.json");
  }
}

TEST(PipelineTimelineTest, IdleSharesCountComputeOverTheComputeMakespan) {
  MeasuredPipelineTimeline timeline;
  timeline.ranks = 2;
  // Rank 0 computes 20 of the 40 us from the first compute (5) to the last (45); rank 1 30,
  // and its receive (0 to 15) counts as idle.
  timeline.rank_actions = {
      {at(Kind::kForward, 0, 0, 5, 15), at(Kind::kSendActivation, 0, 0, 15, 16),
       at(Kind::kBackward, 0, 0, 35, 45)},
      {at(Kind::kReceiveActivation, 1, 0, 0, 15), at(Kind::kForward, 1, 0, 15, 25),
       at(Kind::kBackwardInput, 1, 0, 25, 35), at(Kind::kBackwardWeight, 1, 0, 35, 45)}};
  const auto shares = measured_idle_shares(timeline);
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_DOUBLE_EQ(shares[0], 0.5);
  EXPECT_DOUBLE_EQ(shares[1], 0.25);

  timeline.rank_actions = {{at(Kind::kReceiveGradient, 0, 0, 0, 5)}, {}};
  EXPECT_EQ(measured_idle_shares(timeline), (std::vector<double>{0, 0}));
}

TEST(PipelineTimelineTest, WritingANonFiniteTimeIsAnError) {
  TempDir dir;
  RankTimeline t = rank_timeline(0, 0, 0);
  t.actions[0].end_us = std::numeric_limits<double>::infinity();
  const fs::path file = dir / "pipeline_timeline.json";
  EXPECT_EQ(error_of([&] { write_measured_timeline(file, t); }),
            file.string() + ": cannot write a time that is not finite");
  EXPECT_FALSE(fs::exists(file));
}

}  // namespace
}  // namespace trainyard::testing
