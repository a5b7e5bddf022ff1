// recipes/fashion_mnist_resnet_folder.toml as a user runs it: a ResNet-18 (stem width 16) trained
// for six epochs on Fashion-MNIST read from PNG class folders (data/fashion-mnist-png, written by
// tools/setup), decoded and augmented in the loader's workers, reaches 91% test accuracy.

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

TEST(ResnetFolderRecipe, ReachesNinetyOnePercentTestAccuracyOnThePngFolder) {
  ASSERT_TRUE(fs::is_directory(source_dir() / "data" / "fashion-mnist-png" / "train"))
      << "data/fashion-mnist-png is missing: run tools/setup";
  TempDir dir;
  const auto run = run_one_process(source_dir() / "recipes" / "fashion_mnist_resnet_folder.toml",
                                   dir / "out", {"--set", "run.device=cpu"}, {}, 5400);
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  const auto summary = of_phase(read_metrics(dir / "out" / "metrics.jsonl"), "summary");
  ASSERT_FALSE(summary.empty());
  const double accuracy = summary.back().at("eval_accuracy");
  std::cout << "fashion_mnist_resnet_folder: test accuracy " << accuracy << " after "
            << summary.back().at("wall_s") << " s\n";
  EXPECT_GE(accuracy, 0.91);
}

}  // namespace
}  // namespace trainyard::testing
