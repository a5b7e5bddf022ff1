// Adam with decoupled weight decay.

#include <torch/optim/adamw.h>

#include "trainyard/optimizer.hpp"
#include "trainyard/plugin.hpp"

namespace trainyard {
namespace {

class AdamW final : public Optimizer {
 public:
  explicit AdamW(const Config& options) : settings_(options.get_float("lr")) {
    double lr = options.get_float("lr");
    double beta1 = options.get_float("beta1");
    double beta2 = options.get_float("beta2");
    double eps = options.get_float("eps");
    double weight_decay = options.get_float("weight_decay");
    if (lr < 0) options.fail("lr", "must be >= 0, got " + std::to_string(lr));
    if (beta1 < 0 || beta1 >= 1) options.fail("beta1", "must be in [0, 1)");
    if (beta2 < 0 || beta2 >= 1) options.fail("beta2", "must be in [0, 1)");
    if (eps <= 0) options.fail("eps", "must be > 0");
    if (weight_decay < 0) options.fail("weight_decay", "must be >= 0");
    settings_.betas({beta1, beta2}).eps(eps).weight_decay(weight_decay).amsgrad(
        options.get_bool("amsgrad"));
  }

  double learning_rate() const override { return settings_.lr(); }

  std::unique_ptr<torch::optim::Optimizer> create(std::vector<torch::Tensor> params) override {
    return std::make_unique<torch::optim::AdamW>(std::move(params), settings_);
  }

 private:
  torch::optim::AdamWOptions settings_;
};

void register_components(Registry& registry) {
  registry.add<Optimizer>("adamw",
                          {option("lr", 1e-3, "learning rate"),
                           option("beta1", 0.9, "decay of the first moment"),
                           option("beta2", 0.999, "decay of the second moment"),
                           option("eps", 1e-8, "added to the denominator"),
                           option("weight_decay", 0.01, "decoupled weight decay"),
                           option("amsgrad", false, "keep the maximum of second moments")},
                          "AdamW (torch.optim.AdamW semantics)",
                          [](const Config& options, const BuildContext&) {
                            return std::make_unique<AdamW>(options);
                          });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("adamw", "1.0.0", trainyard::register_components)
