// The classifiers' loss_reduction option, on the `mlp`: "sum" adds the per-sample
// cross-entropies, "mean" (the default) averages them, and any other value is refused with one
// line naming the option and the value.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <set>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/models/loss_reduction.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/models/sequential_classifier.hpp"

namespace trainyard::testing {
namespace {

std::shared_ptr<Model> make_mlp(const std::map<std::string, Value>& options) {
  auto table = std::make_shared<Table>();
  table->set("hidden", Value(Array{Value(16)}));
  for (const auto& [key, value] : options) table->set(key, value);
  BuildContext context;
  context.data.input_shape = {1, 28, 28};
  context.data.num_classes = 10;
  context.seed = 7;
  return bundled_registry().create<Model>("mlp", Config(table, "model"), context);
}

Batch image_batch(std::int64_t size) {
  Batch batch;
  batch.size = size;
  batch.tensors["input"] = at::randn({size, 1, 28, 28});
  batch.tensors["target"] = at::randint(0, 10, {size}, at::kLong);
  return batch;
}

TEST(MlpModel, SumReductionAddsThePerSampleLosses) {
  torch::manual_seed(6);
  auto summed = make_mlp({{"loss_reduction", Value("sum")}});
  auto averaged = make_mlp({});
  ASSERT_EQ(summed->loss_reduction(), LossReduction::kSum);
  ASSERT_EQ(averaged->loss_reduction(), LossReduction::kMean);
  torch::NoGradGuard no_grad;
  const Batch batch = image_batch(5);
  EXPECT_EQ(summed->loss_terms(batch), 5.0) << "the terms are the samples";
  const at::Tensor logits = run_blocks(*summed, summed->blocks(), batch);
  const double loss = summed->loss(logits, batch).item<double>();

  // Each sample's cross-entropy, from log-softmax, independently of the model's loss.
  const at::Tensor per_sample = -at::log_softmax(logits.to(at::kDouble), 1)
                                     .gather(1, batch.at("target").unsqueeze(1))
                                     .squeeze(1);
  const double expected = per_sample.sum().item<double>();
  EXPECT_LE(std::abs(loss - expected), 1e-5 + 1.3e-6 * std::abs(expected))
      << "loss " << loss << ", sum of the samples' losses " << expected;
  // Same seed, same parameters: the mean is the sum over the sample count.
  const double mean =
      averaged->loss(run_blocks(*averaged, averaged->blocks(), batch), batch).item<double>();
  EXPECT_LE(std::abs(mean * 5 - loss), 1e-5 + 1.3e-6 * std::abs(loss))
      << "mean " << mean << " times 5 samples against the sum " << loss;
}

TEST(MlpModel, RefusesAnUnknownLossReduction) {
  const std::string error = error_of([] { make_mlp({{"loss_reduction", Value("median")}}); });
  EXPECT_HAS(error, "model.loss_reduction");
  EXPECT_HAS(error, "median");
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;

  // A section that skipped validation is refused by the model's own reading of the option.
  auto table = std::make_shared<Table>();
  table->set("loss_reduction", Value("median"));
  const std::string unvalidated = error_of([&] { loss_reduction_from(Config(table, "model")); });
  EXPECT_HAS(unvalidated, "model.loss_reduction must be mean or sum, got \"median\"");
  EXPECT_EQ(unvalidated.find('\n'), std::string::npos) << unvalidated;
}

// A block that is a module of the model's own, not a Sequential: x + fc2(relu(fc1(x))).
class ResidualImpl : public torch::nn::Module {
 public:
  explicit ResidualImpl(std::int64_t width)
      : fc1(register_module("fc1", torch::nn::Linear(width, width))),
        fc2(register_module("fc2", torch::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) {
    return x + fc2->forward(torch::nn::functional::relu(fc1->forward(x)));
  }
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Residual);

class ResidualClassifier final : public SequentialClassifier {
 public:
  explicit ResidualClassifier(const BuildContext& context)
      : SequentialClassifier("residual", context, {"input", "res0", "head"}) {
    add_block("input", 16.0 * 8, [] {
      return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(16, 8));
    });
    add_block("res0", 2 * 8.0 * 8, [] { return Residual(8); });
    add_block("head", 8.0 * 3, [] { return torch::nn::Linear(8, 3); });
  }
};

TEST(SequentialClassifierTest, ABlockOfTheModelsOwnKeepsItsParameterNames) {
  BuildContext context;
  context.data.input_shape = {16};
  context.data.num_classes = 3;
  context.seed = 3;
  ResidualClassifier model(context);
  std::set<std::string> names;
  for (const auto& item : model.module().named_parameters(true)) names.insert(item.key());
  EXPECT_EQ(names, (std::set<std::string>{"input.1.weight", "input.1.bias", "res0.fc1.weight",
                                          "res0.fc1.bias", "res0.fc2.weight", "res0.fc2.bias",
                                          "head.weight", "head.bias"}));
  // The block runs the module itself: the residual adds its input back.
  const auto blocks = model.blocks();
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[1].name, "res0");
  at::Tensor x = at::randn({2, 8});
  at::Tensor y = blocks[1].forward(Activations(x)).hidden();
  auto& residual = dynamic_cast<ResidualImpl&>(*blocks[1].module);
  at::Tensor expected = x + residual.fc2->forward(at::relu(residual.fc1->forward(x)));
  EXPECT_TRUE(at::allclose(y, expected));
  // A stage build holds only its blocks, under the same names.
  context.blocks = BlockRange{1, 2};
  ResidualClassifier stage(context);
  std::set<std::string> stage_names;
  for (const auto& item : stage.module().named_parameters(true)) stage_names.insert(item.key());
  EXPECT_EQ(stage_names, (std::set<std::string>{"res0.fc1.weight", "res0.fc1.bias",
                                                "res0.fc2.weight", "res0.fc2.bias"}));
}

}  // namespace
}  // namespace trainyard::testing
