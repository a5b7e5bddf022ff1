// The classifiers' loss_reduction option, on the `mlp`: "sum" adds the per-sample
// cross-entropies, "mean" (the default) averages them, and any other value is refused with one
// line naming the option and the value.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <cmath>
#include <map>

#include "test_support.hpp"
#include "trainyard/build_context.hpp"
#include "trainyard/loss_reduction.hpp"
#include "trainyard/model.hpp"

namespace trainyard::testing {
namespace {

Registry& plugins() {
  static Registry* registry = [] {
    auto* r = new Registry;
    load_bundled_plugins(*r);
    return r;
  }();
  return *registry;
}

std::shared_ptr<Model> make_mlp(const std::map<std::string, Value>& options) {
  auto table = std::make_shared<Table>();
  table->set("hidden", Value(Array{Value(16)}));
  for (const auto& [key, value] : options) table->set(key, value);
  BuildContext context;
  context.data.input_shape = {1, 28, 28};
  context.data.num_classes = 10;
  context.seed = 7;
  return plugins().create<Model>("mlp", Config(table, "model"), context);
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

}  // namespace
}  // namespace trainyard::testing
