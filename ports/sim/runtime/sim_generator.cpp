#include "sim_generator.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <array>
#include <mutex>

#include "sim_device_state.hpp"
#include "sim_runtime.hpp"

namespace sim {

SimGenerator::SimGenerator(int device_index, std::uint64_t seed)
    : c10::GeneratorImpl(
          c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index)),
          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      device_index_(device_index),
      engine_(at::detail::createCPUGenerator(seed)) {}

void SimGenerator::set_current_seed(std::uint64_t seed) { engine_.set_current_seed(seed); }
void SimGenerator::set_offset(std::uint64_t offset) { engine_.set_offset(offset); }
std::uint64_t SimGenerator::get_offset() const { return engine_.get_offset(); }
std::uint64_t SimGenerator::current_seed() const { return engine_.current_seed(); }
std::uint64_t SimGenerator::seed() { return engine_.seed(); }

void SimGenerator::set_state(const c10::TensorImpl& state) {
  engine_.unsafeGetGeneratorImpl()->set_state(state);
}

c10::intrusive_ptr<c10::TensorImpl> SimGenerator::get_state() const {
  return engine_.unsafeGetGeneratorImpl()->get_state();
}

SimGenerator* SimGenerator::clone_impl() const {
  auto* copy = new SimGenerator(device_index_, 0);
  copy->engine_ = engine_.clone();
  return copy;
}

const at::Generator& default_generator(int index) {
  check_device_index(index);
  static std::array<at::Generator, kMaxDevices> generators;
  static std::once_flag made;
  std::call_once(made, [] {
    for (int device = 0; device < device_count(); ++device) {
      generators[device] = at::make_generator<SimGenerator>(device, c10::default_rng_seed_val);
    }
  });
  return generators[index];
}

}  // namespace sim
