#pragma once
// Device backends: the only place the runtime learns how to drive a kind of device.

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/component.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

// A point on a device's timeline; elapsed time between two recorded events needs no host sync
// until it is read.
class DeviceEvent {
 public:
  virtual ~DeviceEvent();
  virtual void record() = 0;
  // Milliseconds from this event to `later`; waits for both to complete.
  virtual double elapsed_ms(const DeviceEvent& later) const = 0;
};

// Steady-clock readings: the events of the host, where work is done when it is issued.
class HostClockEvent final : public DeviceEvent {
 public:
  void record() override;
  double elapsed_ms(const DeviceEvent& later) const override;

 private:
  std::chrono::steady_clock::time_point time_ = std::chrono::steady_clock::now();
};

struct DeviceMemory {
  std::int64_t current_bytes = 0;  // held by the allocator now (process RSS on the host)
  std::int64_t peak_bytes = 0;
  std::int64_t total_bytes = 0;  // device capacity; 0 when unknown
  // What a caching allocator holds from the device, handed out or not (at least current_bytes),
  // now and at its peak since the last reset; 0 where the allocator caches nothing (the host).
  std::int64_t reserved_bytes = 0;
  std::int64_t peak_reserved_bytes = 0;
};

// How busy a device was. An empty field is one the backend does not report (no error: a figure
// that cannot be measured on this machine is simply absent from the records).
struct DeviceUtilisation {
  // Share of the device's compute that was busy, 0 to 1: on the host, the process's CPU time over
  // the wall time of the cores it may run on; on a GPU, the share of time a kernel ran.
  std::optional<double> compute_share;
  // Device memory in use by every process and the driver (not only this process's allocator).
  std::optional<std::int64_t> memory_used_bytes;
};

// A device backend plugin, named after the device type it drives (the type's name in
// torch::Device, such as "cpu"). Everything the runtime does that depends on the kind of device
// goes through it: which device `auto` picks, which device each rank of a machine drives, the
// communication backend multi-process runs default to, the dtypes mixed precision may use, the
// generators activation checkpointing replays, events, memory, pinned staging and what `doctor`
// says about the device's software. A hardware port implements this interface and a
// Communicator; nothing in the SDK or the host names a device type.
class DeviceBackend : public Component {
 public:
  static constexpr const char* kKind = "device";
  // Whether this machine has at least one such device that works.
  virtual bool available() const = 0;
  virtual int device_count() const = 0;
  virtual torch::Device device(int index) const = 0;
  // Where `run.device = "auto"` ranks this backend among the loaded ones: the available backend
  // with the highest preference is chosen (the host CPU has 0, an accelerator more).
  virtual int auto_preference() const { return 0; }
  // The device the machine's `local_rank`-th process drives in a multi-process run, overriding
  // the index the recipe names; nullopt when the ranks of a machine share the device named.
  virtual std::optional<int> device_for_local_rank(int /*local_rank*/) const {
    return std::nullopt;
  }
  // The communicator plugin a multi-process run on this device uses when the recipe names none;
  // empty when there is none to default to (the recipe must then name [comm] plugin).
  virtual std::string default_comm() const { return {}; }
  virtual void synchronize(int index) = 0;
  // A new event on device `index`. The event keeps this backend's library loaded while it lives.
  std::shared_ptr<DeviceEvent> create_event(int index);
  virtual DeviceMemory memory(int index) const = 0;
  // Starts the peak of memory() afresh from the current figure (for per-step peaks).
  virtual void reset_peak_memory(int index) {}
  // The device's utilisation since the previous call (the first call: since the backend was
  // made), or over the device's own most recent sample period where that is all it reports.
  virtual DeviceUtilisation utilisation(int /*index*/) { return {}; }
  // The dtypes device `index` computes natively at full speed (float32 at least): the only ones
  // worth recommending for autocast, the ones its peak FLOP/s is probed in, and the ones a mixed
  // precision may run in on a device other than the host CPU.
  virtual std::vector<at::ScalarType> fast_compute_dtypes(int /*index*/) const {
    return {at::kFloat};
  }
  // What the device is, for people and for keying what was measured on it (an
  // accelerator's product name, the CPU's model name).
  virtual std::string device_name(int index) const { return device(index).str(); }
  // What `trainyard doctor` reports of the software driving this kind of device (runtime and
  // library versions), one line each; asked even when no device is available.
  virtual std::vector<std::string> doctor_report() const { return {}; }
  // The Kineto activities that record this device's own work beside the host's ops, by the
  // profiler's names for them (torch::profiler::impl::actToString); none by default.
  virtual std::vector<std::string> profiler_activities() const { return {}; }
  // A host copy in page-locked memory when the device copies from it faster; else `host`.
  virtual torch::Tensor pin(const torch::Tensor& host) const { return host; }
  // `host` on device `index`, for the work queued on the current stream after this call. The
  // copy must not block the host, and should overlap the work queued before it (the previous
  // step): an accelerator copies pinned batches on a side stream of its own and makes the
  // current stream wait for that stream. Tensors already on the device (from prefetch()) are not
  // copied again. The default copies in line, which on the host itself copies nothing.
  virtual Batch stage(const Batch& host, int index) { return host.to(device(index)); }
  // Starts copying `host` onto device `index` from a loader worker thread, without blocking and
  // without ordering any stream after the copy: the batch may be used only after stage() on the
  // thread that uses it. Must be safe to call from several threads at once.
  virtual Batch prefetch(const Batch& host, int index) { return host.to(device(index)); }
  // Seeds the device's generators and saves/restores their state for exact resume.
  virtual void manual_seed(std::uint64_t seed) = 0;
  virtual void save_rng_state(StateDict& out) const = 0;
  virtual void load_rng_state(const StateDict& in) = 0;
  // The state of device `index`'s default generator, and setting it back: what activation
  // checkpointing records before a block's forward and restores around its recompute, so random
  // ops (dropout) draw the same numbers twice. The default uses ATen's default generator of
  // device(index).
  virtual torch::Tensor rng_state(int index) const;
  virtual void set_rng_state(int index, const torch::Tensor& state);

 protected:
  // A new event on device `index` (create_event() binds it to this library).
  virtual std::unique_ptr<DeviceEvent> make_event(int index) = 0;
};

}  // namespace trainyard
