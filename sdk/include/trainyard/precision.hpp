#pragma once
// Numeric precision of the step: autocast, loss scaling and their state.

#include <torch/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/component.hpp"
#include "trainyard/state.hpp"

namespace trainyard {

// A precision plugin. The strategy runs forward and loss inside autocast(device), backpropagates
// scale_loss(loss), calls unscale_and_check on the gradients before clipping, skips the
// optimizer step when it returns false, and calls update() after every step.
class Precision : public Component {
 public:
  static constexpr const char* kKind = "precision";
  // Throws Error naming the device and the precision when the device cannot run it.
  virtual void check_device(const torch::Device& device) const {}
  // The autocast dtype, or nullopt to run in the parameters' own dtype.
  virtual std::optional<torch::ScalarType> autocast_dtype() const = 0;
  virtual torch::Tensor scale_loss(const torch::Tensor& loss) { return loss; }
  // Unscales gradients in place; false when any is inf or nan.
  virtual bool unscale_and_check(const std::vector<torch::Tensor>& gradients) { return true; }
  virtual void update(bool found_inf) {}
  virtual void save_state(StateDict& out) const {}
  virtual void load_state(const StateDict& in) {}
  // Values worth logging (the loss scale), read only at logging time.
  virtual std::vector<std::pair<std::string, double>> metrics() const { return {}; }
};

// Enables autocast for `device_type` with `dtype` for the guard's lifetime; does nothing for
// nullopt. Nests correctly and clears the cast cache when the outermost guard ends.
class AutocastGuard {
 public:
  AutocastGuard(torch::DeviceType device_type, std::optional<torch::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType device_type_;
  bool active_ = false;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat;
};

}  // namespace trainyard
