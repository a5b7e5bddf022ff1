// The acceptance runs: full recipes to their accuracy targets. Minutes each on two cores;
// labelled "slow". The default recipe's
// three epochs (FullAccuracyTest, label full) are left out of CI, where the recipe's first 100
// losses are pinned bit for bit by Golden.* instead and the mlp's epoch reaches its target.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

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

TEST(FullAccuracyTest, CnnRecipeReaches90PercentWithin3Epochs) {
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

}  // namespace
}  // namespace trainyard::testing
