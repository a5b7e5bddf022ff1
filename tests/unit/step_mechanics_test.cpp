// Step mechanics of the single strategy (the reference every other strategy is compared with):
// gradient accumulation equals the large batch, one optimizer step per K micro-batches, and
// clipping by global norm as torch.nn.utils.clip_grad_norm_ does it.

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "step_harness.hpp"
#include "trainyard/parallel/gradients.hpp"

namespace {

using namespace trainyard;
using namespace trainyard::testing;

// K micro-batches of B against one batch of K*B, parameters compared after every step.
void expect_accumulation_parity(HarnessOptions options, std::int64_t micro_batches,
                                std::int64_t micro_batch_size, int steps) {
  HarnessOptions accumulating = options;
  accumulating.step.accumulation = micro_batches;
  StepHarness large(options);
  StepHarness accumulated(accumulating);
  ASSERT_TRUE(all_close_fp32(accumulated.parameters(), large.parameters())) << "different start";
  for (int step = 0; step < steps; ++step) {
    Batch batch = random_batch(micro_batches * micro_batch_size, options.input_shape,
                               options.classes, 40 + static_cast<std::uint64_t>(step));
    std::vector<Batch> micro = split_batch(batch, micro_batches);
    StepResult expected = large.strategy->train_step(std::span<const Batch>(&batch, 1));
    StepResult actual = accumulated.strategy->train_step(micro);
    EXPECT_EQ(actual.samples, expected.samples);
    EXPECT_TRUE(at::allclose(actual.loss, expected.loss, 1.3e-6, 1e-5)) << "step " << step;
    EXPECT_TRUE(all_close_fp32(accumulated.parameters(), large.parameters())) << "step " << step;
  }
}

TEST(GradientAccumulation, MlpFourMicroBatchesEqualOneBatchOfFourTimesTheSize) {
  HarnessOptions options;
  options.optimizer_options = "lr = 0.1\nmomentum = 0.9";
  expect_accumulation_parity(options, 4, 8, 5);
}

TEST(GradientAccumulation, MlpWithAdamW) {
  HarnessOptions options;
  options.optimizer = "adamw";
  options.optimizer_options = "lr = 1e-2";
  expect_accumulation_parity(options, 3, 5, 5);
}

TEST(GradientAccumulation, CnnWithoutBatchNormEqualsTheLargeBatch) {
  // BatchNorm normalises each micro-batch by its own statistics, so with it K micro-batches are
  // a different computation from the large batch by definition (as under DDP, where each rank
  // normalises its own share). Parity is a property of the step mechanics, shown without it.
  HarnessOptions options;
  options.model = "cnn";
  options.model_options = "channels = [4, 6]\nhidden = 16\nbatch_norm = false";
  options.input_shape = {1, 8, 8};
  options.optimizer_options = "lr = 0.05\nmomentum = 0.9";
  expect_accumulation_parity(options, 4, 4, 4);
}

TEST(GradientAccumulation, OneOptimizerStepPerKMicroBatches) {
  HarnessOptions options;
  options.optimizer = "adamw";
  options.step.accumulation = 4;
  StepHarness harness(options);
  for (int step = 0; step < 3; ++step) {
    Batch batch = random_batch(16, options.input_shape, options.classes, 60 + step);
    harness.strategy->train_step(split_batch(batch, 4));
  }
  CheckpointState state;
  harness.strategy->save_state(state);
  int counters = 0;
  for (const auto& [name, value] : state.shared.tensors) {
    if (name.rfind("optimizer.", 0) != 0 || name.size() < 5 ||
        name.compare(name.size() - 5, 5, ".step") != 0) {
      continue;
    }
    ++counters;
    EXPECT_EQ(value.item<std::int64_t>(), 3) << name << ": AdamW counted micro-batches, not steps";
  }
  EXPECT_GT(counters, 0) << "no optimizer step counter saved";
}

// Gradients recovered from one SGD step with lr 1: before - after.
TensorMap applied_update(const TensorMap& before, const TensorMap& after) {
  TensorMap out;
  for (const auto& [name, tensor] : before) out[name] = (tensor - after.at(name)).to(at::kDouble);
  return out;
}

TEST(GradientClipping, ReportsTheGlobalNormAndClipsAsClipGradNorm) {
  HarnessOptions options;
  options.optimizer_options = "lr = 1.0";
  HarnessOptions clipped_options = options;
  const double max_norm = 0.05;
  clipped_options.step.max_grad_norm = max_norm;
  StepHarness plain(options);
  StepHarness clipped(clipped_options);
  const TensorMap start = plain.parameters();
  Batch batch = random_batch(16, options.input_shape, options.classes, 9);
  StepResult plain_result = plain.strategy->train_step(std::span<const Batch>(&batch, 1));
  StepResult clipped_result = clipped.strategy->train_step(std::span<const Batch>(&batch, 1));
  ASSERT_TRUE(plain_result.grad_norm.defined()) << "the norm is reported every step";
  ASSERT_TRUE(clipped_result.grad_norm.defined());

  // The true gradients, and their global norm computed here in double.
  TensorMap gradients = applied_update(start, plain.parameters());
  double squares = 0;
  for (const auto& [name, gradient] : gradients) squares += gradient.pow(2).sum().item<double>();
  const double norm = std::sqrt(squares);
  ASSERT_GT(norm, max_norm) << "the test needs gradients that get clipped";
  EXPECT_NEAR(clipped_result.grad_norm.item<double>(), norm, 1e-5 * norm)
      << "grad_norm must be the norm before clipping";
  EXPECT_EQ(plain_result.grad_norm.item<double>(), clipped_result.grad_norm.item<double>());

  // torch.nn.utils.clip_grad_norm_: g * min(1, max_norm / (norm + 1e-6)).
  const double coefficient = std::min(1.0, max_norm / (norm + 1e-6));
  TensorMap clipped_gradients = applied_update(start, clipped.parameters());
  for (const auto& [name, gradient] : gradients) {
    EXPECT_TRUE(at::allclose(clipped_gradients.at(name), gradient * coefficient, 1e-4, 1e-7))
        << name;
  }
}

TEST(GradientClipping, ClipToNormMatchesTorchClipGradNorm) {
  const auto python = source_dir() / ".venv/bin/python";
  if (!std::filesystem::exists(python)) {
    TRAINYARD_SKIP_MISSING() << "no " << python << ": cannot compare with torch.nn.utils.clip_grad_norm_";
  }
  const std::string script = R"(
import torch
for max_norm in (1.0, 100.0):
    ps = [torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(2))]
    ps[0].grad = torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1.0
    ps[1].grad = torch.tensor([3.0, -4.0])
    norm = torch.nn.utils.clip_grad_norm_(ps, max_norm)
    print(repr(norm.item()), *[repr(v) for p in ps for v in p.grad.flatten().tolist()])
)";
  CommandResult run = run_command({python.string(), "-c", script}, {}, 300);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::istringstream lines(run.out);
  for (double max_norm : {1.0, 100.0}) {
    std::vector<torch::Tensor> gradients = {
        at::arange(6, at::kFloat).reshape({2, 3}) * 0.5 - 1.0, at::tensor({3.0f, -4.0f})};
    torch::Tensor norm = clip_to_norm(gradients, global_norm(gradients), max_norm);
    double expected_norm = 0;
    ASSERT_TRUE(lines >> expected_norm) << run.out;
    EXPECT_FLOAT_EQ(norm.item<float>(), static_cast<float>(expected_norm));
    torch::Tensor flat = at::cat({gradients[0].flatten(), gradients[1]});
    for (std::int64_t i = 0; i < flat.numel(); ++i) {
      double expected = 0;
      ASSERT_TRUE(lines >> expected);
      EXPECT_FLOAT_EQ(flat[i].item<float>(), static_cast<float>(expected))
          << "max_norm " << max_norm << " entry " << i;
    }
  }
}

}  // namespace
