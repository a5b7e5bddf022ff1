// The current sim device of each thread, and the device count a process sees.

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

#include "sim_device_state.hpp"
#include "sim_runtime.hpp"

namespace sim {
namespace {

thread_local int current = 0;

int count_from_environment() {
  const char* text = std::getenv("SIM_DEVICE_COUNT");
  if (text == nullptr || *text == '\0') return 2;
  char* end = nullptr;
  const long count = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && count >= 1 && count <= kMaxDevices,
              "sim: SIM_DEVICE_COUNT must be a whole number from 1 to ", kMaxDevices, ", got '",
              text, "'");
  return static_cast<int>(count);
}

}  // namespace

int device_count() {
  static const int count = count_from_environment();
  return count;
}

void check_device_index(int index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "sim: no device ", index, " (", device_count(),
              " present)");
}

int current_device() { return current; }

void set_current_device(int index) {
  check_device_index(index);
  current = index;
}

void ensure_registered() {
  static const bool named = [] {
    c10::register_privateuse1_backend("sim");
    return true;
  }();
  (void)named;
}

c10::Device device(int index) {
  ensure_registered();
  check_device_index(index);
  return {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)};
}

}  // namespace sim
