// Stochastic gradient descent with momentum, Nesterov momentum and weight decay.

#include <torch/optim/sgd.h>

#include "trainyard/optimizer.hpp"
#include "trainyard/plugin.hpp"

namespace trainyard {
namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const Config& options)
      : settings_(options.get_float("lr")) {
    double lr = options.get_float("lr");
    double momentum = options.get_float("momentum");
    double weight_decay = options.get_float("weight_decay");
    double dampening = options.get_float("dampening");
    bool nesterov = options.get_bool("nesterov");
    if (lr < 0) options.fail("lr", "must be >= 0, got " + std::to_string(lr));
    if (momentum < 0) options.fail("momentum", "must be >= 0");
    if (weight_decay < 0) options.fail("weight_decay", "must be >= 0");
    if (nesterov && (momentum <= 0 || dampening != 0)) {
      options.fail("nesterov", "needs momentum > 0 and dampening = 0");
    }
    settings_.momentum(momentum).dampening(dampening).weight_decay(weight_decay).nesterov(nesterov);
  }

  double learning_rate() const override { return settings_.lr(); }

  std::unique_ptr<torch::optim::Optimizer> create(std::vector<torch::Tensor> params) override {
    return std::make_unique<torch::optim::SGD>(std::move(params), settings_);
  }

 private:
  torch::optim::SGDOptions settings_;
};

void register_components(Registry& registry) {
  registry.add<Optimizer>("sgd",
                          {option("lr", 0.01, "learning rate"),
                           option("momentum", 0.0, "momentum factor"),
                           option("dampening", 0.0, "dampening of momentum"),
                           option("nesterov", false, "Nesterov momentum"),
                           option("weight_decay", 0.0, "L2 penalty")},
                          "stochastic gradient descent (torch.optim.SGD semantics)",
                          [](const Config& options, const BuildContext&) {
                            return std::make_unique<Sgd>(options);
                          });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("sgd", "1.0.0", trainyard::register_components)
