#pragma once
// Numeric precision of the step: autocast, loss scaling and their state.

#include <torch/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/api/component.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

class DeviceBackend;

// A precision plugin. The strategy runs forward and loss inside autocast(device) and
// backpropagates scale_loss(loss). After backward (and after any gradient reduction) it:
//   1. found_inf = unscale(gradients)   unscales in place, reports non-finite values; no host sync
//   2. sharded strategies all-reduce found_inf (max) across the ranks holding other shards,
//      so every rank takes the same decision
//   3. clips (the norm of unscaled gradients), then steps the optimizer unless should_step says
//      otherwise (the one host sync, made only by precisions that scale)
//   4. update(found_inf) after every step, skipped or not
// unscale_and_check() and update(bool) do 1, 3 and 4 for strategies whose gradients are complete
// on every rank (single, DDP after its all-reduce).
class Precision : public Component {
 public:
  static constexpr const char* kKind = "precision";
  // Throws Error naming the device and the precision when the device cannot run it.
  virtual void check_device(const torch::Device& device) const {}
  // The autocast dtype, or nullopt to run in the parameters' own dtype.
  virtual std::optional<torch::ScalarType> autocast_dtype() const = 0;
  // Whether this precision scales the loss, skipping the steps whose scaled gradients overflow
  // as its scale adapts (fp16): the engine's non-finite policy ([run] on_nonfinite) is then
  // left to it.
  virtual bool scales_loss() const { return false; }
  virtual torch::Tensor scale_loss(const torch::Tensor& loss) { return loss; }
  // Unscales `gradients` in place. Returns a one-element float tensor, 1 when any of them is inf
  // or nan and 0 otherwise, on the device of the loss scale; or an undefined tensor when this
  // precision does not scale (its gradients need no check and no reduction).
  virtual torch::Tensor unscale(const std::vector<torch::Tensor>& gradients) { return {}; }
  // Records a step's outcome and adjusts the scale; `found_inf` as unscale returned it (reduced
  // across shards), undefined meaning finite.
  virtual void update(const torch::Tensor& found_inf) {}
  virtual void save_state(StateDict& out) const {}
  virtual void load_state(const StateDict& in) {}
  // Values worth logging (the loss scale), read only at logging time.
  virtual std::vector<std::pair<std::string, double>> metrics() const { return {}; }

  // Whether the optimizer may step: found_inf undefined or zero. Syncs with the device only when
  // found_inf is defined.
  static bool should_step(const torch::Tensor& found_inf);
  // unscale() then should_step(): false when any gradient is inf or nan.
  bool unscale_and_check(const std::vector<torch::Tensor>& gradients);
  // update() with a host-side outcome.
  void update(bool found_inf);
};

// For a precision's check_device: throws Error naming `precision` and `device` unless autocast can
// run in `dtype` there. The host CPU always can (ATen's CPU autocast); another device when its
// type has autocast and `backend` (the backend driving it; null when unknown) lists `dtype` among
// the device's fast_compute_dtypes. `instead` names the precisions to suggest ("fp16' or 'fp32").
void check_native_dtype(const std::string& precision, const torch::Device& device,
                        torch::ScalarType dtype, const DeviceBackend* backend,
                        const std::string& instead);

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
