// Device backend conformance: availability queries never crash; an available device has a
// device 0 of its type, events that measure time, memory statistics, utilisation within range
// where reported, float32 among its fast dtypes, a name, pinning that preserves values,
// generator state that restores exactly, and placement, default-comm and doctor hooks that hold
// together.

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <vector>
#include <thread>

#include "conformance.hpp"
#include "test_support.hpp"
#include "trainyard/api/batch.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/device.hpp"

namespace {

using trainyard::DeviceBackend;

class DeviceConformance : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<DeviceBackend> build() {
    return trainyard::conformance::registry().create<DeviceBackend>(
        GetParam(), trainyard::conformance::under_test("device"),
        trainyard::conformance::classification_context());
  }
  // The backend, or null after deciding to skip because the device is absent here.
  std::shared_ptr<DeviceBackend> build_available() {
    auto backend = build();
    if (!backend->available()) {
      skipped_ = "device '" + GetParam() + "' is not available on this machine";
      return nullptr;
    }
    return backend;
  }
  std::string skipped_;
};

#define AVAILABLE_OR_SKIP(var)         \
  auto var = build_available();        \
  if (!var) TRAINYARD_SKIP_WITHOUT_GPU() << skipped_;

TEST_P(DeviceConformance, AvailabilityQueriesDoNotCrash) {
  auto backend = build();
  const bool available = backend->available();
  const int count = backend->device_count();
  EXPECT_GE(count, 0);
  if (available) {
    EXPECT_GE(count, 1) << "an available device has at least one index";
  }
  if (GetParam() == "cpu") {
    EXPECT_TRUE(available);
    EXPECT_GE(count, 1);
  }
  // Safe to call on a device that is absent too.
  EXPECT_NO_THROW(backend->manual_seed(1));
}

TEST_P(DeviceConformance, DeviceZeroHasTheBackendsType) {
  AVAILABLE_OR_SKIP(backend);
  for (int i = 0; i < backend->device_count(); ++i) {
    const torch::Device device = backend->device(i);
    EXPECT_EQ(c10::DeviceTypeName(device.type(), /*lower_case=*/true), GetParam())
        << "a device backend is named after the device type it drives";
    if (GetParam() == "cpu") { EXPECT_TRUE(device.is_cpu()); }
    if (device.has_index()) { EXPECT_EQ(device.index(), i); }
  }
}

TEST_P(DeviceConformance, EventsMeasureElapsedTime) {
  AVAILABLE_OR_SKIP(backend);
  auto start = backend->create_event(0);
  auto stop = backend->create_event(0);
  ASSERT_NE(start, nullptr);
  ASSERT_NE(stop, nullptr);
  start->record();
  // Some work on the device, then wall time.
  torch::Tensor x = torch::randn({256, 256}, torch::TensorOptions().device(backend->device(0)));
  for (int i = 0; i < 4; ++i) x = x.matmul(x).tanh();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop->record();
  backend->synchronize(0);
  const double elapsed = start->elapsed_ms(*stop);
  EXPECT_TRUE(std::isfinite(elapsed));
  EXPECT_GE(elapsed, 0.0);
  if (GetParam() == "cpu") { EXPECT_GE(elapsed, 15.0) << "the cpu timeline is wall time"; }
}

TEST_P(DeviceConformance, MemoryStatistics) {
  AVAILABLE_OR_SKIP(backend);
  backend->reset_peak_memory(0);
  torch::Tensor held =
      torch::ones({1 << 20}, torch::TensorOptions().device(backend->device(0)));  // 4 MiB
  backend->synchronize(0);
  const auto memory = backend->memory(0);
  EXPECT_GT(memory.current_bytes, 0);
  EXPECT_GT(memory.peak_bytes, 0);
  EXPECT_GE(memory.peak_bytes, memory.current_bytes);
  EXPECT_GE(memory.total_bytes, 0);
  if (memory.total_bytes > 0) { EXPECT_LE(memory.current_bytes, memory.total_bytes); }
  // A caching allocator holds at least what it handed out; one that caches nothing says 0.
  EXPECT_GE(memory.reserved_bytes, 0);
  if (memory.peak_reserved_bytes > 0) {
    EXPECT_GE(memory.reserved_bytes, memory.current_bytes);
    EXPECT_GE(memory.peak_reserved_bytes, memory.peak_bytes);
  }
  EXPECT_EQ(held.sum().item<float>(), static_cast<float>(1 << 20));
}

TEST_P(DeviceConformance, UtilisationIsAShareWhereReported) {
  AVAILABLE_OR_SKIP(backend);
  backend->utilisation(0);
  torch::Tensor x = torch::randn({256, 256}, torch::TensorOptions().device(backend->device(0)));
  for (int i = 0; i < 8; ++i) x = x.matmul(x).tanh();
  backend->synchronize(0);
  const trainyard::DeviceUtilisation utilisation = backend->utilisation(0);
  if (utilisation.compute_share) {
    EXPECT_GE(*utilisation.compute_share, 0.0);
    EXPECT_LE(*utilisation.compute_share, 1.05) << "a share of the device, at most all of it";
  }
  if (utilisation.memory_used_bytes) { EXPECT_GT(*utilisation.memory_used_bytes, 0); }
  if (GetParam() == "cpu") {
    EXPECT_TRUE(utilisation.compute_share.has_value()) << "the host always knows its CPU time";
  }
}

TEST_P(DeviceConformance, DeclaresItsFastDtypesAndName) {
  AVAILABLE_OR_SKIP(backend);
  const auto fast = backend->fast_compute_dtypes(0);
  EXPECT_NE(std::find(fast.begin(), fast.end(), at::kFloat), fast.end())
      << "every device computes float32 at its own full speed";
  EXPECT_FALSE(backend->device_name(0).empty());
}

TEST_P(DeviceConformance, PinPreservesValues) {
  AVAILABLE_OR_SKIP(backend);
  torch::Tensor host = torch::arange(100, torch::kFloat);
  torch::Tensor pinned = backend->pin(host);
  ASSERT_TRUE(pinned.defined());
  EXPECT_TRUE(pinned.device().is_cpu());
  EXPECT_TRUE(at::equal(pinned, host));
  torch::Tensor there = pinned.to(backend->device(0), /*non_blocking=*/true);
  backend->synchronize(0);
  EXPECT_TRUE(at::equal(there.cpu(), host));
}

// stage() puts a (pinned) batch on the device for the work queued after it: that work must see
// the copied values, however soon it is queued, and the host may drop its copy at once. The same
// holds for a batch prefetch()ed on another thread and then staged.
TEST_P(DeviceConformance, StageGivesLaterWorkTheBatch) {
  AVAILABLE_OR_SKIP(backend);
  const torch::Device device = backend->device(0);
  std::vector<at::Tensor> sums;
  for (int i = 0; i < 24; ++i) {
    trainyard::Batch host;
    host.size = 256;
    host.tensors["input"] = backend->pin(at::full({256, 1, 28, 28}, static_cast<float>(i)));
    host.tensors["nested.target"] = backend->pin(at::arange(256, at::kLong) + i);
    trainyard::Batch staged;
    if (i % 2 == 1) {
      // As the loader's workers do: prefetch on another thread, stage where the batch is used.
      trainyard::Batch prefetched;
      std::thread worker([&] { prefetched = backend->prefetch(host, 0); });
      worker.join();
      host = trainyard::Batch{};
      staged = backend->stage(prefetched, 0);
    } else {
      staged = backend->stage(host, 0);
    }
    host = trainyard::Batch{};  // the host copy goes away while the transfer may be in flight
    ASSERT_EQ(staged.size, 256);
    ASSERT_EQ(staged.tensors.size(), 2u);
    for (const auto& [name, tensor] : staged.tensors) EXPECT_EQ(tensor.device(), device) << name;
    // Queued right behind the copy, on the current stream.
    sums.push_back(staged.at("input").sum() + staged.at("nested.target").sum().to(at::kFloat));
  }
  backend->synchronize(0);
  for (int i = 0; i < 24; ++i) {
    const double expected = 256.0 * 784 * i + (255.0 * 256 / 2 + 256.0 * i);
    EXPECT_DOUBLE_EQ(sums[static_cast<std::size_t>(i)].item<double>(), expected) << "batch " << i;
  }
}

TEST_P(DeviceConformance, RngStateRestoresTheSequence) {
  AVAILABLE_OR_SKIP(backend);
  backend->manual_seed(1234);
  trainyard::StateDict saved;
  backend->save_rng_state(saved);
  if (saved.tensors.empty()) {
    GTEST_SKIP() << "the backend keeps no generator state of its own (the engine saves torch's "
                    "default CPU generator)";
  }
  const auto options = torch::TensorOptions().device(backend->device(0));
  torch::Tensor first = torch::randn({64}, options).cpu();
  backend->load_rng_state(saved);
  torch::Tensor again = torch::randn({64}, options).cpu();
  EXPECT_TRUE(at::equal(first, again)) << "load_rng_state did not restore the generator";
  backend->manual_seed(1234);
  torch::Tensor reseeded = torch::randn({64}, options).cpu();
  EXPECT_TRUE(at::equal(first, reseeded)) << "manual_seed is not deterministic";
}

// What activation checkpointing replays: rng_state() read before random work and set back makes
// the device draw the same numbers again.
TEST_P(DeviceConformance, GeneratorStateReplaysRandomWork) {
  AVAILABLE_OR_SKIP(backend);
  const auto options = torch::TensorOptions().device(backend->device(0));
  const torch::Tensor state = backend->rng_state(0);
  ASSERT_TRUE(state.defined());
  torch::Tensor first = torch::rand({64}, options).cpu();
  backend->set_rng_state(0, state);
  torch::Tensor again = torch::rand({64}, options).cpu();
  EXPECT_TRUE(at::equal(first, again)) << "set_rng_state did not replay the draws";
}

// What the runtime asks instead of naming device types: a device for each local rank within
// range, a default communicator that is loaded and serves this type, and doctor lines that say
// something.
TEST_P(DeviceConformance, PlacementCommAndDoctorHooks) {
  auto backend = build();
  for (const auto& line : backend->doctor_report()) EXPECT_FALSE(line.empty());
  if (!backend->available()) GTEST_SKIP() << "device '" << GetParam() << "' is not available";
  for (int local_rank = 0; local_rank < backend->device_count(); ++local_rank) {
    const auto own = backend->device_for_local_rank(local_rank);
    if (own) { EXPECT_EQ(*own, local_rank) << "each local rank drives a device of its own"; }
  }
  const std::string comm = backend->default_comm();
  if (comm.empty()) return;
  const auto& registry = trainyard::conformance::registry();
  ASSERT_TRUE(registry.contains("comm", comm)) << "default comm '" << comm << "' is not loaded";
  auto communicator = registry.create<trainyard::Communicator>(
      comm, trainyard::conformance::section("comm"),
      trainyard::conformance::classification_context());
  const auto types = communicator->device_types();
  EXPECT_NE(std::find(types.begin(), types.end(), GetParam()), types.end())
      << "the default comm '" << comm << "' does not serve " << GetParam() << " devices";
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(DeviceConformance, "device");
