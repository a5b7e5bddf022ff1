// The collective flight recorder: its ring keeps the newest records in order and marks them
// finished as their works complete; a dump reads back whole, a damaged one is refused naming the
// file; the diagnosis names the rank, operation, group and number of a frozen rank, a rank that
// never entered the collective its group waits in, and one that skipped a collective; and under
// comm.debug = "detail" a collective whose shapes differ between ranks is refused on both,
// naming each rank's.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>

#include "step_harness.hpp"
#include "test_support.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/collective_counter.hpp"
#include "trainyard/parallel/flight_diagnosis.hpp"
#include "trainyard/parallel/flight_recorder.hpp"
#include "trainyard/parallel/process_mesh.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const CollectiveGroup> group_of(const std::string& name, std::vector<int> ranks) {
  return std::make_shared<const CollectiveGroup>(CollectiveGroup{name, std::move(ranks)});
}

CollectiveRecord collective(const std::shared_ptr<const CollectiveGroup>& group,
                            std::int64_t sequence, std::int64_t step,
                            const std::string& operation = "allreduce",
                            std::vector<std::int64_t> shape = {1024}) {
  CollectiveRecord record;
  record.group = group;
  record.sequence = sequence;
  record.operation = operation;
  record.dtype = "float32";
  record.shapes = {std::move(shape)};
  record.step = step;
  record.issued_us = 1'000'000;
  record.finished_us = 1'100'000;
  record.state = CollectiveState::kCompleted;
  return record;
}

FlightRecordFile dump_of(int rank, int world, std::vector<CollectiveRecord> records) {
  FlightRecordFile dump;
  dump.rank = rank;
  dump.world_size = world;
  dump.reason = "SIGUSR2";
  dump.dumped_us = 32'000'000;
  dump.records = std::move(records);
  for (std::size_t k = 0; k < dump.records.size(); ++k) {
    dump.records[k].id = static_cast<std::int64_t>(k);
  }
  return dump;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

TEST(FlightRecorder, KeepsTheNewestRecordsInOrderAndMarksThemFinished) {
  FlightRecorder recorder(3);
  const auto dp = group_of("dp", {0, 1});
  std::vector<std::int64_t> ids;
  for (int k = 1; k <= 5; ++k) {
    recorder.set_step(k);
    ids.push_back(recorder.issued(collective(dp, k, 0)));
  }
  recorder.finished(ids[4], true);
  recorder.finished(ids[3], false);
  recorder.finished(ids[0], true);  // overwritten: nothing to mark
  const std::vector<CollectiveRecord> kept = recorder.snapshot();
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].sequence, 3);
  EXPECT_EQ(kept[2].sequence, 5);
  EXPECT_EQ(kept[2].step, 5);  // stamped by the recorder
  EXPECT_EQ(kept[0].state, CollectiveState::kIssued);
  EXPECT_EQ(kept[1].state, CollectiveState::kFailed);
  EXPECT_EQ(kept[2].state, CollectiveState::kCompleted);
  EXPECT_GE(kept[2].finished_us, kept[2].issued_us);
  EXPECT_THROW(FlightRecorder(0), Error);
}

TEST(FlightRecorder, DumpReadsBackWholeAndDamageIsRefusedNamingTheFile) {
  TempDir dir;
  FlightRecorder recorder(8);
  const auto tp = group_of("tp", {2, 3});
  recorder.set_step(7);
  const std::int64_t id = recorder.issued(collective(tp, 1, 0, "_allgather_base", {4, 8}));
  recorder.finished(id, true);
  CollectiveRecord send = collective(tp, 1, 0, "send", {16});
  send.peer = 1;
  recorder.issued(send);
  const fs::path file = dir / "flight" / "rank2.json";
  write_flight_record(file, recorder, 2, 4, "a test");
  const FlightRecordFile read = read_flight_record(file);
  EXPECT_EQ(read.rank, 2);
  EXPECT_EQ(read.world_size, 4);
  EXPECT_EQ(read.reason, "a test");
  EXPECT_EQ(read.step, 7);
  ASSERT_EQ(read.records.size(), 2u);
  EXPECT_EQ(read.records[0].describe(), "_allgather_base #1 on tp [2,3] (float32 [4, 8], step 7)");
  EXPECT_EQ(read.records[0].state, CollectiveState::kCompleted);
  EXPECT_EQ(read.records[1].describe(), "send to rank 3 #1 on tp [2,3] (float32 [16], step 7)");
  EXPECT_EQ(read.records[1].state, CollectiveState::kIssued);
  EXPECT_EQ(read_flight_records(dir.path()).size(), 1u);  // a run folder: its flight/ is read

  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const fs::path truncated = dir.write("rank5.json", text.substr(0, text.size() / 2));
  try {
    read_flight_record(truncated);
    ADD_FAILURE() << "a truncated flight record was read";
  } catch (const Error& error) {
    EXPECT_HAS(std::string(error.what()), truncated.string());
  }
  const fs::path foreign = dir.write("rank6.json", R"({"format": "something else"})");
  EXPECT_THROW(read_flight_record(foreign), Error);
  TempDir empty;
  EXPECT_THROW(read_flight_records(empty.path()), Error);
}

TEST(FlightDiagnosis, NamesARankThatWroteNoRecordWhileItsGroupWaits) {
  const auto dp = group_of("dp", {0, 1, 2, 3});
  std::vector<FlightRecordFile> dumps;
  for (int rank = 0; rank < 3; ++rank) {
    CollectiveRecord stuck = collective(dp, 42, 5);
    stuck.state = CollectiveState::kIssued;
    dumps.push_back(dump_of(rank, 4, {collective(dp, 41, 4), stuck}));
  }
  const std::string found = joined(diagnose_flight_records(dumps));
  EXPECT_HAS(found,
             "rank 3 wrote no flight record (stopped, frozen or killed before it could) and never "
             "finished allreduce #42 on group dp [0,1,2,3] (step 5); ranks 0-2 wait in it since "
             "31 s");
}

TEST(FlightDiagnosis, NamesARankThatNeverEnteredTheCollectiveItsGroupWaitsIn) {
  const auto dp = group_of("dp", {0, 1});
  const auto pp = group_of("pp", {1, 3});
  CollectiveRecord stuck = collective(dp, 8, 2);
  stuck.state = CollectiveState::kIssued;
  CollectiveRecord recv = collective(pp, 911, 2, "recv");
  recv.peer = 1;
  recv.state = CollectiveState::kIssued;
  const std::vector<FlightRecordFile> dumps = {
      dump_of(0, 4, {collective(dp, 7, 1), stuck}),
      dump_of(1, 4, {collective(dp, 7, 1), recv}),
  };
  const std::string found = joined(diagnose_flight_records(dumps));
  EXPECT_HAS(found,
             "rank 1 never entered allreduce #8 on group dp [0,1] (step 2); rank 0 waits in it "
             "since 31 s; rank 1's last op: recv from rank 3 #911 on pp [1,3]");
  EXPECT_HAS(found, "rank 1 waits in recv from rank 3 #911 on pp [1,3]");
  EXPECT_HAS(found, "rank 3 wrote no flight record");
}

TEST(FlightDiagnosis, NamesARankThatSkippedACollective) {
  const auto dp = group_of("dp", {0, 1, 2, 3});
  std::vector<FlightRecordFile> dumps;
  for (int rank = 0; rank < 4; ++rank) {
    // Rank 2 never issued step 3's all-reduce: its #3 is step 4's.
    const std::int64_t shift = rank == 2 ? 1 : 0;
    dumps.push_back(dump_of(rank, 4,
                            {collective(dp, 1, 1), collective(dp, 2, 2),
                             collective(dp, 3, 3 + shift), collective(dp, 4, 4 + shift)}));
  }
  const std::string found = joined(diagnose_flight_records(dumps));
  EXPECT_HAS(found,
             "rank 2 never entered allreduce #3 on group dp [0,1,2,3] as ranks 0, 1, 3 did "
             "(allreduce float32 [1024], step 3); its #3 is allreduce float32 [1024], step 4: a "
             "collective was skipped before it");
}

// The others fail in #3 while rank 2's #3 is another collective: the disagreement is the finding,
// not a wait that every rank seems to share.
TEST(FlightDiagnosis, AGroupThatDisagreesIsNotAlsoReportedAsWaiting) {
  const auto dp = group_of("dp", {0, 1, 2});
  std::vector<FlightRecordFile> dumps;
  for (int rank = 0; rank < 3; ++rank) {
    CollectiveRecord third = collective(dp, 3, rank == 2 ? 4 : 3);
    third.state = CollectiveState::kFailed;
    dumps.push_back(dump_of(rank, 3, {collective(dp, 1, 1), collective(dp, 2, 2), third}));
  }
  const auto findings = diagnose_flight_records(dumps);
  ASSERT_EQ(findings.size(), 1u) << joined(findings);
  EXPECT_HAS(findings.front(),
             "rank 2 never entered allreduce #3 on group dp [0,1,2] as ranks 0, 1 did");
}

TEST(FlightDiagnosis, SaysSoWhenEveryCollectiveFinishedAlike) {
  const auto dp = group_of("dp", {0, 1});
  const std::vector<FlightRecordFile> dumps = {dump_of(0, 2, {collective(dp, 1, 1)}),
                                               dump_of(1, 2, {collective(dp, 1, 1)})};
  EXPECT_HAS(joined(diagnose_flight_records(dumps)), "no collective was left unfinished");
  EXPECT_EQ(rank_set_text({5, 0, 1, 2, 7, 8}), "ranks 0-2, 5, 7, 8");
}

// Two ranks as threads over gloo, recording, under comm.debug = "detail".
TEST(CollectiveChecks, MismatchedShapesAreRefusedOnEveryRankNamingEach) {
  BuildContext base;
  const auto errors = on_data_parallel_ranks<std::string>(2, base, [](const BuildContext& context) {
    CollectiveCounter& counter = context.mesh->collectives();
    counter.record_flights(16);
    counter.check_collectives(true);
    c10::intrusive_ptr<c10d::Backend> dp = context.mesh->group(MeshGroup::kData);
    std::string error;
    std::vector<at::Tensor> mismatched = {at::ones({context.rank == 0 ? 4 : 5})};
    try {
      dp->allreduce(mismatched)->wait();
    } catch (const Error& refused) {
      error = refused.what();
    }
    // The refusal ran nothing: the group goes on, and what it runs is recorded.
    std::vector<at::Tensor> matched = {at::ones({3})};
    dp->allreduce(matched)->wait();
    EXPECT_TRUE(at::equal(matched[0], at::full({3}, 2.0f)));
    const std::vector<CollectiveRecord> records = counter.recorder()->snapshot();
    EXPECT_EQ(records.size(), 1u);  // the refused one was never issued
    EXPECT_EQ(records.back().sequence, 2);
    EXPECT_EQ(records.back().state, CollectiveState::kCompleted);
    return error;
  });
  for (const std::string& error : errors) {
    EXPECT_HAS(error, "collective mismatch on group dp");
    EXPECT_HAS(error, "at #1");
    EXPECT_HAS(error, "rank 0 allreduce float32 [4]; rank 1 allreduce float32 [5]");
  }
}

}  // namespace
}  // namespace trainyard::testing
