// What the device backends report while a run trains: the host process's share of its cores,
// NVML's absence kept quiet, the dtypes each device computes fast and the advice that follows
// from them, and the cached peak FLOP/s that model FLOPs utilisation divides by.

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "nvml.hpp"
#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/support/host_cpu.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"
#include "trainyard/runtime/cpu_binding.hpp"
#include "trainyard/runtime/peak_flops.hpp"
#include "trainyard/api/step_phases.hpp"

namespace trainyard::testing {
namespace {

std::shared_ptr<DeviceBackend> backend(const std::string& name) {
  return bundled_registry().create<DeviceBackend>(name, Config({}, "device"), BuildContext{});
}

bool has(const std::vector<c10::ScalarType>& dtypes, c10::ScalarType dtype) {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

// Keeps one thread per usable core spinning for `duration`.
void keep_every_core_busy(std::chrono::milliseconds duration) {
  const std::size_t cores = std::max<std::size_t>(1, allowed_cpus().size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cores; ++i) {
    threads.emplace_back([duration] {
      const auto until = std::chrono::steady_clock::now() + duration;
      volatile double sink = 0;
      while (std::chrono::steady_clock::now() < until) sink = sink + 1.0;
    });
  }
  for (auto& thread : threads) thread.join();
}

TEST(ProcessCpuUsage, IsTheShareOfTheUsableCoresTheProcessKeepsBusy) {
  ProcessCpuUsage usage;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::optional<double> sleeping = usage.share_since_last();
  keep_every_core_busy(std::chrono::milliseconds(600));
  const std::optional<double> busy = usage.share_since_last();
  ASSERT_TRUE(sleeping.has_value());
  ASSERT_TRUE(busy.has_value());
  EXPECT_GE(*sleeping, 0.0);
  EXPECT_LT(*sleeping, 0.05) << "a sleeping process uses next to no CPU";
  // One busy thread per usable core is 1.0 on an idle machine; other processes take their turns
  // on a loaded one (so the lower bound is loose), but the figure never passes 1 (a little clock
  // skew aside).
  EXPECT_LE(*busy, 1.05);
  EXPECT_GT(*busy, 0.05) << "every usable core spinning";
  EXPECT_GT(*busy, 5 * *sleeping);
}

TEST(ProcessCpuUsage, TheCpuDeviceReportsItAsItsComputeShare) {
  auto cpu = backend("cpu");
  cpu->utilisation(0);
  keep_every_core_busy(std::chrono::milliseconds(300));
  const DeviceUtilisation utilisation = cpu->utilisation(0);
  ASSERT_TRUE(utilisation.compute_share.has_value());
  EXPECT_GT(*utilisation.compute_share, 0.05);
  EXPECT_LE(*utilisation.compute_share, 1.05);
}

// Both streams, as the file descriptors see them (a dlopen error would print through stdio).
struct Captured {
  std::string out;
  std::string err;
};
template <typename Body>
Captured captured_output(Body&& body) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  body();
  Captured captured;
  captured.out = ::testing::internal::GetCapturedStdout();
  captured.err = ::testing::internal::GetCapturedStderr();
  return captured;
}

TEST(Nvml, AMissingLibraryIsNotReportedQuietly) {
  std::unique_ptr<Nvml> nvml;
  const Captured output =
      captured_output([&] { nvml = Nvml::open("libnvidia-ml-that-does-not-exist.so.1"); });
  EXPECT_TRUE(nvml == nullptr);
  EXPECT_EQ(output.out, "");
  EXPECT_EQ(output.err, "");
}

TEST(Nvml, ALibraryWithoutNvmlsFunctionsIsNotReportedQuietly) {
  std::unique_ptr<Nvml> nvml;
  const Captured output = captured_output([&] { nvml = Nvml::open("libc.so.6"); });
  EXPECT_TRUE(nvml == nullptr) << "libc has no nvmlInit_v2";
  EXPECT_EQ(output.out, "");
  EXPECT_EQ(output.err, "");
}

// Here (no NVIDIA driver library) the cuda plugin reports nothing, quietly; on a machine with the
// driver it reports the GPU's busy share.
TEST(Nvml, TheCudaPluginsUtilisationIsQuietWithoutTheDriver) {
  const bool driver_present = Nvml::open() != nullptr;
  auto cuda = backend("cuda");
  DeviceUtilisation utilisation;
  const Captured output =
      captured_output([&] { EXPECT_NO_THROW(utilisation = cuda->utilisation(0)); });
  EXPECT_EQ(output.out, "");
  EXPECT_EQ(output.err, "");
  if (!driver_present) {
    EXPECT_FALSE(utilisation.compute_share.has_value());
    EXPECT_FALSE(utilisation.memory_used_bytes.has_value());
  } else if (cuda->available()) {
    ASSERT_TRUE(utilisation.compute_share.has_value());
    EXPECT_GE(*utilisation.compute_share, 0.0);
    EXPECT_LE(*utilisation.compute_share, 1.0);
    ASSERT_TRUE(utilisation.memory_used_bytes.has_value());
    EXPECT_GT(*utilisation.memory_used_bytes, 0);
  }
}

TEST(FastDtypes, TheCpuIsFastInBfloat16OnlyWithItsInstructions) {
  EXPECT_EQ(cpu_fast_dtypes("fpu sse2 avx2 avx512f avx512_fp16"),
            std::vector<c10::ScalarType>{c10::kFloat});
  EXPECT_TRUE(has(cpu_fast_dtypes("fpu avx512f avx512_bf16"), c10::kBFloat16));
  EXPECT_TRUE(has(cpu_fast_dtypes("fpu amx_tile amx_bf16"), c10::kBFloat16));
  EXPECT_TRUE(has(cpu_fast_dtypes("amx_bf16 amx_fp16"), c10::kHalf));
  EXPECT_FALSE(has(cpu_fast_dtypes("avx512_bf16x"), c10::kBFloat16)) << "whole flags only";
}

class FakeDevice final : public DeviceBackend {
 public:
  explicit FakeDevice(std::vector<c10::ScalarType> fast) : fast_(std::move(fast)) {}
  bool available() const override { return true; }
  int device_count() const override { return 1; }
  torch::Device device(int) const override { return torch::kCPU; }
  void synchronize(int) override {}
  DeviceMemory memory(int) const override { return {}; }
  std::vector<c10::ScalarType> fast_compute_dtypes(int) const override { return fast_; }
  void manual_seed(std::uint64_t) override {}
  void save_rng_state(StateDict&) const override {}
  void load_rng_state(const StateDict&) override {}

 protected:
  std::unique_ptr<DeviceEvent> make_event(int) override {
    return std::make_unique<HostClockEvent>();
  }

 private:
  std::vector<c10::ScalarType> fast_;
};

// A compute-bound run: forward, backward and optimizer take 90% of the step.
std::string compute_bound_advice(const DeviceBackend& device,
                                 std::optional<c10::ScalarType> run_autocast) {
  const auto lines =
      describe_bottleneck({2, 3, 40, 40, 5, 10}, 10, 10.0,
                          faster_precision(device.fast_compute_dtypes(0), run_autocast));
  EXPECT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines.back().rfind("compute-bound: forward, backward and optimizer take 90%", 0), 0u);
  return lines.back();
}

TEST(BottleneckAdvice, RecommendsOnlyAPrecisionTheDeviceComputesFast) {
  const FakeDevice bf16_device({c10::kFloat, c10::kBFloat16, c10::kHalf});
  EXPECT_HAS(compute_bound_advice(bf16_device, std::nullopt), "consider bf16 precision");
  const FakeDevice fp16_device({c10::kFloat, c10::kHalf});
  EXPECT_HAS(compute_bound_advice(fp16_device, std::nullopt), "consider fp16 precision");
  const FakeDevice fp32_device({c10::kFloat});
  const std::string fp32_advice = compute_bound_advice(fp32_device, std::nullopt);
  EXPECT_EQ(fp32_advice.find("bf16"), std::string::npos) << fp32_advice;
  EXPECT_EQ(fp32_advice.find("fp16"), std::string::npos) << fp32_advice;
  EXPECT_HAS(fp32_advice, "a larger batch");
  // A run already in half precision is not told to switch.
  const std::string half_run = compute_bound_advice(bf16_device, c10::kBFloat16);
  EXPECT_EQ(half_run.find("precision"), std::string::npos) << half_run;
}

TEST(BottleneckAdvice, TheCpuHereGetsBf16AdviceOnlyWithBf16Instructions) {
  const std::string flags = host_cpu_flags();
  ASSERT_FALSE(flags.empty()) << "/proc/cpuinfo has no flags line";
  const bool bf16_instructions =
      flags.find("avx512_bf16") != std::string::npos || flags.find("amx_bf16") != std::string::npos;
  auto cpu = backend("cpu");
  EXPECT_EQ(has(cpu->fast_compute_dtypes(0), c10::kBFloat16), bf16_instructions);
  const std::string advice = compute_bound_advice(*cpu, std::nullopt);
  EXPECT_EQ(advice.find("bf16") != std::string::npos, bf16_instructions) << advice;
}

class PeakCache : public ::testing::Test {
 protected:
  std::shared_ptr<DeviceBackend> cpu_ = backend("cpu");
  TempDir folder_;
  std::vector<std::string> warnings_;
  std::function<void(const std::string&)> warn_ = [this](const std::string& line) {
    warnings_.push_back(line);
  };
  PeakFlops peak() { return cached_or_measured_peak(*cpu_, 0, c10::kFloat, folder_.path(), warn_); }
  std::filesystem::path entry() const {
    return PeakProbeKey::of(*cpu_, 0, c10::kFloat).file_in(folder_.path());
  }
};

TEST_F(PeakCache, AMeasuredPeakIsReusedFromItsFile) {
  const PeakFlops first = peak();
  EXPECT_EQ(first.source, PeakSource::Measured);
  EXPECT_GT(first.flops_per_s, 0);
  EXPECT_EQ(first.cache_file, entry());
  ASSERT_TRUE(std::filesystem::exists(entry()));
  const PeakFlops second = peak();
  EXPECT_EQ(second.source, PeakSource::Cached);
  EXPECT_EQ(second.flops_per_s, first.flops_per_s) << "the same figure, bit for bit";
  EXPECT_TRUE(warnings_.empty());
  // The file says what it was measured on.
  const std::string text = read_text(entry());
  EXPECT_HAS(text, "dtype = float32");
  EXPECT_HAS(text, "threads = " + std::to_string(at::get_num_threads()));
  EXPECT_HAS(text, "device = cpu ");
}

TEST_F(PeakCache, AnUnreadableEntryIsReplacedWithOneWarningLine) {
  const PeakFlops valid = peak();
  const std::string whole = read_text(entry());
  const std::vector<std::string> broken = {
      "\x01\x02 not a cache file",
      whole.substr(0, whole.size() / 2),                // truncated mid-way
      whole.substr(0, whole.find("flops_per_s")),       // cut before the figure
      whole.substr(0, whole.rfind('=') + 2) + "-3\n",   // a negative figure
      whole.substr(0, whole.rfind('=') + 2) + "nan\n",  // not a number
      "",                                               // empty
  };
  for (const std::string& text : broken) {
    std::ofstream(entry(), std::ios::trunc) << text;
    warnings_.clear();
    const PeakFlops again = peak();
    EXPECT_EQ(again.source, PeakSource::Measured) << text;
    EXPECT_GT(again.flops_per_s, 0);
    ASSERT_EQ(warnings_.size(), 1u) << text;
    EXPECT_EQ(warnings_[0].find('\n'), std::string::npos) << "one line: " << warnings_[0];
    EXPECT_HAS(warnings_[0], entry().string());
    warnings_.clear();
    EXPECT_EQ(peak().source, PeakSource::Cached) << "the entry was replaced";
    EXPECT_TRUE(warnings_.empty());
  }
  EXPECT_GT(valid.flops_per_s, 0);
}

TEST_F(PeakCache, AnEntryForAnotherThreadCountIsNotUsed) {
  peak();
  std::string text = read_text(entry());
  const std::string threads = "threads = " + std::to_string(at::get_num_threads());
  text.replace(text.find(threads), threads.size(), "threads = 999");
  std::ofstream(entry(), std::ios::trunc) << text;
  EXPECT_EQ(peak().source, PeakSource::Measured);
  EXPECT_EQ(warnings_.size(), 1u);
}

TEST_F(PeakCache, ADeclaredPeakWinsOverTheCache) {
  peak();
  const PeakFlops declared = resolve_peak_flops(2.5, *cpu_, 0, std::nullopt, folder_.path(), warn_);
  EXPECT_EQ(declared.source, PeakSource::Declared);
  EXPECT_DOUBLE_EQ(declared.flops_per_s, 2.5e12);
  EXPECT_HAS(describe_peak(declared), "declared");
  const PeakFlops cached = resolve_peak_flops(0, *cpu_, 0, std::nullopt, folder_.path(), warn_);
  EXPECT_EQ(cached.source, PeakSource::Cached);
}

TEST_F(PeakCache, AFolderThatCannotBeWrittenStillGivesTheMeasuredPeak) {
  const std::filesystem::path blocked = folder_.write("a_file", "not a folder") / "peak_flops";
  const PeakFlops peak = cached_or_measured_peak(*cpu_, 0, c10::kFloat, blocked, warn_);
  EXPECT_EQ(peak.source, PeakSource::Measured);
  EXPECT_GT(peak.flops_per_s, 0);
  EXPECT_TRUE(peak.cache_file.empty());
}

TEST(PeakProbe, DrawsNoRandomNumbers) {
  auto cpu = backend("cpu");
  torch::manual_seed(7);
  const at::Tensor expected = torch::randn({8});
  torch::manual_seed(7);
  EXPECT_GT(measure_peak_flops(*cpu, 0, c10::kFloat), 0);
  EXPECT_TRUE(torch::equal(torch::randn({8}), expected));
}

// The CPU backend with a peak that behaves as CUDA's: the allocator's peak since the last
// reset_peak_memory, counted by the allocation tracker.
class TrackedPeakCpu final : public DeviceBackend {
 public:
  explicit TrackedPeakCpu(std::shared_ptr<DeviceBackend> cpu) : cpu_(std::move(cpu)) {}
  bool available() const override { return true; }
  int device_count() const override { return 1; }
  torch::Device device(int index) const override { return cpu_->device(index); }
  void synchronize(int index) override { cpu_->synchronize(index); }
  DeviceMemory memory(int) const override {
    DeviceMemory memory;
    memory.current_bytes = tracker_.current_bytes();
    memory.peak_bytes = tracker_.peak_bytes();
    return memory;
  }
  void reset_peak_memory(int) override { tracker_.reset_peak(); }
  void manual_seed(std::uint64_t) override {}
  void save_rng_state(StateDict&) const override {}
  void load_rng_state(const StateDict&) override {}

 protected:
  std::unique_ptr<DeviceEvent> make_event(int) override {
    return std::make_unique<HostClockEvent>();
  }

 private:
  std::shared_ptr<DeviceBackend> cpu_;
  AllocationTracker tracker_;
};

TEST(PeakProbe, LeavesNoTraceInThePeakMemory) {
  // The run's reported peak is what training needs: the probe's matrices (three of 512 x 512
  // floats on the CPU, 1 MiB each) must not show in it.
  TrackedPeakCpu device(backend("cpu"));
  ASSERT_GT(measure_peak_flops(device, 0, c10::kFloat), 0);
  const std::int64_t probe_matrix = 512 * 512 * 4;
  EXPECT_LT(device.memory(0).peak_bytes, probe_matrix)
      << "the peak after the probe still holds its matrices";
  // The tracker does see them: without the reset the peak would hold all three.
  at::Tensor held = at::empty({3 * 512 * 512}, at::kFloat);
  EXPECT_GE(device.memory(0).peak_bytes, 3 * probe_matrix);
}

}  // namespace
}  // namespace trainyard::testing
