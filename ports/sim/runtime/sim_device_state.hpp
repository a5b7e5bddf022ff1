#pragma once
// The calling thread's current sim device, shared by the guard, the allocator and the kernels.

namespace sim {

inline constexpr int kMaxDevices = 8;

int current_device();
void set_current_device(int index);
void check_device_index(int index);

}  // namespace sim
