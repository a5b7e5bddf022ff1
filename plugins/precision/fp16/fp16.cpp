// float16 autocast with a dynamic loss scaler, following torch.amp.GradScaler: the loss is
// multiplied by the scale before backward; gradients are unscaled (and checked for inf/nan) before
// clipping; a step with non-finite gradients is skipped and the scale multiplied by
// backoff_factor; after growth_interval consecutive finite steps it is multiplied by
// growth_factor. The arithmetic is LibTorch's own (_amp_foreach_non_finite_check_and_unscale_,
// _amp_update_scale_), on the device, so a step makes no host sync except should_step's.

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <map>
#include <tuple>

#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"

namespace trainyard {
namespace {

struct Fp16Options {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

constexpr const char* kScaleKey = "precision.fp16.scale";
constexpr const char* kGrowthTrackerKey = "precision.fp16.growth_tracker";
constexpr const char* kSkippedKey = "precision.fp16.skipped_steps";

class Fp16 final : public Precision {
 public:
  Fp16(const Fp16Options& options, std::shared_ptr<DeviceBackend> device_backend)
      : options_(options), device_backend_(std::move(device_backend)) {
    scale_ = at::full({}, options_.init_scale, at::kFloat);
    growth_tracker_ = at::zeros({}, at::kInt);
    skipped_ = at::zeros({}, at::kLong);
  }

  // float16 must be one of the dtypes the device computes natively; the host CPU's autocast
  // runs it on any CPU.
  void check_device(const torch::Device& device) const override {
    check_native_dtype("fp16", device, torch::kHalf, device_backend_.get(), "bf16' or 'fp32");
  }

  std::optional<torch::ScalarType> autocast_dtype() const override { return torch::kHalf; }
  bool scales_loss() const override { return true; }

  torch::Tensor scale_loss(const torch::Tensor& loss) override {
    follow(loss.device());
    return loss * scale_;
  }

  torch::Tensor unscale(const std::vector<torch::Tensor>& gradients) override {
    // Reciprocal in double, as GradScaler does, so a power-of-two scale unscales exactly.
    const torch::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
    torch::Tensor found_inf = at::zeros({}, scale_.options());
    // The op wants one device and dtype per call.
    std::map<std::tuple<c10::DeviceType, c10::DeviceIndex, c10::ScalarType>,
             std::vector<torch::Tensor>>
        groups;
    for (const auto& gradient : gradients) {
      if (!gradient.defined()) continue;
      if (gradient.scalar_type() == at::kHalf) {
        throw Error("precision 'fp16' found float16 gradients: the master weights must stay "
                    "float32 (the strategy must not convert the model to half)");
      }
      groups[{gradient.device().type(), gradient.device().index(), gradient.scalar_type()}]
          .push_back(gradient.detach());
    }
    for (auto& [key, group] : groups) {
      const torch::Device device(std::get<0>(key), std::get<1>(key));
      torch::Tensor group_found = at::zeros({}, scale_.options().device(device));
      at::_amp_foreach_non_finite_check_and_unscale_(group, group_found, inv_scale.to(device));
      found_inf.add_(group_found.to(scale_.device()));
    }
    return found_inf.clamp_max_(1.0);
  }

  void update(const torch::Tensor& found_inf) override {
    torch::Tensor found = found_inf.defined() ? found_inf.to(scale_.device(), at::kFloat).reshape({})
                                              : at::zeros({}, scale_.options());
    at::_amp_update_scale_(scale_, growth_tracker_, found, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
    skipped_.add_(found.gt(0).to(at::kLong));
  }

  void save_state(StateDict& out) const override {
    out.tensors[kScaleKey] = scale_.detach().to(at::kCPU).clone();
    out.tensors[kGrowthTrackerKey] = growth_tracker_.detach().to(at::kCPU).clone();
    out.tensors[kSkippedKey] = skipped_.detach().to(at::kCPU).clone();
  }

  void load_state(const StateDict& in) override {
    auto take = [&](const char* key, at::ScalarType dtype) {
      auto it = in.tensors.find(key);
      if (it == in.tensors.end()) {
        throw Error(std::string("checkpoint lacks the loss scaler's '") + key +
                    "' (was it saved with another precision?)");
      }
      if (it->second.numel() != 1) {
        throw Error(std::string("checkpoint entry '") + key + "' must hold one value");
      }
      return it->second.reshape({}).to(scale_.device(), dtype).clone();
    };
    torch::Tensor scale = take(kScaleKey, at::kFloat);
    torch::Tensor growth_tracker = take(kGrowthTrackerKey, at::kInt);
    torch::Tensor skipped = take(kSkippedKey, at::kLong);
    if (!(scale.item<double>() > 0)) throw Error("checkpoint holds a loss scale that is not > 0");
    scale_ = scale;
    growth_tracker_ = growth_tracker;
    skipped_ = skipped;
  }

  std::vector<std::pair<std::string, double>> metrics() const override {
    return {{"loss_scale", scale_.item<double>()},
            {"skipped_steps_total", static_cast<double>(skipped_.item<std::int64_t>())}};
  }

 private:
  // The scaler's state lives where the loss is, so scaling and updating never leave the device.
  void follow(const torch::Device& device) {
    if (scale_.device() == device) return;
    scale_ = scale_.to(device);
    growth_tracker_ = growth_tracker_.to(device);
    skipped_ = skipped_.to(device);
  }

  Fp16Options options_;
  std::shared_ptr<DeviceBackend> device_backend_;
  torch::Tensor scale_;
  torch::Tensor growth_tracker_;
  torch::Tensor skipped_;
};

Fp16Options parse(const Config& config) {
  Fp16Options options;
  options.init_scale = config.get_float("init_scale");
  options.growth_factor = config.get_float("growth_factor");
  options.backoff_factor = config.get_float("backoff_factor");
  options.growth_interval = config.get_int("growth_interval");
  return options;
}

void register_components(Registry& registry) {
  registry.add<Precision>(
      "fp16",
      {option("init_scale", 65536.0, "initial loss scale").greater_than(0),
       option("growth_factor", 2.0, "scale multiplier after growth_interval finite steps")
           .greater_than(1),
       option("backoff_factor", 0.5, "scale multiplier after a step with inf/nan gradients")
           .greater_than(0)
           .less_than(1),
       option("growth_interval", 2000, "consecutive finite steps before the scale grows")
           .at_least(1)},
      "float16 autocast with dynamic loss scaling (GradScaler's rules); float32 master weights",
      [](const Config& config, const BuildContext& context) {
        return std::make_unique<Fp16>(parse(config), context.device_backend);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("fp16", "1.0.0", trainyard::register_components)
