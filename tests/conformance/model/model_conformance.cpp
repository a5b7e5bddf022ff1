// Model conformance: blocks own every parameter and are stable, the forward pass through the
// blocks gives logits, the loss is a finite scalar with gradients for every parameter, and
// construction is seeded.

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <set>

#include "conformance.hpp"
#include "trainyard/error.hpp"
#include "trainyard/model.hpp"

namespace {

using namespace trainyard;

constexpr std::int64_t kBatch = 4;
constexpr std::int64_t kClasses = 10;
// Language models get token windows of kSequence ids below kVocab instead of images.
constexpr std::int64_t kSequence = 12;
constexpr std::int64_t kVocab = 10;

BuildContext language_model_context() {
  BuildContext context = conformance::classification_context({kSequence}, 0);
  context.data.vocab_size = kVocab;
  context.data.sequence_length = kSequence;
  return context;
}

class ModelConformance : public ::testing::TestWithParam<std::string> {
 protected:
  // The model, built for images or else for token windows; null after GTEST_SKIP when it needs
  // yet another kind of data.
  std::shared_ptr<Model> build(std::uint64_t seed = 0) {
    std::string message;
    for (bool language : {false, true}) {
      torch::manual_seed(seed);
      try {
        language_ = language;
        return conformance::registry().create<Model>(
            GetParam(), conformance::section("model"),
            language ? language_model_context() : conformance::classification_context());
      } catch (const Error& error) {
        message = error.what();
        if (message.find("need") == std::string::npos) throw;
      }
    }
    skipped_ = "needs another kind of data: " + message;
    return nullptr;
  }

  Batch batch() const {
    Batch batch;
    batch.size = kBatch;
    if (language_) {
      batch.tensors["input"] = torch::randint(0, kVocab, {kBatch, kSequence}, torch::kLong);
      batch.tensors["target"] = torch::randint(0, kVocab, {kBatch, kSequence}, torch::kLong);
    } else {
      batch.tensors["input"] = torch::randn({kBatch, 1, 28, 28});
      batch.tensors["target"] = torch::randint(0, kClasses, {kBatch}, torch::kLong);
    }
    return batch;
  }

  // Logits: [batch, classes] for a classifier, [batch, sequence, vocabulary] for a language model.
  std::vector<std::int64_t> output_shape() const {
    if (language_) return {kBatch, kSequence, kVocab};
    return {kBatch, kClasses};
  }

  bool language_ = false;

  std::string skipped_;
};

#define BUILD_OR_SKIP(var, ...)                         \
  auto var = build(__VA_ARGS__);                        \
  if (!var) GTEST_SKIP() << skipped_;

std::set<const void*> impls(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> out;
  for (const auto& t : tensors) out.insert(t.unsafeGetTensorImpl());
  return out;
}

TEST_P(ModelConformance, BlocksAreStableAndOwnEveryParameter) {
  BUILD_OR_SKIP(model);
  auto blocks = model->blocks();
  ASSERT_FALSE(blocks.empty());
  auto again = model->blocks();
  ASSERT_EQ(blocks.size(), again.size());
  std::set<std::string> names;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_FALSE(blocks[i].name.empty()) << "block " << i;
    EXPECT_TRUE(names.insert(blocks[i].name).second) << "duplicate block name " << blocks[i].name;
    ASSERT_NE(blocks[i].module, nullptr) << blocks[i].name;
    EXPECT_TRUE(static_cast<bool>(blocks[i].forward)) << blocks[i].name;
    EXPECT_EQ(blocks[i].name, again[i].name);
    EXPECT_EQ(blocks[i].module.get(), again[i].module.get())
        << "blocks() must return the same modules on every call (" << blocks[i].name << ")";
  }

  std::set<const void*> in_blocks;
  std::set<const void*> buffers_in_blocks;
  for (const auto& block : blocks) {
    for (const auto& p : block.module->parameters(true)) in_blocks.insert(p.unsafeGetTensorImpl());
    for (const auto& b : block.module->buffers(true)) buffers_in_blocks.insert(b.unsafeGetTensorImpl());
  }
  const auto module_params = model->module().named_parameters(true);
  EXPECT_GT(module_params.size(), 0u);
  for (const auto& item : module_params) {
    EXPECT_TRUE(in_blocks.count(item.value().unsafeGetTensorImpl()))
        << "parameter '" << item.key() << "' belongs to no block";
  }
  for (const auto& item : model->module().named_buffers(true)) {
    EXPECT_TRUE(buffers_in_blocks.count(item.value().unsafeGetTensorImpl()))
        << "buffer '" << item.key() << "' belongs to no block";
  }
  // module() owns every parameter: blocks hold no parameter of their own.
  auto owned = impls(model->module().parameters(true));
  for (const auto* impl : in_blocks) EXPECT_TRUE(owned.count(impl)) << "a block parameter is not in module()";
}

TEST_P(ModelConformance, ForwardLossBackwardAndSums) {
  BUILD_OR_SKIP(model);
  torch::manual_seed(1);
  Batch b = batch();
  auto blocks = model->blocks();
  torch::Tensor output = run_blocks(*model, blocks, b);
  ASSERT_TRUE(output.defined());
  ASSERT_EQ(output.sizes().vec(), output_shape());
  EXPECT_TRUE(output.isfinite().all().item<bool>());

  torch::Tensor loss = model->loss(output, b);
  ASSERT_EQ(loss.dim(), 0) << "loss must be a scalar";
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  loss.backward();
  for (const auto& item : model->module().named_parameters(true)) {
    if (!item.value().requires_grad()) continue;
    const auto& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << "no gradient for '" << item.key() << "'";
    EXPECT_EQ(grad.sizes(), item.value().sizes()) << item.key();
    EXPECT_TRUE(grad.isfinite().all().item<bool>()) << item.key();
  }

  TensorMap sums;
  {
    torch::NoGradGuard no_grad;
    sums = model->eval_sums(output.detach(), b);
  }
  for (const auto& [name, value] : sums) {
    ASSERT_TRUE(value.defined()) << name;
    EXPECT_TRUE(value.isfinite().all().item<bool>()) << name;
  }
  if (auto it = sums.find("accuracy"); it != sums.end()) {
    ASSERT_EQ(it->second.numel(), 1);
    const double correct = it->second.item<double>();
    EXPECT_GE(correct, 0);
    EXPECT_LE(correct, static_cast<double>(kBatch));
  }
}

TEST_P(ModelConformance, LossIsAMeanOverTheBatch) {
  BUILD_OR_SKIP(model);
  model->module().eval();  // batch statistics must not tie samples together here
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  Batch b = batch();
  auto blocks = model->blocks();
  const double whole = model->loss(run_blocks(*model, blocks, b), b).item<double>();
  double parts = 0;
  for (std::int64_t i = 0; i < kBatch; ++i) {
    Batch one;
    one.size = 1;
    for (const auto& [name, tensor] : b.tensors) one.tensors[name] = tensor.narrow(0, i, 1);
    parts += model->loss(run_blocks(*model, blocks, one), one).item<double>();
  }
  EXPECT_NEAR(whole, parts / static_cast<double>(kBatch), 1e-4 * (1 + std::abs(whole)));
}

TEST_P(ModelConformance, FlopsPerSampleIsPositive) {
  BUILD_OR_SKIP(model);
  const double flops = model->flops_per_sample();
  EXPECT_TRUE(std::isfinite(flops));
  EXPECT_GT(flops, 0);
}

TEST_P(ModelConformance, SameSeedGivesSameInitialParameters) {
  BUILD_OR_SKIP(first, 42);
  BUILD_OR_SKIP(second, 42);
  auto a = first->module().named_parameters(true);
  auto b = second->module().named_parameters(true);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : a) {
    const torch::Tensor* other = b.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(at::equal(item.value(), *other)) << "'" << item.key() << "' differs";
  }
  auto second_buffers = second->module().named_buffers(true);
  for (const auto& item : first->module().named_buffers(true)) {
    const torch::Tensor* other = second_buffers.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(at::equal(item.value(), *other)) << "buffer '" << item.key() << "' differs";
  }
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(ModelConformance, "model");
