// What a real run reports about its device: utilisation in every train record, and the peak FLOP/s
// that mfu divides by, measured once, then reused from the cache by later runs, unless declared.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

class CnnRunsSharingAPeakCache : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    first_ = new CommandResult(run("first", dir_->path() / "cache"));
    second_ = new CommandResult(run("second", dir_->path() / "cache"));
  }
  static void TearDownTestSuite() {
    delete second_;
    delete first_;
    delete dir_;
  }
  // A short fp32 run of the default recipe into `name`, with its peak cache in `cache`.
  static CommandResult run(const std::string& name, const fs::path& cache,
                           std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {host_binary().string(),
                                     "run",
                                     "recipes/fashion_mnist_cnn.toml",
                                     "--set",
                                     "run.max_steps=20",
                                     "--set",
                                     "run.log_every=5",
                                     "--set",
                                     "run.eval=false",
                                     "--set",
                                     "checkpoint.at_end=false",
                                     "--set",
                                     "sinks.console.progress=lines",
                                     "--set",
                                     "run.output_dir=" + (dir_->path() / name).string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_command(argv, source_dir(), 600, {"TRAINYARD_CACHE=" + cache.string()});
  }
  static std::vector<MetricLine> records(const std::string& name, const std::string& phase) {
    return of_phase(read_metrics(dir_->path() / name / "metrics.jsonl"), phase);
  }
  // The first run's one cache entry (an fp32 run probes float32 only) and where the same entry
  // goes in the cache folder `cache`, created.
  static std::pair<fs::path, fs::path> cache_entry_into(const fs::path& cache) {
    fs::create_directories(cache / "peak_flops");
    std::vector<fs::path> entries;
    for (const auto& entry : fs::directory_iterator(dir_->path() / "cache" / "peak_flops")) {
      entries.push_back(entry.path());
    }
    EXPECT_EQ(entries.size(), 1u) << "an fp32 run probes float32 only";
    if (entries.empty()) return {};
    return {entries[0], cache / "peak_flops" / entries[0].filename()};
  }
  static std::string run_info(const std::string& name) {
    return read_text(dir_->path() / name / "run_info.toml");
  }
  static TempDir* dir_;
  static CommandResult* first_;
  static CommandResult* second_;
};
TempDir* CnnRunsSharingAPeakCache::dir_ = nullptr;
CommandResult* CnnRunsSharingAPeakCache::first_ = nullptr;
CommandResult* CnnRunsSharingAPeakCache::second_ = nullptr;

TEST_F(CnnRunsSharingAPeakCache, EveryTrainRecordCarriesTheCpuAndDeviceUtilisation) {
  ASSERT_EQ(first_->exit_code, 0) << describe(*first_);
  const auto train = records("first", "train");
  ASSERT_EQ(train.size(), 4u);
  for (std::size_t index = 0; index < train.size(); ++index) {
    const MetricLine& record = train[index];
    for (const char* figure : {"cpu_util", "device_util"}) {
      ASSERT_TRUE(record.has(figure)) << figure << " missing in train record " << index;
      EXPECT_GT(record.at(figure), 0.0) << figure << ": training keeps the process busy";
      EXPECT_LE(record.at(figure), 1.05) << figure;
    }
  }
}

TEST_F(CnnRunsSharingAPeakCache, TheSecondRunReusesTheFirstRunsPeak) {
  ASSERT_EQ(first_->exit_code, 0) << describe(*first_);
  ASSERT_EQ(second_->exit_code, 0) << describe(*second_);
  EXPECT_HAS(run_info("first"), "source = \"measured\"");
  EXPECT_HAS(run_info("second"), "source = \"cached\"");
  EXPECT_HAS(run_info("second"), "dtype = \"float32\"");
  EXPECT_HAS(first_->err, "trainyard: peak ");
  EXPECT_HAS(first_->err, "(measured, float32 matmul probe");
  EXPECT_HAS(second_->err, "(cached, float32 matmul probe");
  const auto first = records("first", "summary");
  const auto second = records("second", "summary");
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_GT(first[0].at("peak_tflops"), 0);
  EXPECT_EQ(first[0].raw.at("peak_tflops"), second[0].raw.at("peak_tflops")) << "the same figure";
  for (const MetricLine& record : records("second", "train")) EXPECT_TRUE(record.has("mfu"));
}

TEST_F(CnnRunsSharingAPeakCache, ADeclaredPeakWinsOverTheCache) {
  ASSERT_EQ(first_->exit_code, 0) << describe(*first_);
  const CommandResult declared =
      run("declared", dir_->path() / "cache", {"--set", "run.peak_tflops=2.5"});
  ASSERT_EQ(declared.exit_code, 0) << describe(declared);
  EXPECT_HAS(run_info("declared"), "source = \"declared\"");
  EXPECT_HAS(declared.err, "2.500 TFLOP/s (declared: run.peak_tflops)");
  EXPECT_DOUBLE_EQ(records("declared", "summary").at(0).at("peak_tflops"), 2.5);
}

TEST_F(CnnRunsSharingAPeakCache, ACorruptCacheEntryIsReplacedWithOneWarningLine) {
  ASSERT_EQ(first_->exit_code, 0) << describe(*first_);
  const fs::path cache = dir_->path() / "corrupt_cache";
  const auto [original, corrupt] = cache_entry_into(cache);
  ASSERT_FALSE(original.empty());
  const std::string whole = read_text(original);
  std::ofstream(corrupt) << whole.substr(0, whole.size() / 2);  // truncated
  const CommandResult result = run("corrupt", cache);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  int warnings = 0;
  std::istringstream lines(result.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("warning: ignoring the peak FLOP/s cache " + corrupt.string()) !=
        std::string::npos) {
      ++warnings;
    }
  }
  EXPECT_EQ(warnings, 1) << result.err;
  EXPECT_HAS(run_info("corrupt"), "source = \"measured\"");
  EXPECT_HAS(read_text(corrupt), "flops_per_s = ");
}

// A cached peak the model then outruns (an entry measured on a busy machine; here one a thousand
// times too low) is measured again at the end of the run, with one warning, for later runs.
TEST_F(CnnRunsSharingAPeakCache, APeakTheModelOutrunsIsMeasuredAgain) {
  ASSERT_EQ(first_->exit_code, 0) << describe(*first_);
  const fs::path cache = dir_->path() / "stale_cache";
  const auto [original, stale] = cache_entry_into(cache);
  ASSERT_FALSE(original.empty());
  const std::string whole = read_text(original);
  const auto at = whole.find("flops_per_s = ");
  ASSERT_NE(at, std::string::npos) << whole;
  std::ofstream(stale) << whole.substr(0, at) << "flops_per_s = 1000000\n";
  const CommandResult result = run("stale", cache);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.err, "times the cached peak FLOP/s, so the cache entry was measured on a busy");
  EXPECT_EQ(read_text(stale).find("flops_per_s = 1000000\n"), std::string::npos) << read_text(stale);
  EXPECT_HAS(read_text(stale), "flops_per_s = ");
}

}  // namespace
}  // namespace trainyard::testing
