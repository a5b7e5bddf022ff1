// NVIDIA GPUs through LibTorch's CUDA runtime: events, caching-allocator statistics, pinned
// staging memory and per-device generators; utilisation from NVML when the driver provides it.

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include <map>
#include <mutex>

#include "nvml.hpp"

#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/support/libtorch_build.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(int index) : index_(index), event_(cudaEventDefault) {}
  void record() override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index_));
    event_.record(at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)));
  }
  double elapsed_ms(const DeviceEvent& later) const override {
    const auto& other = dynamic_cast<const CudaEvent&>(later);
    other.event_.synchronize();
    return event_.elapsed_time(other.event_);
  }

 private:
  int index_;
  mutable at::cuda::CUDAEvent event_;
};

class Cuda final : public DeviceBackend {
 public:
  bool available() const override { return torch::cuda::is_available(); }
  int device_count() const override { return static_cast<int>(torch::cuda::device_count()); }
  torch::Device device(int index) const override {
    if (index < 0 || index >= device_count()) {
      throw Error("no cuda device " + std::to_string(index) + " (" +
                  std::to_string(device_count()) + " present)");
    }
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  // Preferred over the host by `auto`; each rank of a machine drives the GPU of its local rank
  // and the ranks meet over NCCL.
  int auto_preference() const override { return 100; }
  std::optional<int> device_for_local_rank(int local_rank) const override { return local_rank; }
  std::string default_comm() const override { return "nccl"; }
  // The CUDA and cuDNN versions LibTorch was built with, and the driver's, when one is loaded.
  std::vector<std::string> profiler_activities() const override { return {"CUDA"}; }

  std::vector<std::string> doctor_report() const override {
    if (!libtorch_built_with("USE_CUDA")) return {"LibTorch was built without CUDA"};
    std::string line = "LibTorch built with CUDA " + libtorch_build_setting("CUDA_VERSION") +
                       ", cuDNN " + libtorch_build_setting("CUDNN_VERSION");
    int driver = 0;
    if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
      line += "; driver supports CUDA " + std::to_string(driver / 1000) + "." +
              std::to_string(driver % 1000 / 10);
    } else {
      (void)cudaGetLastError();
      line += "; no CUDA driver";
    }
    return {line};
  }
  void synchronize(int index) override { torch::cuda::synchronize(index); }
  DeviceMemory memory(int index) const override {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
    using c10::CachingDeviceAllocator::StatType;
    const auto& allocated = stats.allocated_bytes[static_cast<std::size_t>(StatType::AGGREGATE)];
    const auto& reserved = stats.reserved_bytes[static_cast<std::size_t>(StatType::AGGREGATE)];
    DeviceMemory memory;
    memory.current_bytes = allocated.current;
    memory.peak_bytes = allocated.peak;
    memory.reserved_bytes = reserved.current;
    memory.peak_reserved_bytes = reserved.peak;
    std::size_t free_bytes = 0, total_bytes = 0;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      memory.total_bytes = static_cast<std::int64_t>(total_bytes);
    }
    return memory;
  }
  void reset_peak_memory(int index) override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
  }
  // NVML's figures for the GPU this process calls `index` (found by PCI bus id, since
  // CUDA_VISIBLE_DEVICES renumbers devices and NVML does not); nothing without NVML.
  DeviceUtilisation utilisation(int index) override {
    const Nvml* nvml = management_library();
    if (nvml == nullptr) return {};
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, index) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; clear it so nobody else reports it
      return {};
    }
    const std::optional<NvmlReading> reading = nvml->read(bus_id, static_cast<unsigned>(index));
    DeviceUtilisation utilisation;
    if (!reading) return utilisation;
    if (reading->gpu_busy_percent) utilisation.compute_share = *reading->gpu_busy_percent / 100.0;
    if (reading->memory_used_bytes) {
      utilisation.memory_used_bytes = static_cast<std::int64_t>(*reading->memory_used_bytes);
    }
    return utilisation;
  }
  // Tensor cores: fp16 from compute capability 7.0 (Volta), bf16 from 8.0 (Ampere).
  std::vector<at::ScalarType> fast_compute_dtypes(int index) const override {
    const cudaDeviceProp* properties =
        at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
    std::vector<at::ScalarType> fast{at::kFloat};
    if (properties->major >= 8) fast.push_back(at::kBFloat16);
    if (properties->major >= 7) fast.push_back(at::kHalf);
    return fast;
  }
  std::string device_name(int index) const override {
    return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->name;
  }
  torch::Tensor pin(const torch::Tensor& host) const override { return host.pin_memory(); }
  // Copies on a side stream, so the copy runs while the kernels queued before it (the previous
  // step) still run on the current stream; the current stream then waits on an event for the
  // side stream's copies (this batch's, and any prefetch() of it from a loader worker) before
  // anything queued after this call. Only pinned sources copy without blocking the host; others
  // are copied synchronously on the side stream (still correct).
  Batch stage(const Batch& host, int index) override {
    const auto device_index = static_cast<c10::DeviceIndex>(index);
    c10::cuda::CUDAGuard guard(device_index);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_index);
    std::lock_guard<std::mutex> lock(mutex_);
    Batch out = copy_on_side_stream(host, device_index);
    // One event per device, recorded anew each time: a wait takes the event's state when it is
    // queued, so reuse is safe and spares creating an event per batch.
    at::cuda::CUDAEvent& copied = copy_events_[device_index];
    copied.record(copy_stream(device_index));
    copied.block(compute);
    // The memory was allocated on the side stream; the allocator must not hand it out again
    // before the compute stream is done with it.
    for (const auto& [name, tensor] : out.tensors) {
      if (tensor.is_cuda() && tensor.storage().data_ptr().get() != nullptr) {
        c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), compute);
      }
    }
    return out;
  }
  // Queues the copies on the side stream and returns; stage() later orders the consumer after
  // them. The lock serializes loader workers over the shared stream and event tables.
  Batch prefetch(const Batch& host, int index) override {
    const auto device_index = static_cast<c10::DeviceIndex>(index);
    c10::cuda::CUDAGuard guard(device_index);
    std::lock_guard<std::mutex> lock(mutex_);
    return copy_on_side_stream(host, device_index);
  }
  void manual_seed(std::uint64_t seed) override {
    if (available()) torch::cuda::manual_seed_all(seed);
  }
  void save_rng_state(StateDict& out) const override {
    for (int i = 0; i < device_count(); ++i) {
      auto generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(i));
      std::lock_guard<std::mutex> lock(generator.mutex());
      out.tensors["engine.rng.cuda." + std::to_string(i)] = generator.get_state();
    }
  }
  void load_rng_state(const StateDict& in) override {
    for (int i = 0; i < device_count(); ++i) {
      auto it = in.tensors.find("engine.rng.cuda." + std::to_string(i));
      if (it == in.tensors.end()) continue;
      auto generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(i));
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(it->second);
    }
  }
  torch::Tensor rng_state(int index) const override {
    auto generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }
  void set_rng_state(int index, const torch::Tensor& state) override {
    auto generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }

 protected:
  std::unique_ptr<DeviceEvent> make_event(int index) override {
    return std::make_unique<CudaEvent>(index);
  }

 private:
  // NVML, opened on first use (null without it: utilisation is then not reported).
  const Nvml* management_library() {
    std::call_once(nvml_opened_, [this] { nvml_ = Nvml::open(); });
    return nvml_.get();
  }

  // Called with mutex_ held. Tensors already on the device stay as they are.
  Batch copy_on_side_stream(const Batch& host, c10::DeviceIndex device_index) {
    const torch::Device target(torch::kCUDA, device_index);
    Batch out;
    out.size = host.size;
    c10::cuda::CUDAStreamGuard on_copy_stream(copy_stream(device_index));
    for (const auto& [name, tensor] : host.tensors) {
      out.tensors.emplace(name, tensor.to(target, /*non_blocking=*/tensor.is_pinned()));
    }
    return out;
  }

  // One side stream per device, drawn once: staging always queues behind its own earlier copies.
  c10::cuda::CUDAStream copy_stream(c10::DeviceIndex index) {
    auto it = copy_streams_.find(index);
    if (it == copy_streams_.end()) {
      it = copy_streams_.emplace(index, c10::cuda::getStreamFromPool(false, index)).first;
    }
    return it->second;
  }

  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> copy_streams_;
  std::map<c10::DeviceIndex, at::cuda::CUDAEvent> copy_events_;
  std::mutex mutex_;
  std::once_flag nvml_opened_;
  std::unique_ptr<Nvml> nvml_;
};

void register_components(Registry& registry) {
  registry.add<DeviceBackend>("cuda", {}, "NVIDIA GPUs (cuda, cuda:N)",
                              [](const Config&, const BuildContext&) {
                                return std::make_unique<Cuda>();
                              });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("cuda", "1.0.0", trainyard::register_components)
