// The acceptance runs: full recipes to their accuracy targets, and a plugin built out of tree
// against the installed SDK. Minutes each on two cores; labelled "slow".

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

double final_eval_accuracy(const fs::path& metrics) {
  auto summary = of_phase(read_metrics(metrics), "summary");
  if (summary.empty()) throw std::runtime_error("no summary record in " + metrics.string());
  return summary.back().at("eval_accuracy");
}

TEST(AccuracyTest, CnnRecipeReaches90PercentWithin3Epochs) {
  TempDir dir;
  auto result = run_host({"run", "recipes/fashion_mnist_cnn.toml", "--set",
                          "run.output_dir=" + dir.path().string()},
                         {}, 1500);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  double accuracy = final_eval_accuracy(dir / "metrics.jsonl");
  std::cout << "fashion_mnist_cnn test accuracy after 3 epochs: " << accuracy << std::endl;
  EXPECT_GE(accuracy, 0.90);
}

TEST(AccuracyTest, MlpRecipeReaches85PercentAfter1Epoch) {
  TempDir dir;
  auto result = run_host({"run", "recipes/fashion_mnist_mlp.toml", "--set",
                          "run.output_dir=" + dir.path().string()},
                         {}, 900);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  double accuracy = final_eval_accuracy(dir / "metrics.jsonl");
  std::cout << "fashion_mnist_mlp test accuracy after 1 epoch: " << accuracy << std::endl;
  EXPECT_GE(accuracy, 0.85);
}

TEST(PluginTemplateTest, BuildsAgainstTheInstalledSdkAndTrains) {
  TempDir dir;
  const fs::path prefix = dir / "prefix";
  const std::string path_env =
      std::string("PATH=/usr/local/cuda/bin:") + (std::getenv("PATH") ? std::getenv("PATH") : "");
  auto install = run_command({"cmake", "--install", binary_dir().string(), "--prefix",
                              prefix.string()});
  ASSERT_EQ(install.exit_code, 0) << install.out << install.err;
  ASSERT_TRUE(fs::exists(prefix / "bin" / "trainyard"));
  ASSERT_TRUE(fs::exists(prefix / "include" / "trainyard" / "plugin.hpp"));
  ASSERT_TRUE(fs::exists(prefix / "lib" / "cmake" / "trainyard" / "trainyardConfig.cmake"));

  const fs::path build = dir / "template-build";
  auto configure = run_command({"cmake", "-S", (source_dir() / "tools" / "plugin_template").string(),
                                "-B", build.string(), "-DCMAKE_PREFIX_PATH=" + prefix.string()},
                               {}, 600, {path_env});
  ASSERT_EQ(configure.exit_code, 0) << configure.out << configure.err;
  auto compile = run_command({"cmake", "--build", build.string()}, {}, 900, {path_env});
  ASSERT_EQ(compile.exit_code, 0) << compile.out << compile.err;
  ASSERT_TRUE(fs::exists(build / "libsoftmax_regression.so"));

  // The installed host, its bundled plugins, and the template found through --plugin-path.
  auto run = run_command({(prefix / "bin" / "trainyard").string(), "run",
                          (source_dir() / "tools" / "plugin_template" / "recipe.toml").string(),
                          "--plugin-path", build.string(), "--set",
                          "run.output_dir=" + (dir / "run").string()},
                         dir.path(), 600);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  auto records = read_metrics(dir / "run" / "metrics.jsonl");
  auto train = of_phase(records, "train");
  ASSERT_GE(train.size(), 2u);
  EXPECT_LT(train.back().at("loss"), 0.7 * train.front().at("loss"));
  EXPECT_GT(of_phase(records, "summary").back().at("eval_accuracy"), 0.6);

  auto listed = run_command({(prefix / "bin" / "trainyard").string(), "plugins", "model",
                             "--plugin-path", build.string()});
  EXPECT_NE(listed.out.find("model softmax_regression"), std::string::npos) << listed.out;
}

}  // namespace
}  // namespace trainyard::testing
