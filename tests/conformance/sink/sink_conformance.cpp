// Metric sink conformance: begin / write / end work with the run's output folder; the jsonl
// sink writes one line per record.

#include <cmath>
#include <filesystem>
#include <limits>

#include "conformance.hpp"
#include "test_support.hpp"
#include "trainyard/api/metrics.hpp"

namespace {

namespace fs = std::filesystem;
using trainyard::MetricRecord;
using trainyard::MetricsSink;
using trainyard::RunInfo;
using trainyard::PhaseSpan;
using trainyard::StepPhase;
using trainyard::kStepPhaseCount;

class SinkConformance : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<MetricsSink> build() {
    auto options = std::make_shared<trainyard::Table>();
    // Sinks that serve a port take any free one, so that test runs side by side never collide.
    if (trainyard::conformance::has_option("sink", GetParam(), "port")) {
      options->set("port", trainyard::Value(std::int64_t{0}));
    }
    return trainyard::conformance::registry().create<MetricsSink>(
        GetParam(), trainyard::conformance::under_test("sink", "sinks." + GetParam(), options),
        trainyard::conformance::classification_context());
  }

  static std::vector<MetricRecord> records() {
    std::vector<MetricRecord> out;
    for (int i = 1; i <= 3; ++i) {
      MetricRecord r;
      r.phase = "train";
      r.step = i * 10;
      r.epoch = 0;
      r.elapsed_s = 0.5 * i;
      r.values = {{"loss", 2.0 / i}, {"lr", 0.1}, {"samples_per_s", 1234.5}};
      out.push_back(r);
    }
    MetricRecord eval;
    eval.phase = "eval";
    eval.step = 30;
    eval.epoch = 1;
    eval.elapsed_s = 2.0;
    eval.values = {{"loss", 0.75}, {"accuracy", 0.8}};
    out.push_back(eval);
    MetricRecord summary;
    summary.phase = "summary";
    summary.step = 30;
    summary.epoch = 1;
    summary.elapsed_s = 2.5;
    summary.values = {};
    out.push_back(summary);
    return out;
  }

  static RunInfo run_info(const fs::path& dir) {
    RunInfo run;
    run.name = "conformance";
    run.total_steps = 30;
    run.steps_per_epoch = 30;
    run.epochs = 1;
    run.output_dir = dir.string();
    return run;
  }
};

TEST_P(SinkConformance, BeginWriteEnd) {
  auto sink = build();
  trainyard::testing::TempDir dir;
  const auto all = records();
  ASSERT_NO_THROW(sink->begin(run_info(dir.path())));
  for (const auto& record : all) ASSERT_NO_THROW(sink->write(record));
  ASSERT_NO_THROW(sink->end());

  if (GetParam() != "jsonl") return;
  const fs::path file = dir / "metrics.jsonl";
  ASSERT_TRUE(std::filesystem::exists(file)) << file;
  auto lines = trainyard::testing::read_lines(file);
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  ASSERT_EQ(lines.size(), all.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    ASSERT_FALSE(lines[i].empty());
    EXPECT_EQ(lines[i].front(), '{') << lines[i];
    EXPECT_EQ(lines[i].back(), '}') << lines[i];
    EXPECT_NE(lines[i].find(all[i].phase), std::string::npos) << lines[i];
  }
}

TEST_P(SinkConformance, PhaseSpansAreTakenByTheSinksThatWantThem) {
  auto sink = build();
  trainyard::testing::TempDir dir;
  sink->begin(run_info(dir.path()));
  std::vector<PhaseSpan> spans;
  for (int phase = 0; phase < kStepPhaseCount; ++phase) {
    spans.push_back({static_cast<StepPhase>(phase), 1, 10.0 * phase, 10.0});
  }
  // The engine hands spans only to sinks that ask; any sink must still take them harmlessly.
  EXPECT_NO_THROW(sink->write_phase_spans(spans));
  MetricRecord record;
  record.phase = "train";
  record.step = 1;
  record.values = {{"loss", 1.0}};
  EXPECT_NO_THROW(sink->write(record));
  EXPECT_NO_THROW(sink->end());
  if (!sink->wants_phase_spans()) return;
  bool wrote_something = false;
  for (const auto& entry : fs::recursive_directory_iterator(dir.path())) {
    if (entry.is_regular_file() && entry.file_size() > 0) wrote_something = true;
  }
  EXPECT_TRUE(wrote_something) << "a sink that wants spans writes them somewhere";
}

TEST_P(SinkConformance, NonFiniteValuesDoNotThrow) {
  auto sink = build();
  trainyard::testing::TempDir dir;
  sink->begin(run_info(dir.path()));
  MetricRecord record;
  record.phase = "train";
  record.step = 1;
  record.values = {{"loss", std::numeric_limits<double>::quiet_NaN()},
                   {"grad_norm", std::numeric_limits<double>::infinity()}};
  EXPECT_NO_THROW(sink->write(record));
  EXPECT_NO_THROW(sink->end());
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(SinkConformance, "sink");
