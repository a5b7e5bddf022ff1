#pragma once
// The `sim` accelerator: a PrivateUse1 device whose memory lives in host memory behind its own
// allocator, with its own streams, events and random generator, and kernels that run through a
// boxed CPU fallback. It stands in for real hardware when porting trainyard: everything a
// hardware port writes (allocator, device guard, generator, kernels, device and comm plugins) is
// here, small enough to read in one sitting.

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace sim {

// The number of sim devices a process sees (SIM_DEVICE_COUNT, 2 when unset).
int device_count();

// Registers the backend under the name "sim" (idempotent): the allocator, device guard, hooks and
// kernels register themselves when this library loads; this names the device type.
void ensure_registered();

c10::Device device(int index);

struct MemoryStats {
  std::int64_t allocated_bytes = 0;       // live allocations now
  std::int64_t peak_allocated_bytes = 0;  // since start or the last reset_peak
  std::int64_t allocations = 0;           // calls to the allocator, ever
};

MemoryStats memory_stats(int index);
void reset_peak_memory(int index);

// The default generator of device `index`: the one sim kernels draw from when an op is given none.
const at::Generator& default_generator(int index);

}  // namespace sim
