// The usual learning-rate schedules: constant, and linear warm-up followed by cosine or linear
// decay to a floor.

#include <algorithm>
#include <cmath>
#include <numbers>

#include "trainyard/api/plugin.hpp"
#include "trainyard/api/scheduler.hpp"

namespace trainyard {
namespace {

class Constant final : public LrScheduler {
 public:
  double learning_rate(std::int64_t, std::int64_t, double base_lr) const override {
    return base_lr;
  }
};

enum class Decay { kCosine, kLinear };

class WarmupDecay final : public LrScheduler {
 public:
  WarmupDecay(const Config& options, Decay decay)
      : decay_(decay),
        warmup_steps_(options.get_int("warmup_steps")),
        min_ratio_(options.get_float("min_lr_ratio")) {}

  double learning_rate(std::int64_t step, std::int64_t total_steps,
                       double base_lr) const override {
    // Warm-up ramps to base_lr so that step warmup_steps - 1 is the first at full rate.
    if (step < warmup_steps_) {
      return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
    }
    const double span = static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps_));
    const double progress =
        std::clamp(static_cast<double>(step - warmup_steps_) / span, 0.0, 1.0);
    const double shape = decay_ == Decay::kCosine
                             ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                             : 1.0 - progress;
    return base_lr * (min_ratio_ + (1.0 - min_ratio_) * shape);
  }

 private:
  Decay decay_;
  std::int64_t warmup_steps_;
  double min_ratio_;
};

OptionSpecs warmup_options() {
  return {option("warmup_steps", 0, "steps of linear warm-up from 0 to the base rate").at_least(0),
          option("min_lr_ratio", 0.0, "final rate as a fraction of the base rate")
              .at_least(0)
              .at_most(1)};
}

void register_components(Registry& registry) {
  registry.add<LrScheduler>("constant", {}, "the optimizer's learning rate throughout",
                            [](const Config&, const BuildContext&) {
                              return std::make_unique<Constant>();
                            });
  registry.add<LrScheduler>("warmup_cosine", warmup_options(),
                            "linear warm-up, then cosine decay to min_lr_ratio",
                            [](const Config& options, const BuildContext&) {
                              return std::make_unique<WarmupDecay>(options, Decay::kCosine);
                            });
  registry.add<LrScheduler>("warmup_linear", warmup_options(),
                            "linear warm-up, then linear decay to min_lr_ratio",
                            [](const Config& options, const BuildContext&) {
                              return std::make_unique<WarmupDecay>(options, Decay::kLinear);
                            });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("schedulers", "1.0.0", trainyard::register_components)
