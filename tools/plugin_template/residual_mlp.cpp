// A complete model plugin: multinomial logistic regression. Copy this folder to start a plugin
// of any kind; the comments say what each part is for.

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

// Every plugin includes the interface it implements and trainyard/plugin.hpp, which defines
// the entry point.
#include <trainyard/classification.hpp>
#include <trainyard/model.hpp>
#include <trainyard/plugin.hpp>
#include <trainyard/sequential_block.hpp>

namespace {

// The model: one Linear layer from the flattened input to the classes. A model is a sequence
// of blocks so that strategies can wrap, recompute or split it; here there is one.
class SoftmaxRegression final : public trainyard::Model {
 public:
  SoftmaxRegression(const trainyard::Config& options, const trainyard::BuildContext& context) {
    // Options arrive validated against the declared list below, with defaults filled in.
    // Values that are the right type but wrong are refused here, with their recipe location.
    const bool bias = options.get_bool("bias");
    if (context.data.num_classes < 2) {
      throw trainyard::Error("model 'softmax_regression' needs a classification dataset");
    }
    std::int64_t features = 1;
    for (auto d : context.data.input_shape) features *= d;
    torch::nn::Sequential layer(torch::nn::Flatten(),
                                torch::nn::Linear(torch::nn::LinearOptions(features,
                                                                           context.data.num_classes)
                                                      .bias(bias)));
    blocks_.push_back(trainyard::sequential_block(*root_, "linear", layer));
    macs_ = static_cast<double>(features * context.data.num_classes);
  }

  torch::nn::Module& module() override { return *root_; }
  std::vector<trainyard::Block> blocks() override { return blocks_; }
  torch::Tensor input(const trainyard::Batch& batch) override { return batch.at("input"); }
  torch::Tensor loss(const torch::Tensor& output, const trainyard::Batch& batch) override {
    return trainyard::classification_loss(output, batch);
  }
  trainyard::TensorMap eval_sums(const torch::Tensor& output,
                                 const trainyard::Batch& batch) override {
    return trainyard::classification_sums(output, batch);
  }
  double flops_per_sample() const override { return 6.0 * macs_; }

 private:
  std::shared_ptr<torch::nn::Module> root_ = std::make_shared<torch::nn::Module>("SoftmaxRegression");
  std::vector<trainyard::Block> blocks_;
  double macs_ = 0;
};

// Called once when the host loads the library: register each component under (kind, name)
// with its options (name, default, help), a one-line description and a factory.
void register_components(trainyard::Registry& registry) {
  registry.add<trainyard::Model>(
      "softmax_regression", {trainyard::option("bias", true, "learn a bias per class")},
      "multinomial logistic regression (the plugin template)",
      [](const trainyard::Config& options, const trainyard::BuildContext& context) {
        return std::make_unique<SoftmaxRegression>(options, context);
      });
}

}  // namespace

// The library's one exported entry point: plugin name, plugin version, register function. The
// macro also records the SDK ABI version and the LibTorch/compiler build tag, which the host
// checks before calling anything here.
TRAINYARD_PLUGIN("softmax_regression", "1.0.0", register_components)
