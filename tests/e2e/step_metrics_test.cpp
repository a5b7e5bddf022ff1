// What the engine records on every run: the phase breakdown adds up to the step time, memory
// and held bytes are measured, the csv and trace sinks write what they promise, and the run
// ends with a bottleneck report.

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard::testing {
namespace {

const char* const kPhases[] = {"data_wait_ms", "h2d_ms",       "forward_ms",
                               "backward_ms",  "comm_wait_ms", "optimizer_ms"};

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

class CnnRunWithEverySink : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    result_ = new CommandResult(run_host(
        {"run", "recipes/fashion_mnist_cnn.toml", "--set", "run.max_steps=60", "--set",
         "run.log_every=20", "--set", "run.eval=false", "--set", "checkpoint.at_end=false", "--set",
         "run.output_dir=" + dir_->path().string(), "--set", "sinks.csv.plugin=csv", "--set",
         "sinks.trace.plugin=trace", "--set", "sinks.console.progress=lines"}));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete dir_;
  }
  static TempDir* dir_;
  static CommandResult* result_;
};
TempDir* CnnRunWithEverySink::dir_ = nullptr;
CommandResult* CnnRunWithEverySink::result_ = nullptr;

TEST_F(CnnRunWithEverySink, PhaseTimesAddUpToTheStepTimeWithinFivePercent) {
  ASSERT_EQ(result_->exit_code, 0) << describe(*result_);
  auto train = of_phase(read_metrics(dir_->path() / "metrics.jsonl"), "train");
  ASSERT_EQ(train.size(), 3u);
  for (const auto& record : train) {
    double phases = 0;
    for (const char* phase : kPhases) {
      EXPECT_GE(record.at(phase), 0) << phase;
      phases += record.at(phase);
    }
    const double step = record.at("step_time_ms");
    EXPECT_NEAR(phases, step, 0.05 * step) << "phases " << phases << " ms, step " << step << " ms";
    EXPECT_GT(record.at("forward_ms"), 0);
    EXPECT_GT(record.at("backward_ms"), record.at("h2d_ms"));
    EXPECT_GT(record.at("optimizer_ms"), 0);
    EXPECT_EQ(record.at("comm_wait_ms"), 0) << "one process communicates nothing";
    for (const auto& [name, value] : record.values) {
      EXPECT_FALSE(name.starts_with("comm_") && name != "comm_wait_ms")
          << "one process counts " << name;
    }
  }
}

TEST_F(CnnRunWithEverySink, MemoryAndHeldBytesAreMeasured) {
  ASSERT_EQ(result_->exit_code, 0) << describe(*result_);
  auto records = read_metrics(dir_->path() / "metrics.jsonl");
  for (const auto& record : of_phase(records, "train")) {
    EXPECT_GT(record.at("memory_current_bytes"), 0);
    EXPECT_GE(record.at("memory_peak_bytes"), record.at("memory_current_bytes"));
    const double parameters = record.at("held_parameter_bytes");
    EXPECT_GT(parameters, 100e3) << "the cnn holds a few hundred thousand fp32 parameters";
    // After a step every parameter has a gradient; AdamW keeps two moments per parameter.
    EXPECT_EQ(record.at("held_gradient_bytes"), parameters);
    EXPECT_EQ(record.at("held_optimizer_bytes"), 2 * parameters);
    EXPECT_GT(record.at("mfu"), 0) << "the cnn reports its FLOPs; the peak is probed";
    EXPECT_FALSE(record.has("tokens_per_s")) << "images are not tokens";
  }
  auto summary = of_phase(records, "summary");
  ASSERT_EQ(summary.size(), 1u);
  double shares = 0;
  for (const char* share : {"data_wait_share", "h2d_share", "forward_share", "backward_share",
                            "comm_wait_share", "optimizer_share"}) {
    shares += summary[0].at(share);
  }
  EXPECT_NEAR(shares, 1.0, 1e-9);
}

TEST_F(CnnRunWithEverySink, EndsWithABottleneckReportCarryingItsNumbers) {
  ASSERT_EQ(result_->exit_code, 0) << describe(*result_);
  const std::string& err = result_->err;
  EXPECT_NE(err.find("trainyard: step time "), std::string::npos) << err;
  EXPECT_NE(err.find("forward "), std::string::npos) << err;
  EXPECT_NE(err.find("-bound: "), std::string::npos) << err;
}

TEST_F(CnnRunWithEverySink, CsvTablesHaveOneRowPerRecordUnderOneHeader) {
  ASSERT_EQ(result_->exit_code, 0) << describe(*result_);
  auto train = lines_of(read_text(dir_->path() / "metrics.train.csv"));
  ASSERT_EQ(train.size(), 4u) << "a header and three intervals";
  const std::string& header = train[0];
  EXPECT_EQ(header.rfind("step,epoch,elapsed_s,loss,", 0), 0u) << header;
  for (const char* column : {"forward_ms", "held_parameter_bytes", "lr"}) {
    EXPECT_NE(header.find(column), std::string::npos) << column;
  }
  const auto columns = std::count(header.begin(), header.end(), ',');
  for (std::size_t i = 1; i < train.size(); ++i) {
    EXPECT_EQ(std::count(train[i].begin(), train[i].end(), ','), columns) << train[i];
  }
  EXPECT_EQ(train[3].rfind("60,", 0), 0u);
  auto summary = lines_of(read_text(dir_->path() / "metrics.summary.csv"));
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_NE(summary[0].find("data_wait_share"), std::string::npos);
}

TEST_F(CnnRunWithEverySink, TraceHasEveryStepsPhasesBackToBack) {
  ASSERT_EQ(result_->exit_code, 0) << describe(*result_);
  const std::filesystem::path file = dir_->path() / "trace.json";
  const nlohmann::json trace = parse_strict_json(read_text(file), file.string());
  ASSERT_TRUE(trace.is_array());
  std::map<std::int64_t, std::vector<const nlohmann::json*>> by_step;
  std::set<std::string> names;
  for (const nlohmann::json& event : trace) {
    if (event.at("ph") != "X") continue;
    names.insert(event.at("name").get<std::string>());
    by_step[event.at("args").at("step").get<std::int64_t>()].push_back(&event);
  }
  EXPECT_EQ(names, (std::set<std::string>{"data_wait", "h2d", "forward", "backward", "optimizer"}));
  ASSERT_EQ(by_step.size(), 60u);
  for (const auto& [step, events] : by_step) {
    ASSERT_EQ(events.size(), 5u) << "step " << step;
    for (std::size_t i = 1; i < events.size(); ++i) {
      const double end =
          events[i - 1]->at("ts").get<double>() + events[i - 1]->at("dur").get<double>();
      EXPECT_NEAR(events[i]->at("ts").get<double>(), end, 0.01);
    }
  }
}

TEST(ConsoleSink, DrawsAProgressBarWhenAskedAndPlainLinesOtherwise) {
  for (const std::string mode : {"bar", "lines"}) {
    TempDir dir;
    auto result = run_host(
        {"run", "recipes/fashion_mnist_mlp.toml", "--set", "run.max_steps=20", "--set",
         "run.log_every=10", "--set", "run.eval=false", "--set", "checkpoint.at_end=false", "--set",
         "run.output_dir=" + dir.path().string(), "--set", "sinks.console.progress=" + mode});
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    const bool has_bar = result.out.find("\r[") != std::string::npos;
    EXPECT_EQ(has_bar, mode == "bar") << result.out;
    if (mode == "bar") {
      EXPECT_NE(result.out.find("] 100% step 20/20"), std::string::npos) << result.out;
    }
  }
}

}  // namespace
}  // namespace trainyard::testing
