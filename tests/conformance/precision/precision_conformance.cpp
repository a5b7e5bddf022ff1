// Precision conformance: the device check agrees with what each device says it computes fast,
// loss scaling that unscales exactly, state that round-trips, and an autocast guard that restores
// what was there before. The numeric checks run on the first available device the precision
// accepts (the CPU for the bundled ones; a GPU for a precision that refuses the CPU).

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>

#include <algorithm>

#include "conformance.hpp"
#include "test_support.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/precision.hpp"

namespace {

using namespace trainyard;

class PrecisionConformance : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<Precision> build() {
    return conformance::registry().create<Precision>(GetParam(), conformance::under_test("precision"),
                                                     conformance::classification_context());
  }

  // The first device of every available device plugin (the CPU, and a GPU where there is one).
  static std::vector<std::shared_ptr<DeviceBackend>> available_devices() {
    std::vector<std::shared_ptr<DeviceBackend>> out;
    for (const auto& name : conformance::plugin_names("device")) {
      auto backend = conformance::registry().create<DeviceBackend>(
          name, conformance::section("device"), conformance::classification_context());
      if (backend->available() && backend->device_count() > 0) out.push_back(backend);
    }
    return out;
  }

  // The refusal of `device`, empty when the precision accepts it; a refusal must be a
  // trainyard::Error.
  static std::string refusal(const Precision& precision, const torch::Device& device) {
    try {
      precision.check_device(device);
      return {};
    } catch (const Error& error) {
      return error.what();
    }
  }

  // The device the numeric checks run on: the first available one the precision accepts.
  // Nullopt, with the refusals in refusals_, when it accepts none of them.
  std::optional<torch::Device> chosen_device(const Precision& precision) {
    refusals_.clear();
    for (const auto& backend : available_devices()) {
      const torch::Device device = backend->device(0);
      const std::string refused = refusal(precision, device);
      if (refused.empty()) return device;
      refusals_ += ' ';
      refusals_ += device.str() + ": " + refused;
    }
    return std::nullopt;
  }
  std::string refusals_;
};

// Ends a test whose precision accepts no device here: it needs a device this machine lacks (the
// CPU is always here, so that is a GPU).
#define DEVICE_OR_SKIP(var, precision)                                                   \
  const std::optional<torch::Device> var = chosen_device(*(precision));                  \
  if (!var) {                                                                            \
    TRAINYARD_SKIP_WITHOUT_GPU() << "precision '" << GetParam()                          \
                                 << "' accepts none of the devices here:" << refusals_; \
  }

TEST_P(PrecisionConformance, CheckDeviceAcceptsEveryDeviceComputingItsDtypeFast) {
  // The declaration a precision's device check must agree with: a device that computes the
  // precision's dtype natively at full speed (DeviceBackend::fast_compute_dtypes) runs it.
  auto precision = build();
  if (GetParam() == "fp32") {
    EXPECT_FALSE(precision->autocast_dtype().has_value()) << "fp32 runs without autocast";
  }
  const torch::ScalarType dtype = precision->autocast_dtype().value_or(torch::kFloat);
  const auto devices = available_devices();
  ASSERT_FALSE(devices.empty()) << "no device plugin reports an available device";
  for (const auto& backend : devices) {
    for (int index = 0; index < backend->device_count(); ++index) {
      const auto fast = backend->fast_compute_dtypes(index);
      EXPECT_NE(std::find(fast.begin(), fast.end(), torch::kFloat), fast.end())
          << backend->device(index) << " must compute float32 fast";
      if (std::find(fast.begin(), fast.end(), dtype) == fast.end()) continue;
      EXPECT_EQ(refusal(*precision, backend->device(index)), "")
          << backend->device(index) << " computes " << dtype << " fast, yet precision '"
          << GetParam() << "' refuses it";
    }
  }
}

TEST_P(PrecisionConformance, ScaledGradientsUnscaleToTheUnscaledOnes) {
  auto precision = build();
  DEVICE_OR_SKIP(device, precision);
  const auto on = torch::TensorOptions(*device);
  torch::manual_seed(11);
  torch::Tensor w = torch::randn({4, 3}, on).requires_grad_();
  torch::Tensor b = torch::randn({3}, on).requires_grad_();
  torch::Tensor x = torch::randn({8, 4}, on);
  auto loss_fn = [&] { return (x.matmul(w) + b).tanh().pow(2).mean(); };

  loss_fn().backward();
  torch::Tensor expected_w = w.grad().clone();
  torch::Tensor expected_b = b.grad().clone();
  w.mutable_grad() = torch::Tensor();
  b.mutable_grad() = torch::Tensor();

  for (int round = 0; round < 3; ++round) {
    torch::Tensor loss = loss_fn();
    torch::Tensor scaled = precision->scale_loss(loss);
    ASSERT_TRUE(scaled.defined());
    ASSERT_EQ(scaled.dim(), 0);
    scaled.backward();
    std::vector<torch::Tensor> grads = {w.grad(), b.grad()};
    EXPECT_TRUE(precision->unscale_and_check(grads)) << "finite gradients reported non-finite";
    EXPECT_TRUE(torch::allclose(w.grad(), expected_w, 1e-5, 1e-7))
        << "round " << round << ": max diff " << (w.grad() - expected_w).abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(b.grad(), expected_b, 1e-5, 1e-7)) << "round " << round;
    precision->update(false);
    w.mutable_grad() = torch::Tensor();
    b.mutable_grad() = torch::Tensor();
  }
}

TEST_P(PrecisionConformance, UnscaleReportsNonFiniteGradientsAsATensor) {
  // The two-phase form sharded strategies use: unscale reports found_inf as a tensor (they
  // all-reduce it), should_step decides. A precision that does not scale reports nothing.
  auto precision = build();
  DEVICE_OR_SKIP(device, precision);
  const auto on = torch::TensorOptions(*device);
  torch::Tensor loss = precision->scale_loss(torch::ones({}, on));
  const bool scales = !at::equal(loss, torch::ones({}, on));
  std::vector<torch::Tensor> finite = {loss.detach() * torch::ones({3}, on)};
  torch::Tensor found = precision->unscale(finite);
  EXPECT_TRUE(Precision::should_step(found));
  EXPECT_TRUE(torch::allclose(finite[0], torch::ones({3}, on))) << "unscale did not undo the scale";
  if (found.defined()) {
    EXPECT_EQ(found.numel(), 1);
    EXPECT_EQ(found.item<double>(), 0.0);
  } else {
    EXPECT_FALSE(scales) << "a precision that scales the loss must check the gradients";
  }
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    std::vector<torch::Tensor> gradients = {torch::ones({3}, on), torch::full({2}, bad, on)};
    torch::Tensor non_finite = precision->unscale(gradients);
    if (!scales) continue;
    ASSERT_TRUE(non_finite.defined());
    EXPECT_EQ(non_finite.item<double>(), 1.0) << bad;
    EXPECT_FALSE(Precision::should_step(non_finite));
  }
  precision->update(found);
}

TEST_P(PrecisionConformance, AutocastRunsInItsDtype) {
  auto precision = build();
  DEVICE_OR_SKIP(device, precision);
  torch::Tensor a = torch::randn({4, 4}, torch::TensorOptions(*device));
  AutocastGuard guard(device->type(), precision->autocast_dtype());
  EXPECT_EQ(a.matmul(a).scalar_type(), precision->autocast_dtype().value_or(torch::kFloat));
}

void expect_same_state(const StateDict& a, const StateDict& b) {
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [key, tensor] : a.tensors) {
    auto it = b.tensors.find(key);
    ASSERT_NE(it, b.tensors.end()) << key;
    EXPECT_TRUE(at::equal(tensor, it->second)) << key;
  }
}

TEST_P(PrecisionConformance, StateRoundTrips) {
  auto precision = build();
  // Move the state away from its initial value where the plugin has any.
  precision->update(true);
  precision->update(false);
  StateDict saved;
  precision->save_state(saved);
  auto fresh = build();
  fresh->load_state(saved);
  StateDict again;
  fresh->save_state(again);
  expect_same_state(saved, again);
  EXPECT_EQ(precision->metrics(), fresh->metrics());
}

TEST_P(PrecisionConformance, AutocastGuardRestoresPreviousState) {
  auto precision = build();
  const auto dtype = precision->autocast_dtype();
  for (auto device_type : {torch::kCPU, torch::kCUDA}) {
    const bool enabled_before = at::autocast::is_autocast_enabled(device_type);
    const auto dtype_before = at::autocast::get_autocast_dtype(device_type);
    {
      AutocastGuard guard(device_type, dtype);
      if (dtype) {
        EXPECT_TRUE(at::autocast::is_autocast_enabled(device_type));
        EXPECT_EQ(at::autocast::get_autocast_dtype(device_type), *dtype);
        {
          AutocastGuard inner(device_type, dtype);
          EXPECT_TRUE(at::autocast::is_autocast_enabled(device_type));
        }
        EXPECT_TRUE(at::autocast::is_autocast_enabled(device_type)) << "inner guard ended autocast";
      } else {
        EXPECT_EQ(at::autocast::is_autocast_enabled(device_type), enabled_before);
      }
    }
    EXPECT_EQ(at::autocast::is_autocast_enabled(device_type), enabled_before);
    EXPECT_EQ(at::autocast::get_autocast_dtype(device_type), dtype_before);
  }
  // Nested inside an already-enabled autocast of another dtype.
  if (dtype) {
    const auto saved_dtype = at::autocast::get_autocast_dtype(torch::kCPU);
    const auto other = *dtype == torch::kBFloat16 ? torch::kHalf : torch::kBFloat16;
    at::autocast::set_autocast_enabled(torch::kCPU, true);
    at::autocast::set_autocast_dtype(torch::kCPU, other);
    {
      AutocastGuard guard(torch::kCPU, dtype);
      EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), *dtype);
    }
    EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), other);
    at::autocast::set_autocast_enabled(torch::kCPU, false);
    at::autocast::set_autocast_dtype(torch::kCPU, saved_dtype);
  }
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(PrecisionConformance, "precision");
