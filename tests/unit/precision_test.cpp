// Mixed precision through the single strategy: fp16's dynamic loss scaling (skip, back off,
// grow; checked against torch.amp.GradScaler when the venv's Python is present), unscaling
// before clipping, and bf16's float32 master weights.

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <limits>
#include <sstream>

#include "step_harness.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"

namespace {

using namespace trainyard;
using namespace trainyard::testing;

double metric(const Precision& precision, const std::string& name) {
  for (const auto& [key, value] : precision.metrics()) {
    if (key == name) return value;
  }
  ADD_FAILURE() << "precision reports no metric '" << name << "'";
  return -1;
}

bool same_parameters(const TensorMap& a, const TensorMap& b) {
  for (const auto& [name, tensor] : a) {
    if (!at::equal(tensor, b.at(name))) return false;
  }
  return true;
}

// A batch whose first sample holds an inf: the loss and the gradients become non-finite, the
// way an fp16 overflow shows up.
Batch overflowing(Batch batch) {
  batch.tensors["input"] = batch.tensors["input"].clone();
  batch.tensors["input"].index_put_({0, 0}, std::numeric_limits<float>::infinity());
  return batch;
}

HarnessOptions fp16_options() {
  HarnessOptions options;
  options.precision = "fp16";
  options.precision_options = "init_scale = 1024.0\ngrowth_interval = 3";
  return options;
}

// Which steps overflow in the scaler tests: back off twice, grow once in between.
const std::vector<bool> kOverflowPattern = {false, true, false, false, false, false, true, false};

struct ScalerStep {
  bool stepped = false;
  double scale = 0;
};

std::vector<ScalerStep> trainyard_trajectory() {
  StepHarness harness(fp16_options());
  std::vector<ScalerStep> steps;
  for (std::size_t i = 0; i < kOverflowPattern.size(); ++i) {
    Batch batch = random_batch(8, {6}, 4, 100 + i);
    if (kOverflowPattern[i]) batch = overflowing(batch);
    TensorMap before = harness.parameters();
    StepResult result = harness.strategy->train_step(std::span<const Batch>(&batch, 1));
    const bool changed = !same_parameters(before, harness.parameters());
    EXPECT_EQ(result.skipped, !changed) << "step " << i;
    steps.push_back({changed, metric(*harness.precision, "loss_scale")});
  }
  return steps;
}

TEST(Fp16Precision, OverflowSkipsTheStepBacksOffThenGrowsAfterTheInterval) {
  StepHarness harness(fp16_options());
  EXPECT_EQ(metric(*harness.precision, "loss_scale"), 1024.0);
  double scale = 1024.0;
  int finite_run = 0;
  int skipped = 0;
  for (std::size_t i = 0; i < kOverflowPattern.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    Batch batch = random_batch(8, {6}, 4, 100 + i);
    if (kOverflowPattern[i]) batch = overflowing(batch);
    TensorMap before = harness.parameters();
    StepResult result = harness.strategy->train_step(std::span<const Batch>(&batch, 1));
    TensorMap after = harness.parameters();
    if (kOverflowPattern[i]) {
      EXPECT_TRUE(result.skipped);
      EXPECT_TRUE(same_parameters(before, after)) << "a skipped step changed the parameters";
      scale *= 0.5;
      finite_run = 0;
      ++skipped;
    } else {
      EXPECT_FALSE(result.skipped);
      EXPECT_FALSE(same_parameters(before, after)) << "a finite step left the parameters alone";
      if (++finite_run == 3) {
        scale *= 2.0;
        finite_run = 0;
      }
    }
    EXPECT_EQ(metric(*harness.precision, "loss_scale"), scale);
    EXPECT_EQ(metric(*harness.precision, "skipped_steps_total"), skipped);
  }
  // The pattern both backed off and grew.
  EXPECT_EQ(scale, 512.0);
}

TEST(Fp16Precision, MatchesTorchGradScaler) {
  const auto python = source_dir() / ".venv/bin/python";
  if (!std::filesystem::exists(python)) {
    TRAINYARD_SKIP_MISSING() << "no " << python << ": cannot compare with torch.amp.GradScaler";
  }
  std::string pattern;
  for (bool overflow : kOverflowPattern) pattern += overflow ? '1' : '0';
  const std::string script = R"(
import sys, torch
p = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.SGD([p], lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
                              growth_interval=3)
for overflow in sys.argv[1]:
    opt.zero_grad()
    x = torch.full((3,), float("inf") if overflow == "1" else 1.0)
    scaler.scale((p * x).sum()).backward()
    before = p.detach().clone()
    scaler.step(opt)
    scaler.update()
    print(int(not torch.equal(before, p.detach())), scaler.get_scale())
)";
  CommandResult python_run = run_command({python.string(), "-c", script, pattern}, {}, 300);
  ASSERT_EQ(python_run.exit_code, 0) << python_run.err;
  std::istringstream lines(python_run.out);
  std::vector<ScalerStep> expected;
  int stepped = 0;
  double scale = 0;
  while (lines >> stepped >> scale) expected.push_back({stepped == 1, scale});
  ASSERT_EQ(expected.size(), kOverflowPattern.size()) << python_run.out;

  std::vector<ScalerStep> actual = trainyard_trajectory();
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].stepped, expected[i].stepped) << "step " << i;
    EXPECT_EQ(actual[i].scale, expected[i].scale) << "step " << i;
  }
}

TEST(Fp16Precision, GradientsAreUnscaledBeforeClipping) {
  // The norm the step reports (and clips against) is the norm of the true gradients: with fp16
  // it matches fp32's to fp16 accuracy, not 1024 times it.
  HarnessOptions fp32_options;
  fp32_options.step.max_grad_norm = 1e-3;
  HarnessOptions half = fp16_options();
  half.step.max_grad_norm = 1e-3;
  StepHarness reference(fp32_options);
  StepHarness scaled(half);
  Batch batch = random_batch(16, {6}, 4, 7);
  StepResult expected = reference.strategy->train_step(std::span<const Batch>(&batch, 1));
  StepResult actual = scaled.strategy->train_step(std::span<const Batch>(&batch, 1));
  ASSERT_TRUE(actual.grad_norm.defined());
  const double expected_norm = expected.grad_norm.item<double>();
  EXPECT_NEAR(actual.grad_norm.item<double>(), expected_norm, 1e-2 * expected_norm);
  // Clipped to 1e-3 with SGD lr 0.1: every parameter moved by at most 1e-4 in norm.
  EXPECT_LT(max_difference(reference.parameters(), scaled.parameters()), 1e-4);
}

TEST(Bf16Precision, AutocastsTheStepAndKeepsFloat32MasterWeightsAndState) {
  HarnessOptions options;
  options.optimizer = "adamw";
  options.optimizer_options = "lr = 1e-3";
  HarnessOptions bf16 = options;
  bf16.precision = "bf16";
  StepHarness reference(options);
  StepHarness harness(bf16);
  Batch batch = random_batch(16, {6}, 4, 3);
  StepResult expected = reference.strategy->train_step(std::span<const Batch>(&batch, 1));
  StepResult result = harness.strategy->train_step(std::span<const Batch>(&batch, 1));
  // The forward ran in bfloat16: the loss differs from float32's, by bfloat16's precision.
  const double loss = result.loss.item<double>();
  const double reference_loss = expected.loss.item<double>();
  EXPECT_NE(loss, reference_loss) << "the bf16 step computed exactly what fp32 computes";
  EXPECT_NEAR(loss, reference_loss, 1.6e-2 * std::abs(reference_loss) + 1e-5);
  for (const auto& [name, tensor] : harness.parameters()) {
    EXPECT_EQ(tensor.scalar_type(), at::kFloat) << name;
  }
  CheckpointState state;
  harness.strategy->save_state(state);
  int optimizer_tensors = 0;
  for (const auto& [name, tensor] : state.shared.tensors) {
    if (name.rfind("optimizer.", 0) != 0 || name.find(".step") != std::string::npos) continue;
    EXPECT_EQ(tensor.scalar_type(), at::kFloat) << name;
    ++optimizer_tensors;
  }
  EXPECT_GT(optimizer_tensors, 0);
}

TEST(PrecisionDeviceCheck, RefusesADeviceItCannotRunNamingBoth) {
  BuildContext context;
  for (const std::string name : {"bf16", "fp16"}) {
    auto precision =
        bundled_registry().create<Precision>(name, options_section("precision", ""), context);
    EXPECT_NO_THROW(precision->check_device(torch::Device(torch::kCPU)));
    const std::string message =
        error_of([&] { precision->check_device(torch::Device(torch::kMeta)); });
    EXPECT_TRUE(contains(message, "'" + name + "'"));
    EXPECT_TRUE(contains(message, "'meta'"));
  }
}

// An accelerator the precisions know nothing of by name, computing natively what it is told to.
class NativeDtypesDevice final : public DeviceBackend {
 public:
  explicit NativeDtypesDevice(std::vector<c10::ScalarType> native) : native_(std::move(native)) {}
  bool available() const override { return true; }
  int device_count() const override { return 1; }
  torch::Device device(int index) const override {
    return torch::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
  }
  void synchronize(int) override {}
  DeviceMemory memory(int) const override { return {}; }
  std::vector<c10::ScalarType> fast_compute_dtypes(int) const override { return native_; }
  void manual_seed(std::uint64_t) override {}
  void save_rng_state(StateDict&) const override {}
  void load_rng_state(const StateDict&) override {}

 protected:
  std::unique_ptr<DeviceEvent> make_event(int) override {
    return std::make_unique<HostClockEvent>();
  }

 private:
  std::vector<c10::ScalarType> native_;
};

TEST(PrecisionDeviceCheck, AcceleratorRunsWhatItsBackendComputesNatively) {
  BuildContext context;
  context.device_backend =
      std::make_shared<NativeDtypesDevice>(std::vector<c10::ScalarType>{at::kFloat, at::kBFloat16});
  const torch::Device device = context.device_backend->device(0);
  auto bf16 = bundled_registry().create<Precision>("bf16", options_section("precision", ""), context);
  EXPECT_NO_THROW(bf16->check_device(device));
  auto fp16 = bundled_registry().create<Precision>("fp16", options_section("precision", ""), context);
  const std::string message = error_of([&] { fp16->check_device(device); });
  EXPECT_TRUE(contains(message, "'fp16'")) << message;
  EXPECT_TRUE(contains(message, device.str())) << message;
  EXPECT_TRUE(contains(message, "float16")) << message;
  // Without the backend the precision cannot know, and says so rather than guessing.
  auto unknown =
      bundled_registry().create<Precision>("bf16", options_section("precision", ""), BuildContext{});
  EXPECT_TRUE(contains(error_of([&] { unknown->check_device(device); }), "no device backend"));
}

TEST(PrecisionOnCuda, Bf16AndFp16StepsRunOnTheGpu) {
  if (!torch::cuda::is_available()) TRAINYARD_SKIP_WITHOUT_GPU() << "no CUDA device";
  BuildContext context;
  // The precisions ask the device's backend which dtypes it computes natively.
  context.device_backend =
      bundled_registry().create<DeviceBackend>("cuda", Config({}, "device"), context);
  for (const std::string name : {"bf16", "fp16"}) {
    auto precision =
        bundled_registry().create<Precision>(name, options_section("precision", ""), context);
    // Ampere and newer run bfloat16 natively; an older GPU is refused naming device and precision.
    try {
      precision->check_device(torch::Device(torch::kCUDA, 0));
    } catch (const Error& error) {
      EXPECT_EQ(name, "bf16") << error.what();
      EXPECT_TRUE(contains(error.what(), "cuda:0"));
      continue;
    }
    torch::Tensor w = torch::randn({8, 8}, torch::kCUDA).requires_grad_();
    torch::Tensor x = torch::randn({4, 8}, torch::kCUDA);
    torch::Tensor loss;
    {
      AutocastGuard guard(torch::kCUDA, precision->autocast_dtype());
      torch::Tensor y = x.matmul(w);
      EXPECT_EQ(y.scalar_type(), *precision->autocast_dtype());
      loss = y.to(at::kFloat).pow(2).mean();
    }
    precision->scale_loss(loss).backward();
    EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
    torch::Tensor found = precision->unscale({w.grad()});
    EXPECT_TRUE(Precision::should_step(found));
    w.mutable_grad().index_put_({0, 0}, std::numeric_limits<float>::infinity());
    if (name == "fp16") {
      EXPECT_FALSE(Precision::should_step(precision->unscale({w.grad()})));
      precision->update(true);
      EXPECT_EQ(metric(*precision, "loss_scale"), 32768.0);
    }
  }
}

TEST(Fp16Precision, RejectsBadOptions) {
  BuildContext context;
  for (const std::string bad : {"growth_factor = 1.0", "backoff_factor = 1.5", "init_scale = 0.0",
                                "growth_interval = 0"}) {
    const std::string message = error_of([&] {
      bundled_registry().create<Precision>("fp16", options_section("precision", bad), context);
    });
    EXPECT_TRUE(contains(message, bad.substr(0, bad.find(' ')))) << bad;
  }
}

}  // namespace
