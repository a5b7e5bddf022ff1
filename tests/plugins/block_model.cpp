// A one-block model whose module class and forward closure are this library's own code, for the
// test that blocks a strategy keeps hold the model's library loaded after the model and the
// registry are gone.

#include <torch/nn/modules/linear.h>

#include <memory>

#include "trainyard/api/model.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

// A module type of this library: its vtable lives here, so using it after the library is
// unloaded would crash.
struct Doubler : torch::nn::Module {
  Doubler() { weight = register_parameter("weight", torch::full({3}, 2.0)); }
  torch::Tensor weight;
};

class BlockModel final : public Model {
 public:
  BlockModel() : root_(std::make_shared<torch::nn::Module>()), doubler_(std::make_shared<Doubler>()) {
    root_->register_module("double", doubler_);
  }
  torch::nn::Module& module() override { return *root_; }
  std::vector<Block> blocks() override {
    auto doubler = doubler_;
    return {Block{"double", doubler, [doubler](const Activations& input) {
                    return Activations(input.hidden() * doubler->weight);
                  }}};
  }
  torch::Tensor input(const Batch& batch) override { return batch.tensors.at("input"); }
  torch::Tensor loss(const torch::Tensor& output, const Batch&) override { return output.sum(); }
  double flops_per_sample() const override { return 3; }

 private:
  std::shared_ptr<torch::nn::Module> root_;
  std::shared_ptr<Doubler> doubler_;
};

void register_components(Registry& registry) {
  registry.add<Model>("test_blocks", {}, "one block that doubles its input",
                      [](const Config&, const BuildContext&) {
                        return std::make_unique<BlockModel>();
                      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("test_blocks", "1.0.0", trainyard::register_components)
