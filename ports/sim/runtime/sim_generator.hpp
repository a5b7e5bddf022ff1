#pragma once
// The sim device's random generator: its own seed and state, drawn with the CPU's mt19937
// engine, so that a sim kernel given this generator makes the numbers the CPU would make
// from the same seed.

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace sim {

class SimGenerator final : public c10::GeneratorImpl {
 public:
  SimGenerator(int device_index, std::uint64_t seed);

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  void set_current_seed(std::uint64_t seed) override;
  void set_offset(std::uint64_t offset) override;
  std::uint64_t get_offset() const override;
  std::uint64_t current_seed() const override;
  std::uint64_t seed() override;
  void set_state(const c10::TensorImpl& state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // The CPU generator the sim kernels draw from (callers hold this generator's mutex).
  const at::Generator& engine() const { return engine_; }

 private:
  SimGenerator* clone_impl() const override;

  int device_index_;
  at::Generator engine_;
};

}  // namespace sim
