// `trainyard compare` with repeats, layouts and baselines, on real runs: identical variants get
// no verdict and one slowed by a known share is called slower (the statistics themselves are
// tested on a fake timing source in tests/unit/compare_statistics_test.cpp); layouts each run on
// the processes they need; a baseline passes an unchanged run and fails a slower or numerically
// different one; bad options are one-line refusals before anything runs.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// The paced test model (tests/plugins/paced_mlp.cpp) on Fashion-MNIST: 150 steps of a few
// milliseconds on one thread, each made `model.slowdown` longer on purpose. Runs of about a
// second: the runs are what the verdicts draw on, and shorter ones vary too much from run to
// run on a shared machine for 5 of them to tell 10% apart.
std::vector<std::string> paced_compare(const fs::path& output,
                                       const std::vector<std::string>& varies, int repeat,
                                       const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {
      "compare",       "recipes/fashion_mnist_mlp.toml",
      "--plugin-path", (test_plugin_folder() / "libpaced_mlp.so").string(),
      "--steps",       "150",
      "--repeat",      std::to_string(repeat),
      "--output",      output.string()};
  for (const auto& vary : varies) args.insert(args.end(), {"--vary", vary});
  for (const char* set : {"model.plugin=paced_mlp", "model.hidden=512", "loader.batch_size=256",
                          "run.eval=false", "run.threads=1", "loader.workers=0"}) {
    args.insert(args.end(), {"--set", set});
  }
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The text after variant `number`'s label in the table: its figures and verdicts.
std::string row_text(const std::string& table, const std::string& number) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(number + "  ", 0) == 0) return line;
  }
  return {};
}

// "1.12x slower [1.04, 1.19]" -> {1.04, 1.19}; empty when the row has no such verdict.
std::vector<double> slower_interval(const std::string& row) {
  static const std::regex verdict(R"(([0-9.]+)x slower \[([0-9.]+), ([0-9.]+)\])");
  std::smatch match;
  if (!std::regex_search(row, match, verdict)) return {};
  return {std::stod(match[2]), std::stod(match[3])};
}

// Real runs: two identical variants get no verdict, and one slowed on purpose (the paced model
// waits that share of the rest of each step) is called slower. Where the interval lands is the
// fake timing source's test (CompareStatistics.*) and the floor below; a timing test on a shared
// machine runs a second compare when the first misses.
struct VerdictTry {
  bool identical_same = false;
  std::vector<double> interval;  // the slowed variant's, empty without a "slower" verdict
  std::string table;
};

VerdictTry compare_identical_and_slowed(const fs::path& output, const std::string& slowdown) {
  auto result = run_host(paced_compare(output, {"model.slowdown=0,0," + slowdown}, 5));
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  VerdictTry attempt;
  attempt.table = read_text(output / "table.txt");
  const std::string same_row = row_text(attempt.table, "2");
  attempt.identical_same = same_row.find("no significant difference") != std::string::npos &&
                           same_row.find("same") != std::string::npos;
  attempt.interval = slower_interval(row_text(attempt.table, "3"));
  return attempt;
}

// `holds(interval)` says whether a try is right; a second try is made when the first is not.
VerdictTry verdict_with_retry(const TempDir& dir, const std::string& slowdown,
                              const std::function<bool(const std::vector<double>&)>& holds) {
  VerdictTry attempt = compare_identical_and_slowed(dir / "cmp", slowdown);
  if (!attempt.identical_same || !holds(attempt.interval)) {
    std::cerr << "first compare missed, running it again:\n" << attempt.table;
    attempt = compare_identical_and_slowed(dir / "again", slowdown);
  }
  return attempt;
}

// In CI, beside other tests: a 30% wait. On this 2-core machine a core spinning for a share of
// a step also slows the step's work, so the measured ratio lands above 1.3 at times; the check
// is that the slowdown is seen and not wildly overstated.
TEST(CompareVerdictRun, IdenticalVariantsAreTheSameAndOneSlowedOnPurposeIsCalledSlower) {
  TempDir dir;
  const VerdictTry attempt =
      verdict_with_retry(dir, "0.3", [](const std::vector<double>& interval) {
        return interval.size() == 2 && interval[0] > 1.0 && interval[0] <= 1.3 * 1.3;
      });
  const std::string& table = attempt.table;
  EXPECT_HAS(table, "speed vs ref");
  // Five runs each, interleaved: run-1 .. run-5 under every variant's folder.
  for (const char* folder : {"1-0", "2-0", "3-0.3"}) {
    for (int run = 1; run <= 5; ++run) {
      EXPECT_TRUE(
          fs::exists(dir / "cmp" / folder / ("run-" + std::to_string(run)) / "metrics.jsonl"))
          << folder << " run " << run;
    }
  }
  EXPECT_TRUE(attempt.identical_same) << table;
  ASSERT_EQ(attempt.interval.size(), 2u) << table;
  EXPECT_GT(attempt.interval[0], 1.0) << table;
  EXPECT_LE(attempt.interval[0], 1.3 * 1.3) << table;
  // The step time is a median with its interval.
  EXPECT_TRUE(
      std::regex_search(row_text(table, "1"), std::regex(R"([0-9.]+ \[[0-9.]+, [0-9.]+\])")))
      << table;
}

// The acceptance's 10%: called slower with an interval that holds 1.10. On a quiet machine
// (label machine: CI runs beside other tests, where the intervals of 5 one-second runs widen to
// +-10% and a 10% difference is not always told from noise). Six compares in a row here gave
// 1.16x [1.10, 1.23], 1.08x [1.02, 1.15], 1.11x [1.08, 1.13], 1.12x [1.10, 1.13],
// 1.11x [1.07, 1.16] and 1.12x [1.09, 1.15].
TEST(FloorCompareVerdictRun, OneSlowedByTenPercentIsCalledSlowerWithAnIntervalHoldingIt) {
  TempDir dir;
  const auto holds_ten_percent = [](const std::vector<double>& interval) {
    return interval.size() == 2 && interval[0] > 1.0 && interval[0] <= 1.10 && 1.10 <= interval[1];
  };
  const VerdictTry attempt = verdict_with_retry(dir, "0.1", holds_ten_percent);
  EXPECT_TRUE(attempt.identical_same) << attempt.table;
  EXPECT_TRUE(holds_ten_percent(attempt.interval)) << attempt.table;
}

TEST(CompareBaseline, PassesAnUnchangedRunAndFailsASlowerOrNumericallyDifferentOne) {
  TempDir dir;
  const fs::path baseline = dir / "baseline.json";
  // One variant, the recipe itself: later commands change it with --set under the same label.
  auto saved =
      run_host(paced_compare(dir / "saved", {}, 3, {"--save-baseline", baseline.string()}));
  ASSERT_EQ(saved.exit_code, 0) << describe(saved);
  ASSERT_TRUE(fs::exists(baseline));
  // A 25% threshold leaves the machine's drift between two commands out of the verdict (an
  // unchanged build has measured 1.12x slower [1.07, 1.17] a minute after its baseline here);
  // the seeded regression (twice the work's time: between two commands, 3 runs a side, a
  // slowdown of 30% was lost in the machine's drift once) is well beyond it.
  const std::vector<std::string> against = {"--against", baseline.string(), "--noise-threshold",
                                            "0.25"};
  auto again = run_host(paced_compare(dir / "again", {}, 3, against));
  EXPECT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_HAS(again.out, "fashion_mnist_mlp.toml: ");
  EXPECT_HAS(again.out, "losses the same");
  EXPECT_EQ(again.out.find("REGRESSION"), std::string::npos) << again.out;

  std::vector<std::string> slowed_args = against;
  slowed_args.insert(slowed_args.end(), {"--set", "model.slowdown=1"});
  auto slowed = run_host(paced_compare(dir / "slowed", {}, 3, slowed_args));
  EXPECT_EQ(slowed.exit_code, 1) << describe(slowed);
  EXPECT_HAS(slowed.out, "x slower [");
  EXPECT_HAS(slowed.out, "REGRESSION");
  EXPECT_HAS(slowed.err, "trainyard: error: compare: a variant regressed against");

  std::vector<std::string> other_args = against;
  other_args.insert(other_args.end(), {"--set", "optimizer.lr=0.01"});
  auto other = run_host(paced_compare(dir / "other", {}, 1, other_args));
  EXPECT_EQ(other.exit_code, 1) << describe(other);
  EXPECT_HAS(other.out, "losses differ: loss ");
}

// A layout sweep on 4 processes: fsdp over all four, ddp over all four, pipeline 2 x dp 2 and
// tp 2 x dp 2, each launched on what it needs, losses and step times side by side. The same
// global batch (4 data-parallel ranks x 4, or 2 x 8) makes the first two and the last two
// numerically the same runs.
TEST(CompareLayouts, ASweepRunsEveryLayoutOnItsProcessesSideBySide) {
  TempDir dir;
  std::vector<std::string> args = {
      "compare",
      "recipes/gpt_text.toml",
      "--nproc",
      "4",
      "--steps",
      "6",
      "--output",
      (dir / "cmp").string(),
      "--vary",
      "parallel=strategy.plugin=fsdp | strategy.plugin=ddp | "
      "strategy.plugin=pipeline,pp=2,loader.batch_size=8 | strategy.plugin=ddp,tp=2,"
      "loader.batch_size=8"};
  for (const std::string& set : std::vector<std::string>{
           "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "dataset.seq_len=32",
           "loader.batch_size=4", "run.eval=false", "run.threads=1", "run.log_every=2",
           "dataset.path=" + (source_dir() / "docs" / "multi-process.md").string(),
           "dataset.cache=" + (dir / "cache").string()}) {
    args.insert(args.end(), {"--set", set});
  }
  auto result = run_host(args);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const std::string table = read_text(dir / "cmp" / "table.txt");
  for (const char* number : {"1", "2", "3", "4"}) {
    EXPECT_HAS(row_text(table, number), " ok ") << table;
  }
  EXPECT_HAS(result.out,
             "parallel=strategy.plugin=pipeline,pp=2,loader.batch_size=8 on 4 processes");
  EXPECT_TRUE(fs::exists(dir / "cmp" / "3-strategy.plugin_pipeline_pp_2_loader.batch_size_8" /
                         "metrics.rank3.jsonl"))
      << "four ranks' metrics";
  EXPECT_HAS(row_text(table, "2"), "same") << table;  // ddp 4 is fsdp 4's run
  EXPECT_HAS(table, "numerics");
  EXPECT_HAS(table, "speed vs ref");

  // Its report, with the columns of three groups' collectives, fits a window of 1000 and of
  // 1600 pixels in Chromium: no column clipped, no cell's text spilling out, no sideways scroll.
  auto layout = run_command(
      {"python3", (source_dir() / "tools" / "compare" / "check_report_layout.py").string(),
       (dir / "cmp" / "report.html").string(), "--widths", "1000,1600"});
  EXPECT_EQ(layout.exit_code, 0) << describe(layout);
  EXPECT_HAS(layout.out, "1000 px: ok");
  EXPECT_HAS(layout.out, "1600 px: ok");
}

// Utilisation is the FLOPs of the whole step over the time and every rank's peak, whatever the
// strategy: the pipeline on pp 1 (every rank one stage of the whole model) and ddp, on the same 2
// ranks, report the same mfu for the same throughput, interval by interval. (Counted from the
// first model a rank built, the pipeline's was the empty stage it builds to learn the block
// names: a quarter of ddp's.) Its report draws the simulated and the measured schedule at the
// same micro-batch count.
TEST(CompareReportFigures, PipelineMfuEqualsDdpsAtEqualThroughput) {
  TempDir dir;
  std::vector<std::string> args = {"compare",  "recipes/fashion_mnist_mlp.toml",
                                   "--nproc",  "2",
                                   "--steps",  "20",
                                   "--output", (dir / "cmp").string(),
                                   "--vary",   "strategy.plugin=ddp,pipeline"};
  for (const char* set : {"parallel.pp=1", "run.eval=false", "run.threads=1", "run.log_every=5",
                          "run.peak_tflops=1"}) {
    args.insert(args.end(), {"--set", set});
  }
  auto result = run_host(args);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  // mfu / samples_per_s per interval: the FLOPs per sample over the peak, equal for both.
  const auto flops_share = [&](const std::string& folder) {
    std::vector<double> shares;
    for (const auto& line :
         of_phase(read_metrics(dir / "cmp" / folder / "metrics.rank0.jsonl"), "train")) {
      shares.push_back(line.at("mfu") / line.at("samples_per_s"));
    }
    return shares;
  };
  const std::vector<double> ddp = flops_share("1-ddp");
  const std::vector<double> pipeline = flops_share("2-pipeline");
  ASSERT_EQ(ddp.size(), 4u);
  ASSERT_EQ(pipeline.size(), ddp.size());
  for (std::size_t i = 0; i < ddp.size(); ++i) {
    EXPECT_NEAR(pipeline[i] / ddp[i], 1.0, 0.02) << "interval " << i;
  }
  // The report simulates the pipeline variant's schedule at the micro-batch count it measured.
  const std::string html = read_text(dir / "cmp" / "report.html");
  std::smatch simulated, measured;
  ASSERT_TRUE(std::regex_search(html, simulated,
                                std::regex(R"(Simulated: 1f1b, 1 rank, (\d+) micro-batch)")));
  ASSERT_TRUE(std::regex_search(
      html, measured, std::regex(R"(Measured: step \d+, 1f1b, 1 rank, (\d+) micro-batch)")));
  EXPECT_EQ(simulated[1].str(), measured[1].str());
}

TEST(CompareTest, BadRepeatsLayoutsAndBaselinesAreOneLineRefusals) {
  TempDir dir;
  const std::vector<std::string> base = {"compare", "recipes/fashion_mnist_mlp.toml", "--output",
                                         (dir / "cmp").string()};
  const auto refused = [&](std::vector<std::string> more, const std::string& message) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    auto result = run_host(args);
    EXPECT_NE(result.exit_code, 0) << describe(result);
    EXPECT_HAS(result.err, message);
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_FALSE(fs::exists(dir / "cmp" / "table.txt"));
  };
  refused({"--repeat", "0"}, "trainyard: error: compare: --repeat must be >= 1");
  refused({"--noise-threshold", "1.5"}, "compare: --noise-threshold must be in [0, 1)");
  refused({"--nproc", "3", "--vary", "parallel=pp=2"},
          "compare: layout 'parallel=pp=2' needs a multiple of 2 processes (pp x dp_replicate x "
          "tp), but --nproc is 3");
  refused({"--nproc", "2", "--vary", "parallel=dp_shard=2,tp=2"},
          "compare: layout 'parallel=dp_shard=2,tp=2' runs 4 processes, but --nproc is 2");
  refused({"--vary", "parallel=tp"}, "layout 'tp': expected key=value pairs separated by ','");
  const fs::path other = dir.write("other.json", R"({"format": "trainyard-compare-baseline",
    "version": 1, "title": "gpt_text", "variants": []})");
  refused({"--against", other.string()},
          "compare: --against " + other.string() +
              ": the baseline compares 'gpt_text', this compare runs 'fashion_mnist_mlp'");
  const fs::path broken = dir.write("broken.json", R"({"format": "trainyard-compare-baseline",)");
  refused({"--against", broken.string()},
          "compare: baseline " + broken.string() + ": invalid JSON");
  const fs::path foreign = dir.write("foreign.json", R"({"variants": []})");
  refused({"--against", foreign.string()}, "not a compare baseline");
}

}  // namespace
}  // namespace trainyard::testing
