// `trainyard compare`: variants of a tiny recipe side by side, the table, the HTML report (parsed
// and rendered by headless Chromium), failing variants and bad options.

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "compare_report.hpp"
#include "metrics_file.hpp"
#include "test_support.hpp"
#include "trainyard/parallel/declared_schedule.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"
#include "trainyard/parallel/pipeline_timeline.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// A few logged intervals of the MLP: seconds per variant.
std::vector<std::string> tiny_compare(const fs::path& output, std::vector<std::string> varies,
                                      int steps = 24) {
  std::vector<std::string> args = {"compare", "recipes/fashion_mnist_mlp.toml"};
  for (auto& vary : varies) {
    args.push_back("--vary");
    args.push_back(vary);
  }
  for (const char* set : {"run.log_every=4", "run.eval_max_batches=2", "checkpoint.keep=1"}) {
    args.push_back("--set");
    args.push_back(set);
  }
  args.insert(args.end(), {"--steps", std::to_string(steps), "--output", output.string()});
  return args;
}

std::string fixed4(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.4f", value);
  return text;
}

// The table's row of variant `number` ("1", "2", ...): its cells split at runs of spaces.
std::vector<std::string> row_of(const std::string& table, const std::string& number) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream cells(line);
    std::string first;
    cells >> first;
    if (first != number) continue;
    std::vector<std::string> out = {first};
    for (std::string cell; cells >> cell;) out.push_back(cell);
    return out;
  }
  return {};
}

struct Curve {
  std::vector<std::pair<double, double>> points;  // x, y in the SVG's pixels
  std::string colour;
};

// The loss polylines of the report, by variant number.
std::map<int, Curve> curves_of(const std::string& html) {
  static const std::regex polyline(
      R"re(<polyline class="loss-curve" data-variant="(\d+)"[^>]*stroke="(#[0-9a-f]{6})"[^>]*points="([^"]*)")re");
  std::map<int, Curve> out;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), polyline);
       it != std::sregex_iterator(); ++it) {
    Curve curve;
    curve.colour = (*it)[2];
    std::istringstream points((*it)[3].str());
    for (std::string pair; points >> pair;) {
      auto comma = pair.find(',');
      curve.points.emplace_back(std::stod(pair.substr(0, comma)),
                                std::stod(pair.substr(comma + 1)));
    }
    out[std::stoi((*it)[1])] = curve;
  }
  return out;
}

TEST(CompareTest, TwoVariantsGiveTheTableAndAReportWithBothCurves) {
  TempDir dir;
  const fs::path output = dir / "cmp";
  auto result = run_host(tiny_compare(output, {"optimizer.lr=1e-3,4e-3"}));
  ASSERT_EQ(result.exit_code, 0) << describe(result);

  // Each variant ran as its own run, into its own folder, with its own metrics.
  const fs::path first_dir = output / "1-1e-3", second_dir = output / "2-4e-3";
  auto first = read_metrics(first_dir / "metrics.jsonl");
  auto second = read_metrics(second_dir / "metrics.jsonl");
  auto first_train = of_phase(first, "train"), second_train = of_phase(second, "train");
  ASSERT_EQ(first_train.size(), 6u);
  ASSERT_EQ(second_train.size(), 6u);
  EXPECT_EQ(of_phase(first, "summary").at(0).at("steps"), 24);
  EXPECT_NE(first_train.back().at("loss"), second_train.back().at("loss"))
      << "the learning rates differ, so the runs do";

  // The table, printed and written: both variants, their final losses, their eval accuracy,
  // and the largest loss difference at a common step.
  const std::string table = read_text(output / "table.txt");
  EXPECT_HAS(result.out, table);
  for (const char* heading : {"variant", "step ms", "data ms", "samples/s", "final loss",
                              "eval metric", "max |loss diff|"}) {
    EXPECT_HAS(table, heading);
  }
  // The engine's optional figures get a column exactly when the runs record them.
  const std::map<std::string, std::string> optional_columns = {{"h2d_ms", "h2d ms"},
                                                               {"forward_ms", "fwd ms"},
                                                               {"backward_ms", "bwd ms"},
                                                               {"comm_wait_ms", "comm ms"},
                                                               {"optimizer_ms", "opt ms"},
                                                               {"tokens_per_s", "tokens/s"},
                                                               {"mfu", "mfu"},
                                                               {"memory_peak_bytes", "peak mem"}};
  const std::string heading = table.substr(0, table.find('\n'));
  for (const auto& [key, title] : optional_columns) {
    EXPECT_EQ(first_train.back().has(key), heading.find(title) != std::string::npos) << key;
  }
  auto row1 = row_of(table, "1"), row2 = row_of(table, "2");
  ASSERT_GE(row1.size(), 8u) << table;
  ASSERT_GE(row2.size(), 8u) << table;
  EXPECT_EQ(row1[1], "optimizer.lr=1e-3");
  EXPECT_EQ(row2[1], "optimizer.lr=4e-3");
  EXPECT_EQ(row1[2], "ok");
  EXPECT_EQ(row2[2], "ok");
  const double final1 = of_phase(first, "summary").at(0).at("final_train_loss");
  const double final2 = of_phase(second, "summary").at(0).at("final_train_loss");
  EXPECT_NE(std::find(row1.begin(), row1.end(), fixed4(final1)), row1.end()) << table;
  EXPECT_NE(std::find(row2.begin(), row2.end(), fixed4(final2)), row2.end()) << table;
  const double accuracy2 = of_phase(second, "eval").back().at("accuracy");
  EXPECT_HAS(table, "accuracy " + fixed4(accuracy2));
  EXPECT_EQ(row1.back(), "ref");  // the speed verdict's reference
  double largest = 0;
  std::int64_t at_step = 0;
  for (std::size_t i = 0; i < first_train.size(); ++i) {
    ASSERT_EQ(first_train[i].at("step"), second_train[i].at("step"));
    const double difference = std::abs(first_train[i].at("loss") - second_train[i].at("loss"));
    if (difference > largest) {
      largest = difference;
      at_step = static_cast<std::int64_t>(first_train[i].at("step"));
    }
  }
  char expected[64];
  std::snprintf(expected, sizeof expected, "%.3g", largest);
  // "<largest> @<step>", then the numerics and the speed verdict.
  const auto at = std::find_if(row2.begin(), row2.end(),
                               [](const std::string& cell) { return cell.starts_with("@"); });
  ASSERT_TRUE(at != row2.end() && at != row2.begin()) << table;
  EXPECT_EQ(*(at - 1), expected) << table;
  EXPECT_EQ(*at, "@" + std::to_string(at_step)) << table;
  ASSERT_NE(at + 1, row2.end()) << table;
  EXPECT_EQ(*(at + 1), "differs") << table;  // another learning rate: another run

  // The report: one polyline per variant with a point per logged interval, drawn so that a
  // lower loss is lower on the page, and nothing fetched from elsewhere.
  const std::string html = read_text(output / "report.html");
  auto curves = curves_of(html);
  ASSERT_EQ(curves.size(), 2u) << html.substr(0, 3000);
  const std::vector<std::vector<MetricLine>*> trains = {&first_train, &second_train};
  for (int variant : {1, 2}) {
    const auto& curve = curves.at(variant);
    const auto& train = *trains[static_cast<std::size_t>(variant - 1)];
    ASSERT_EQ(curve.points.size(), train.size()) << "variant " << variant;
    for (std::size_t i = 1; i < curve.points.size(); ++i) {
      EXPECT_GT(curve.points[i].first, curve.points[i - 1].first) << "steps run left to right";
      for (std::size_t j = 0; j < i; ++j) {
        const double loss_i = train[i].at("loss"), loss_j = train[j].at("loss");
        const double y_i = curve.points[i].second, y_j = curve.points[j].second;
        if (std::abs(loss_i - loss_j) > 1e-3) {
          EXPECT_EQ(loss_i > loss_j, y_i < y_j) << i << " vs " << j;
        }
      }
    }
  }
  EXPECT_NE(curves.at(1).colour, curves.at(2).colour);
  EXPECT_HAS(html, "optimizer.lr=1e-3");
  EXPECT_HAS(html, "id=\"throughput-chart\"");
  EXPECT_HAS(html, "id=\"step-time-chart\"");
  std::string without_namespaces = std::regex_replace(html, std::regex("xmlns=\"[^\"]*\""), "");
  for (const char* outside : {"http:", "https:", "<script", "<link", "src=", "@import", "url("}) {
    EXPECT_EQ(without_namespaces.find(outside), std::string::npos) << outside;
  }
}

TEST(CompareTest, AFailingVariantIsReportedWithItsErrorAndTheOthersRun) {
  TempDir dir;
  const fs::path output = dir / "cmp";
  auto result = run_host(tiny_compare(output, {"precision.plugin=fp32,no_such_precision"}, 8));
  ASSERT_EQ(result.exit_code, 0) << "one variant finished\n" << describe(result);
  const std::string table = read_text(output / "table.txt");
  auto row1 = row_of(table, "1"), row2 = row_of(table, "2");
  ASSERT_GE(row1.size(), 3u) << table;
  ASSERT_GE(row2.size(), 4u) << table;
  EXPECT_EQ(row1[2], "ok");
  EXPECT_EQ(row2[2], "FAILED");
  // The failed row carries the child's own one-line error.
  const std::string log = read_text(output / "2-no_such_precision" / "output.log");
  std::smatch error;
  ASSERT_TRUE(std::regex_search(log, error, std::regex("trainyard: error: [^\n]*"))) << log;
  EXPECT_HAS(error.str(), "no_such_precision");
  EXPECT_HAS(table, error.str());
  EXPECT_EQ(of_phase(read_metrics(output / "1-fp32" / "metrics.jsonl"), "train").size(), 2u);
  const std::string html = read_text(output / "report.html");
  EXPECT_EQ(curves_of(html).count(1), 1u);
  EXPECT_HAS(html, "no_such_precision");
  EXPECT_HAS(html, "class=\"error\"");
}

TEST(CompareTest, EveryVariantFailingExitsNonZero) {
  TempDir dir;
  auto result = run_host(tiny_compare(dir / "cmp", {"model.plugin=no_model_a,no_model_b"}, 4));
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  const std::string table = read_text(dir / "cmp" / "table.txt");
  EXPECT_EQ(row_of(table, "1").at(2), "FAILED");
  EXPECT_EQ(row_of(table, "2").at(2), "FAILED");
  EXPECT_HAS(table, "no_model_a");
  EXPECT_HAS(table, "no_model_b");
}

TEST(CompareTest, BadVaryIsAOneLineErrorBeforeAnythingRuns) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"precision.plugin", "expected section.key=value1,value2,..."},
      {"precision.plugin=fp32,,bf16", "empty value in the list"},
      {"=fp32", "expected section.key=value1,value2,..."},
      {"precision..plugin=fp32", "bad key"},
      {"model.channels=[16,32", "unbalanced brackets"},
  };
  for (const auto& [vary, message] : cases) {
    auto result = run_host(tiny_compare(dir / "cmp", {vary}, 4));
    EXPECT_NE(result.exit_code, 0) << vary;
    EXPECT_HAS(result.err, "trainyard: error: compare: --vary '" + vary + "': " + message);
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_FALSE(fs::exists(dir / "cmp")) << "nothing ran for " << vary;
  }
  auto twice = run_host(tiny_compare(dir / "cmp", {"optimizer.lr=1e-3", "optimizer.lr=2e-3"}, 4));
  EXPECT_NE(twice.exit_code, 0);
  EXPECT_HAS(twice.err, "trainyard: error: compare: --vary names 'optimizer.lr' twice");
  auto steps = run_host({"compare", "recipes/fashion_mnist_mlp.toml", "--steps", "0"});
  EXPECT_NE(steps.exit_code, 0);
  EXPECT_HAS(steps.err, "--steps must be >= 1");
}

TEST(CompareTest, ListValuesAndSeveralAxesMakeTheCartesianProduct) {
  // Only the labels and folders are checked: every variant fails at once on a missing model.
  TempDir dir;
  auto result = run_host(tiny_compare(
      dir / "cmp", {"model.hidden=[8,8],[4]", "model.plugin=no_model_x,no_model_y"}, 4));
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  const std::string table = read_text(dir / "cmp" / "table.txt");
  EXPECT_HAS(table, "model.hidden=[8,8] model.plugin=no_model_x");
  EXPECT_HAS(table, "model.hidden=[8,8] model.plugin=no_model_y");
  EXPECT_HAS(table, "model.hidden=[4] model.plugin=no_model_x");
  EXPECT_HAS(table, "model.hidden=[4] model.plugin=no_model_y");
  EXPECT_TRUE(row_of(table, "5").empty());
  EXPECT_TRUE(fs::exists(dir / "cmp" / "4-_4_-no_model_y" / "output.log"));
}

TEST(CompareTest, NprocRunsEachVariantWithTheLauncher) {
  TempDir dir;
  auto args = tiny_compare(dir / "cmp", {"strategy.plugin=ddp,single"}, 8);
  args.insert(args.end(), {"--nproc", "2"});
  auto result = run_host(args);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const std::string table = read_text(dir / "cmp" / "table.txt");
  EXPECT_EQ(row_of(table, "1").at(2), "ok") << table;
  // The collectives of the ranks' one group (dp and dp_shard) get their columns.
  const std::string heading = table.substr(0, table.find('\n'));
  EXPECT_HAS(heading, "dp/dp_shard calls");
  EXPECT_HAS(heading, "dp/dp_shard bytes");
  EXPECT_EQ(of_phase(read_metrics(dir / "cmp" / "1-ddp" / "metrics.rank0.jsonl"), "train").size(),
            2u);
  EXPECT_TRUE(fs::exists(dir / "cmp" / "1-ddp" / "metrics.rank1.jsonl"));
  // The ranks' output lines carry "[rank R] "; the table shows the error itself.
  EXPECT_EQ(row_of(table, "2").at(2), "FAILED") << table;
  // Refused by the strategy's setup on whichever rank reports first.
  EXPECT_HAS(table, "2  strategy.plugin=single  FAILED  trainyard: error: rank ");
  EXPECT_HAS(table, ": strategy 'single' runs one process, but this run has 2 processes");
}

TEST(CompareTest, AVariantPastTheTimeoutIsStoppedAndTheOthersRun) {
  // Rank 1 of every variant stops at step 3 and never returns (a test hook): variant 1 ends
  // before it, variant 2 would wait out its 10-minute collective timeout but for --timeout.
  TempDir dir;
  const fs::path output = dir / "cmp";
  std::vector<std::string> argv = {host_binary().string(),
                                   "compare",
                                   "recipes/fashion_mnist_mlp.toml",
                                   "--vary",
                                   "run.max_steps=2,40",
                                   "--nproc",
                                   "2",
                                   "--timeout",
                                   "10",
                                   "--output",
                                   output.string()};
  for (const char* set : {"strategy.plugin=ddp", "comm.timeout_s=600", "run.log_every=1",
                          "run.eval_max_batches=2", "checkpoint.keep=1"}) {
    argv.push_back("--set");
    argv.push_back(set);
  }
  const auto started = std::chrono::steady_clock::now();
  auto result = run_command(argv, source_dir(), 300,
                            {"TRAINYARD_TEST_FAIL_RANK=1", "TRAINYARD_TEST_FAIL_AT_STEP=3",
                             "TRAINYARD_TEST_FAIL_MODE=hang"});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(result.exit_code, 0) << "variant 1 finished\n" << describe(result);
  EXPECT_LT(seconds, 120) << describe(result);
  const std::string table = read_text(output / "table.txt");
  EXPECT_EQ(row_of(table, "1").at(2), "ok") << table;
  EXPECT_EQ(row_of(table, "2").at(2), "FAILED") << table;
  EXPECT_HAS(table, "trainyard: error: compare: stopped after the --timeout of 10 s");
  // The launcher was stopped, and stopped its ranks: it forwards the signal to them.
  EXPECT_HAS(read_text(output / "2-40" / "output.log"), "forwarding to the ranks");
  auto negative = run_host({"compare", "recipes/fashion_mnist_mlp.toml", "--timeout", "-1"});
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_HAS(negative.err, "trainyard: error: compare: --timeout must be >= 0 seconds");
}

TEST(CompareTest, SeveralRecipesAreVariantsNamedByTheirFiles) {
  TempDir dir;
  auto result =
      run_host({"compare", "recipes/fashion_mnist_mlp.toml", "recipes/fashion_mnist_cnn.toml",
                "--vary", "model.plugin=no_model_z", "--output", (dir / "cmp").string()});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  const std::string table = read_text(dir / "cmp" / "table.txt");
  EXPECT_HAS(table, "1  fashion_mnist_mlp.toml model.plugin=no_model_z  FAILED");
  EXPECT_HAS(table, "2  fashion_mnist_cnn.toml model.plugin=no_model_z  FAILED");
  EXPECT_TRUE(fs::exists(dir / "cmp" / "2-fashion_mnist_cnn-no_model_z" / "output.log"));
  EXPECT_HAS(read_text(dir / "cmp" / "report.html"), "fashion_mnist_mlp_vs_fashion_mnist_cnn");
}

struct TimelineBox {
  int rank = 0;
  std::string kind;
  int stage = 0;
  int micro_batch = 0;
  double x = 0, width = 0;
};

// What one pipeline timeline SVG of the report draws.
struct DrawnTimeline {
  int count = 0;  // SVGs of this variant and kind in the page (1 when drawn)
  std::set<int> rows;
  std::vector<TimelineBox> boxes;
  std::vector<std::string> labels;
  std::map<int, std::string> idle;  // rank: the note at the row's right
};

DrawnTimeline timeline_of(const std::string& html, int variant, const std::string& kind) {
  const std::string open = "<svg class=\"pipeline-timeline\" data-timeline=\"" + kind +
                           "\" data-variant=\"" + std::to_string(variant) + "\"";
  DrawnTimeline out;
  for (auto at = html.find(open); at != std::string::npos; at = html.find(open, at + 1)) {
    ++out.count;
  }
  const auto begin = html.find(open);
  if (begin == std::string::npos) return out;
  const std::string svg = html.substr(begin, html.find("</svg>", begin) - begin);
  static const std::regex row(R"re(<g class="pipeline-rank" data-rank="(\d+)">)re");
  static const std::regex box(
      R"re(<rect class="pipeline-action" data-rank="(\d+)" data-kind="(\w+)" data-stage="(\d+)" data-micro-batch="(\d+)" x="([-0-9.]+)" y="[-0-9.]+" width="([-0-9.]+)")re");
  static const std::regex label(R"re(<text class="pipeline-label"[^>]*>([^<]*)</text>)re");
  static const std::regex idle(
      R"re(<text class="pipeline-idle" data-rank="(\d+)"[^>]*>([^<]*)<)re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), row); it != std::sregex_iterator();
       ++it) {
    out.rows.insert(std::stoi((*it)[1]));
  }
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), box); it != std::sregex_iterator();
       ++it) {
    out.boxes.push_back({std::stoi((*it)[1]), (*it)[2], std::stoi((*it)[3]), std::stoi((*it)[4]),
                         std::stod((*it)[5]), std::stod((*it)[6])});
  }
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator();
       ++it) {
    out.labels.push_back((*it)[1]);
  }
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), idle); it != std::sregex_iterator();
       ++it) {
    out.idle[std::stoi((*it)[1])] = (*it)[2];
  }
  return out;
}

std::size_t boxes_on(const DrawnTimeline& timeline, int rank) {
  return static_cast<std::size_t>(
      std::count_if(timeline.boxes.begin(), timeline.boxes.end(),
                    [&](const TimelineBox& b) { return b.rank == rank; }));
}

std::string percent1(double share) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100 * share);
  return text;
}

// A measured 1F1B step over 2 ranks and 4 micro-batches, written as a 2-process run does: the
// schedule simulated with forwards of 3 and backwards of 7 units, 100 us each, rank 1 starting
// 12.5 us late and rank 0's last backward 250 us longer. Communication takes no time.
std::vector<RankTimeline> write_measured_one_f_one_b(const fs::path& run_dir) {
  const PipelineSchedule schedule = build_pipeline_schedule("1f1b", {2, 4, 1});
  PipelineCosts costs;
  costs.forward = 3;
  costs.backward = 7;
  const PipelineSimulation simulation = simulate_schedule(schedule, costs);
  std::vector<RankTimeline> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    RankTimeline t;
    t.schedule = "1f1b";
    t.ranks = 2;
    t.micro_batches = 4;
    t.step = 3;
    t.rank = rank;
    t.pp_rank = rank;
    for (const auto& timed : simulation.ranks[static_cast<std::size_t>(rank)].actions) {
      const double shift = rank == 1 ? 12.5 : 0;
      t.actions.push_back({timed.action, timed.start * 100 + shift, timed.end * 100 + shift});
    }
    if (rank == 0) t.actions.back().end_us += 250;
    write_measured_timeline(measured_timeline_file(run_dir, rank, 2), t);
    ranks.push_back(std::move(t));
  }
  return ranks;
}

TEST(CompareReportTest, PipelineVariantsDrawTheirSimulatedAndMeasuredSchedules) {
  TempDir dir;
  // Variant 1 declared 1F1B on 2 ranks and measured its step; variant 2 (no declaration: a ddp
  // run, say) has a timeline file that is not its run's; variant 3 declared an interleaved
  // schedule and measured nothing; variant 4 declared a schedule that does not build and left a
  // broken timeline; variant 5's declaration does not read.
  write_declared_schedule(dir / "1-pipe", {"1f1b", {2, 4, 1}});
  const std::vector<RankTimeline> measured = write_measured_one_f_one_b(dir / "1-pipe");
  write_measured_one_f_one_b(dir / "2-ddp");
  write_declared_schedule(dir / "3-interleaved", {"interleaved_1f1b", {2, 4, 2}});
  write_declared_schedule(dir / "4-bad", {"x<y>", {2, 4, 1}});
  const fs::path broken = dir.write("4-bad/pipeline_timeline.json", "{\"schedule\":");
  const fs::path undeclared =
      dir.write("5-unread/pipeline_schedule.json", "{\"schedule\":\"1f1b\",\"ranks\":0}");

  CompareReport report;
  report.title = "pipelines";
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"strategy.plugin=pipeline", "1-pipe"},
      {"strategy.plugin=ddp", "2-ddp"},
      {"interleaved <b>&amp", "3-interleaved"},
      {"bad schedule", "4-bad"},
      {"unread", "5-unread"}};
  for (const auto& [label, folder] : variants) {
    VariantResult v;
    v.label = label;
    v.folder = folder;
    v.succeeded = true;
    v.pipeline = pipeline_variant(dir / folder);
    report.variants.push_back(std::move(v));
  }
  ASSERT_TRUE(report.variants[0].pipeline.has_value());
  EXPECT_FALSE(report.variants[1].pipeline.has_value()) << "no schedule declared";
  ASSERT_TRUE(report.variants[2].pipeline.has_value());
  ASSERT_TRUE(report.variants[2].pipeline->declared.has_value());
  EXPECT_EQ(report.variants[2].pipeline->declared->shape.virtual_stages, 2);
  ASSERT_TRUE(report.variants[4].pipeline.has_value());
  EXPECT_FALSE(report.variants[4].pipeline->declared.has_value());
  const std::string html = render_html(report);

  EXPECT_HAS(html, "<h2>Pipeline schedules</h2>");
  EXPECT_HAS(html, "<section class=\"pipeline\" id=\"pipeline-variant-1\">");
  EXPECT_EQ(html.find("id=\"pipeline-variant-2\""), std::string::npos);
  EXPECT_EQ(timeline_of(html, 2, "simulated").count, 0);
  EXPECT_EQ(timeline_of(html, 2, "measured").count, 0);

  // Simulated 1F1B, p = 2, m = 4: per rank four forwards and four backwards, every
  // (kind, micro-batch) once, labelled; with unit costs both ranks idle (p-1)/(m+p-1) = 20%.
  const DrawnTimeline simulated = timeline_of(html, 1, "simulated");
  EXPECT_EQ(simulated.count, 1);
  EXPECT_EQ(simulated.rows, (std::set<int>{0, 1}));
  for (int rank : {0, 1}) {
    std::set<std::tuple<std::string, int, int>> seen;
    for (const auto& b : simulated.boxes) {
      if (b.rank != rank) continue;
      EXPECT_EQ(b.stage, rank);
      EXPECT_TRUE(seen.insert({b.kind, b.stage, b.micro_batch}).second) << b.kind;
      EXPECT_TRUE(b.kind == "Forward" || b.kind == "Backward") << b.kind;
      EXPECT_GT(b.width, 0);
    }
    EXPECT_EQ(seen.size(), 8u) << "rank " << rank;
    EXPECT_EQ(simulated.idle.at(rank), "idle 20.0%");
  }
  EXPECT_EQ(simulated.boxes.size(), 16u);
  EXPECT_EQ(simulated.labels.size(), 16u);
  EXPECT_NE(std::find(simulated.labels.begin(), simulated.labels.end(), "F3"),
            simulated.labels.end());
  EXPECT_HAS(html, "mean 20.0%; formula (p-1)/(m+p-1) = 20.0%.");

  // Measured: one box per compute action of each rank's file (its sends and receives are not
  // boxes), placed and sized in proportion to the recorded times, and each rank's idle share.
  const DrawnTimeline drawn = timeline_of(html, 1, "measured");
  EXPECT_EQ(drawn.count, 1);
  EXPECT_EQ(drawn.rows, (std::set<int>{0, 1}));
  EXPECT_EQ(drawn.boxes.size(), 16u);
  double first_start = 1e300, last_end = 0;
  std::vector<double> busy(2, 0.0);
  std::map<std::tuple<int, std::string, int>, std::pair<double, double>> times;
  for (int rank : {0, 1}) {
    std::size_t compute = 0;
    for (const auto& m : measured[static_cast<std::size_t>(rank)].actions) {
      if (!is_compute(m.action.kind)) continue;
      ++compute;
      first_start = std::min(first_start, m.start_us);
      last_end = std::max(last_end, m.end_us);
      busy[static_cast<std::size_t>(rank)] += m.end_us - m.start_us;
      times[{rank, action_kind_name(m.action.kind), m.action.micro_batch}] = {m.start_us, m.end_us};
    }
    EXPECT_LT(compute, measured[static_cast<std::size_t>(rank)].actions.size());
    EXPECT_EQ(boxes_on(drawn, rank), compute) << "rank " << rank;
  }
  ASSERT_EQ(drawn.boxes.size(), times.size());
  const TimelineBox& a = drawn.boxes.front();
  const auto [a_start, a_end] = times.at({a.rank, a.kind, a.micro_batch});
  const TimelineBox& b = drawn.boxes.back();
  const auto [b_start, b_end] = times.at({b.rank, b.kind, b.micro_batch});
  ASSERT_NE(a_start, b_start);
  const double scale = (b.x - a.x) / (b_start - a_start), origin = a.x - a_start * scale;
  EXPECT_GT(scale, 0);
  for (const auto& box : drawn.boxes) {
    const auto [start, end] = times.at({box.rank, box.kind, box.micro_batch});
    EXPECT_NEAR(box.x, origin + start * scale, 0.02) << box.kind << box.micro_batch;
    EXPECT_NEAR(box.width, (end - start) * scale, 0.02) << box.kind << box.micro_batch;
  }
  std::vector<std::string> idle;
  for (int rank : {0, 1}) {
    idle.push_back(percent1(1 - busy[static_cast<std::size_t>(rank)] / (last_end - first_start)));
    EXPECT_EQ(drawn.idle.at(rank), "idle " + idle.back());
  }
  EXPECT_NE(idle[0], idle[1]) << "the ranks' shares differ by construction";
  EXPECT_HAS(html, "rank 0 " + idle[0] + ", rank 1 " + idle[1]);
  EXPECT_HAS(html, "formula (p-1)/(m+p-1) = 20.0% (mean costs F=300 B=731 us).");

  // The terminal's lines: one per rank of the measured variant, and the broken file's error.
  const std::string console = format_pipeline_idle_shares(report.variants);
  for (int rank : {0, 1}) {
    EXPECT_HAS(console, "1. strategy.plugin=pipeline: pipeline rank " + std::to_string(rank) +
                            " idle " + idle[static_cast<std::size_t>(rank)] +
                            " measured (1f1b, step 3), formula (p-1)/(m+p-1) = 20.0%\n");
  }
  EXPECT_HAS(console,
             "4. bad schedule: pipeline timeline: " + broken.string() + ": invalid JSON at byte");
  EXPECT_EQ(std::count(console.begin(), console.end(), '\n'), 3) << console;

  // Interleaved, 2 stages per rank: labels carry the stage; nothing measured.
  const DrawnTimeline interleaved = timeline_of(html, 3, "simulated");
  EXPECT_EQ(interleaved.rows, (std::set<int>{0, 1}));
  EXPECT_EQ(boxes_on(interleaved, 0), 16u);
  EXPECT_EQ(boxes_on(interleaved, 1), 16u);
  for (const char* expected : {"0F0", "2F0", "1F3", "3B3"}) {
    EXPECT_NE(std::find(interleaved.labels.begin(), interleaved.labels.end(), expected),
              interleaved.labels.end())
        << expected;
  }
  EXPECT_EQ(timeline_of(html, 3, "measured").count, 0);
  EXPECT_HAS(html, "Measured: the run recorded no pipeline timeline in 3-interleaved.");

  // Text from recipes and labels is escaped; a schedule that does not build and a broken file
  // are explained, not drawn.
  EXPECT_HAS(html, "3. interleaved &lt;b&gt;&amp;amp</h3>");
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  EXPECT_EQ(timeline_of(html, 4, "simulated").count, 0);
  EXPECT_HAS(html, "x&lt;y&gt;, 2 ranks, 4 micro-batches: the schedule does not build: ");
  EXPECT_EQ(html.find("x<y>"), std::string::npos);
  EXPECT_HAS(html, "Measured: the timeline does not read: " + broken.string());
  EXPECT_HAS(html, "The declared schedule does not read: " + undeclared.string() +
                       ": &quot;ranks&quot; must be an integer in [1, ");
}

TEST(CompareTest, AVariantGetsTheScheduleItsRunDeclaredAndOthersNone) {
  // The bundled pipeline on one rank with its default micro-batch count (one per pipeline rank),
  // and one_rank_schedule, a test strategy of another name that declares 1F1B over its
  // run.grad_accumulation = 2 micro-batches: each section shows what its run declared and
  // measured. A timeline and a declaration left by an earlier compare must not pass for the single
  // variant's.
  TempDir dir;
  const fs::path output = dir / "cmp";
  write_measured_one_f_one_b(output / "1-single");
  write_declared_schedule(output / "1-single", {"gpipe", {2, 4, 1}});
  const fs::path stale = output / "1-single" / "pipeline_timeline.rank0.json";
  ASSERT_TRUE(fs::exists(stale));
  auto args = tiny_compare(output, {"strategy.plugin=single,pipeline,one_rank_schedule"}, 4);
  args.insert(args.end(), {"--set", "run.grad_accumulation=2", "--plugin-path",
                           (test_plugin_folder() / "libone_rank_schedule.so").string()});
  auto result = run_host(args);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_FALSE(fs::exists(stale));
  const std::string html = read_text(output / "report.html");
  EXPECT_EQ(html.find("id=\"pipeline-variant-1\""), std::string::npos);
  EXPECT_HAS(html, "id=\"pipeline-variant-2\"");
  EXPECT_HAS(html, "id=\"pipeline-variant-3\"");
  EXPECT_HAS(html, "<p>Simulated: 1f1b, 1 rank, 1 micro-batch;");
  EXPECT_HAS(html, "<p>Simulated: 1f1b, 1 rank, 2 micro-batches;");
  const DrawnTimeline simulated = timeline_of(html, 3, "simulated");
  EXPECT_EQ(simulated.count, 1);
  EXPECT_EQ(simulated.rows, (std::set<int>{0}));
  EXPECT_EQ(boxes_on(simulated, 0), 4u) << "F0 B0 F1 B1";
  EXPECT_EQ(simulated.idle.at(0), "idle 0.0%");
  // one_rank_schedule measures its first step, the bundled pipeline its third.
  EXPECT_HAS(html, "Measured: step 1, 1f1b, 1 rank, 2 micro-batches;");
  EXPECT_HAS(html, "Measured: step 3, 1f1b, 1 rank, 1 micro-batch;");
  EXPECT_EQ(boxes_on(timeline_of(html, 3, "measured"), 0), 4u);
  EXPECT_HAS(result.out, "3. strategy.plugin=one_rank_schedule: pipeline rank 0 idle ");
}

TEST(CompareTest, APipelineVariantRunOnTwoRanksDrawsItsMeasuredStep) {
  // Two real 2-rank pipelines of a small mlp on synthetic data, each recording step 2: the report
  // draws each measured step with one row per pp rank, one box per compute action of its file,
  // and the idle shares measured_idle_shares gives; the console prints them too.
  TempDir dir;
  const fs::path recipe = dir.write("pipe.toml", R"(name = "pipe"
[run]
seed = 3
eval = false
[loader]
workers = 0
batch_size = 16
[dataset]
plugin = "synthetic"
samples = 256
eval_samples = 16
input_shape = [1, 8, 8]
[model]
plugin = "mlp"
hidden = [32, 16, 16]
[optimizer]
plugin = "adamw"
lr = 0.01
[parallel]
pp = 2
[strategy]
plugin = "pipeline"
micro_batches = 4
record_step = 2
)");
  const fs::path output = dir / "cmp";
  const auto started = std::chrono::steady_clock::now();
  auto result = run_host({"compare", recipe.string(), "--vary",
                          "strategy.schedule=1f1b,zero_bubble", "--nproc", "2", "--steps", "4",
                          "--set", "run.log_every=2", "--output", output.string()});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_LT(seconds, 20) << describe(result);
  const std::string table = read_text(output / "table.txt");
  EXPECT_EQ(row_of(table, "1").at(2), "ok") << table;
  EXPECT_EQ(row_of(table, "2").at(2), "ok") << table;

  const std::string html = read_text(output / "report.html");
  const std::vector<std::pair<std::string, std::size_t>> variants = {{"1f1b", 8u},
                                                                     {"zero_bubble", 12u}};
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& [schedule, compute_per_rank] = variants[i];
    const int number = static_cast<int>(i) + 1;
    const std::string folder = std::to_string(number) + "-" + schedule;
    std::optional<MeasuredPipelineTimeline> measured = read_measured_timeline(output / folder);
    ASSERT_TRUE(measured.has_value()) << folder;
    EXPECT_EQ(measured->schedule, schedule);
    EXPECT_EQ(measured->step, 2);

    const DrawnTimeline drawn = timeline_of(html, number, "measured");
    EXPECT_EQ(drawn.count, 1) << schedule;
    EXPECT_EQ(drawn.rows, (std::set<int>{0, 1})) << schedule;
    const std::vector<double> shares = measured_idle_shares(*measured);
    ASSERT_EQ(shares.size(), 2u);
    for (int rank : {0, 1}) {
      const auto& actions = measured->rank_actions[static_cast<std::size_t>(rank)];
      const auto compute = static_cast<std::size_t>(
          std::count_if(actions.begin(), actions.end(),
                        [](const MeasuredAction& m) { return is_compute(m.action.kind); }));
      EXPECT_EQ(compute, compute_per_rank) << schedule << " rank " << rank;
      EXPECT_EQ(boxes_on(drawn, rank), compute) << schedule << " rank " << rank;
      const std::string idle = percent1(shares[static_cast<std::size_t>(rank)]);
      EXPECT_EQ(drawn.idle.at(rank), "idle " + idle) << schedule;
      EXPECT_HAS(result.out, std::to_string(number) + ". strategy.schedule=" + schedule +
                                 ": pipeline rank " + std::to_string(rank) + " idle " + idle +
                                 " measured (" + schedule + ", step 2)");
    }
    EXPECT_HAS(html, "Measured: step 2, " + schedule + ", 2 ranks, 4 micro-batches;");
  }
}

struct Image {
  std::uint32_t width = 0, height = 0;
  std::vector<std::array<std::uint8_t, 3>> pixels;  // row-major RGB
};

std::uint32_t big_endian(const std::string& bytes, std::size_t at) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i)
    value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

// An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium's screenshots are).
Image decode_png(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    throw std::runtime_error("not a PNG: " + file.string());
  }
  Image image;
  int channels = 0;
  std::string compressed;
  for (std::size_t at = 8; at + 12 <= bytes.size();) {
    const std::uint32_t length = big_endian(bytes, at);
    const std::string type = bytes.substr(at + 4, 4);
    const std::string data = bytes.substr(at + 8, length);
    if (type == "IHDR") {
      image.width = big_endian(data, 0);
      image.height = big_endian(data, 4);
      const int depth = static_cast<unsigned char>(data[8]),
                colour = static_cast<unsigned char>(data[9]);
      const int interlace = static_cast<unsigned char>(data[12]);
      if (depth != 8 || (colour != 2 && colour != 6) || interlace != 0) {
        throw std::runtime_error("unsupported PNG layout");
      }
      channels = colour == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      compressed += data;
    } else if (type == "IEND") {
      break;
    }
    at += 12 + length;
  }
  const std::size_t stride =
      static_cast<std::size_t>(image.width) * static_cast<std::size_t>(channels);
  std::vector<unsigned char> raw(static_cast<std::size_t>(image.height) * (stride + 1));
  uLongf size = static_cast<uLongf>(raw.size());
  if (uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(compressed.data()),
                 static_cast<uLong>(compressed.size())) != Z_OK ||
      size != raw.size()) {
    throw std::runtime_error("corrupt PNG data");
  }
  std::vector<unsigned char> previous(stride, 0), row(stride);
  const std::size_t bpp = static_cast<std::size_t>(channels);
  for (std::uint32_t y = 0; y < image.height; ++y) {
    const unsigned char* line = raw.data() + y * (stride + 1);
    const int filter = line[0];
    for (std::size_t x = 0; x < stride; ++x) {
      const int a = x >= bpp ? row[x - bpp] : 0, b = previous[x],
                c = x >= bpp ? previous[x - bpp] : 0;
      int predictor = 0;
      if (filter == 1) predictor = a;
      if (filter == 2) predictor = b;
      if (filter == 3) predictor = (a + b) / 2;
      if (filter == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        predictor = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      row[x] = static_cast<unsigned char>(line[1 + x] + predictor);
    }
    for (std::uint32_t x = 0; x < image.width; ++x) {
      const std::size_t at = x * bpp;
      image.pixels.push_back({row[at], row[at + 1], row[at + 2]});
    }
    previous = row;
  }
  return image;
}

TEST(CompareTest, ChromiumRendersTheReportsCurves) {
  const fs::path chromium = "/usr/bin/chromium";
  if (!fs::exists(chromium))
    TRAINYARD_SKIP_MISSING() << "chromium is not installed (tools/setup installs it)";
  TempDir dir;
  const fs::path output = dir / "cmp";
  auto result = run_host(tiny_compare(output, {"optimizer.lr=1e-3,4e-3"}, 40));
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto curves = curves_of(read_text(output / "report.html"));
  ASSERT_EQ(curves.size(), 2u);

  // The README's command, with a profile folder of its own.
  const fs::path png = dir / "report.png";
  auto shot = run_command(
      {chromium.string(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
       "--user-data-dir=" + (dir / "profile").string(), "--screenshot=" + png.string(),
       "--window-size=1200,900", "file://" + (output / "report.html").string()},
      dir.path(), 180);
  ASSERT_EQ(shot.exit_code, 0) << describe(shot);
  ASSERT_TRUE(fs::exists(png)) << describe(shot);
  const Image image = decode_png(png);
  ASSERT_EQ(image.width, 1200u);
  ASSERT_EQ(image.height, 900u);

  // Each curve is drawn in its variant's full colour (bars use it at partial opacity; legend
  // swatches, eval circles and row markers are small): many pixels of that colour, in most of
  // the plot's 1010 columns.
  for (const auto& [variant, curve] : curves) {
    const int red = std::stoi(curve.colour.substr(1, 2), nullptr, 16);
    const int green = std::stoi(curve.colour.substr(3, 2), nullptr, 16);
    const int blue = std::stoi(curve.colour.substr(5, 2), nullptr, 16);
    std::size_t count = 0;
    std::vector<bool> column_has(image.width, false);
    for (std::uint32_t y = 0; y < image.height; ++y) {
      for (std::uint32_t x = 0; x < image.width; ++x) {
        const auto& p = image.pixels[y * image.width + x];
        if (std::abs(p[0] - red) <= 24 && std::abs(p[1] - green) <= 24 &&
            std::abs(p[2] - blue) <= 24) {
          ++count;
          column_has[x] = true;
        }
      }
    }
    EXPECT_GE(count, 500u) << "variant " << variant << " colour " << curve.colour;
    const auto columns = std::count(column_has.begin(), column_has.end(), true);
    EXPECT_GE(columns, 500) << "variant " << variant << " colour " << curve.colour;
  }
}

}  // namespace
}  // namespace trainyard::testing
