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
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

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
  EXPECT_EQ(row1.back(), "ref");
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
  ASSERT_GE(row2.size(), 2u);
  EXPECT_EQ(row2[row2.size() - 2], expected) << table;
  EXPECT_EQ(row2.back(), "@" + std::to_string(at_step)) << table;

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
  EXPECT_EQ(of_phase(read_metrics(dir / "cmp" / "1-ddp" / "metrics.rank0.jsonl"), "train").size(),
            2u);
  EXPECT_TRUE(fs::exists(dir / "cmp" / "1-ddp" / "metrics.rank1.jsonl"));
  // The ranks' output lines carry "[rank R] "; the table shows the error itself.
  EXPECT_EQ(row_of(table, "2").at(2), "FAILED") << table;
  EXPECT_HAS(
      table,
      "2  strategy.plugin=single  FAILED  trainyard: error: strategy 'single' runs one process");
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
                                   "20",
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
  EXPECT_HAS(table, "trainyard: error: compare: stopped after the --timeout of 20 s");
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
  if (!fs::exists(chromium)) GTEST_SKIP() << "chromium is not installed (tools/setup installs it)";
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
