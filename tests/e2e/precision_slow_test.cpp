// bf16 against fp32 on the default recipe: the same steps from the same seed and data order,
// test accuracy within half a point. Also prints the step-time ratio of the two runs (the
// benchmark proper is tools/bench/precision_bench.sh). Minutes on two cores; labelled "slow".

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  double accuracy = 0;
  double median_step_ms = 0;
};

// Steps of the comparison, with the learning rate annealed to zero over them so that both runs
// end at a settled model rather than at a point of a noisy trajectory (~89% on fp32). bf16 is
// emulated on CPUs without AVX512-BF16, several times slower than fp32: this is most of the
// test's time.
constexpr int kSteps = 600;

Outcome run_cnn(const std::string& precision, const fs::path& out) {
  auto result = run_host({"run", "recipes/fashion_mnist_cnn.toml", "--set",
                          "precision.plugin=" + precision, "--set",
                          "run.max_steps=" + std::to_string(kSteps), "--set", "run.log_every=50",
                          "--set", "scheduler.plugin=warmup_cosine", "--set",
                          "scheduler.warmup_steps=50",
                          "--set", "checkpoint.at_end=false", "--set",
                          "run.output_dir=" + out.string()},
                         {}, 1700);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  auto records = read_metrics(out / "metrics.jsonl");
  Outcome outcome;
  outcome.accuracy = of_phase(records, "summary").back().at("eval_accuracy");
  std::vector<double> step_ms;
  for (const auto& record : of_phase(records, "train")) step_ms.push_back(record.at("step_time_ms"));
  std::sort(step_ms.begin(), step_ms.end());
  outcome.median_step_ms = step_ms[step_ms.size() / 2];
  return outcome;
}

TEST(PrecisionAccuracy, Bf16CnnWithinHalfAPointOfFp32AfterTheSameSteps) {
  TempDir dir;
  Outcome fp32 = run_cnn("fp32", dir / "fp32");
  Outcome bf16 = run_cnn("bf16", dir / "bf16");
  std::cout << "fashion_mnist_cnn after " << kSteps << " steps: fp32 accuracy " << fp32.accuracy
            << ", bf16 accuracy " << bf16.accuracy << "\nmedian step time: fp32 "
            << fp32.median_step_ms << " ms, bf16 " << bf16.median_step_ms
            << " ms, bf16/fp32 = " << bf16.median_step_ms / fp32.median_step_ms << std::endl;
  RecordProperty("fp32_accuracy", std::to_string(fp32.accuracy));
  RecordProperty("bf16_accuracy", std::to_string(bf16.accuracy));
  EXPECT_GT(fp32.accuracy, 0.85);
  EXPECT_NEAR(bf16.accuracy, fp32.accuracy, 0.005);
}

}  // namespace
}  // namespace trainyard::testing
