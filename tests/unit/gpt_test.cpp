// The `gpt` model: causal attention (a later token never changes earlier logits), the tied
// embedding and output head held once, the FLOPs formula, and its option checks.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <set>

#include "test_support.hpp"
#include "trainyard/build_context.hpp"
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

BuildContext language_context(std::int64_t vocab, std::int64_t seq_len) {
  BuildContext context;
  context.data.input_shape = {seq_len};
  context.data.vocab_size = vocab;
  context.data.sequence_length = seq_len;
  return context;
}

std::shared_ptr<Model> make_gpt(const std::map<std::string, Value>& options,
                                const BuildContext& context) {
  auto table = std::make_shared<Table>();
  for (const auto& [key, value] : options) table->set(key, value);
  return plugins().create<Model>("gpt", Config(table, "model"), context);
}

const std::map<std::string, Value> kSmall = {
    {"n_layers", Value(2)}, {"n_heads", Value(4)}, {"d_model", Value(32)}};

Batch token_batch(const at::Tensor& ids) {
  Batch batch;
  batch.size = ids.size(0);
  batch.tensors["input"] = ids;
  batch.tensors["target"] = ids.roll(-1, 1);
  return batch;
}

TEST(GptModel, LaterTokensNeverChangeEarlierLogits) {
  torch::manual_seed(3);
  auto model = make_gpt(kSmall, language_context(50, 16));
  model->module().eval();
  torch::NoGradGuard no_grad;
  at::Tensor ids = at::randint(0, 50, {3, 16}, at::kLong);
  auto blocks = model->blocks();
  at::Tensor logits = run_blocks(*model, blocks, token_batch(ids));
  ASSERT_EQ(logits.sizes().vec(), (std::vector<std::int64_t>{3, 16, 50}));
  for (std::int64_t changed : {0, 5, 15}) {
    at::Tensor other = ids.clone();
    other.select(1, changed).add_(1).remainder_(50);
    at::Tensor changed_logits = run_blocks(*model, blocks, token_batch(other));
    if (changed > 0) {
      EXPECT_TRUE(at::allclose(logits.narrow(1, 0, changed), changed_logits.narrow(1, 0, changed),
                               0, 1e-6))
          << "changing token " << changed << " changed earlier logits";
    }
    EXPECT_FALSE(at::allclose(logits.narrow(1, changed, 16 - changed),
                              changed_logits.narrow(1, changed, 16 - changed)))
        << "changing token " << changed << " must change its own and later logits";
  }
}

TEST(GptModel, TiedHeadIsHeldOnceAndAppearsInTheFirstAndLastBlocks) {
  auto model = make_gpt(kSmall, language_context(50, 16));
  auto blocks = model->blocks();
  ASSERT_EQ(blocks.size(), 4u);  // embed, two layers, head
  EXPECT_EQ(blocks.front().name, "embed");
  EXPECT_EQ(blocks.back().name, "head");
  std::set<const void*> first, last;
  for (const auto& p : blocks.front().module->parameters()) first.insert(p.unsafeGetTensorImpl());
  for (const auto& p : blocks.back().module->parameters()) last.insert(p.unsafeGetTensorImpl());
  std::size_t shared = 0;
  for (const auto* impl : last) shared += first.count(impl);
  EXPECT_EQ(shared, 1u) << "the token embedding is the output head's weight";
  // module() lists each parameter once, so an optimizer steps the tied weight once.
  std::set<const void*> unique;
  auto params = model->module().parameters();
  for (const auto& p : params) unique.insert(p.unsafeGetTensorImpl());
  EXPECT_EQ(unique.size(), params.size());
  // A step through the head moves the embedding.
  at::Tensor ids = at::randint(0, 50, {2, 16}, at::kLong);
  Batch batch = token_batch(ids);
  model->loss(run_blocks(*model, blocks, batch), batch).backward();
  const auto& token_weight = *model->module().named_parameters().find("embed.token.weight");
  EXPECT_GT(token_weight.grad().abs().sum().item<double>(), 0);
}

TEST(GptModel, FlopsPerSampleFollowsTheFormula) {
  for (auto [layers, width, vocab, length] :
       {std::tuple{2, 32, 50, 16}, std::tuple{4, 128, 256, 128}, std::tuple{6, 64, 1000, 32}}) {
    auto model = make_gpt({{"n_layers", Value(layers)}, {"n_heads", Value(4)},
                           {"d_model", Value(width)}},
                          language_context(vocab, length));
    const double d = width, L = layers, V = vocab, T = length;
    const double n = L * 12 * d * d + V * d;
    EXPECT_DOUBLE_EQ(model->flops_per_sample(), T * (6 * n + 12 * L * d * T));
    // The formula's N is the matrix-multiply weights: every parameter but embeddings, norms, biases.
    double matmul = 0;
    for (const auto& item : model->module().named_parameters()) {
      const auto& key = item.key();
      if (item.value().dim() == 2 && key.find("position") == std::string::npos) {
        matmul += static_cast<double>(item.value().numel());
      }
    }
    EXPECT_DOUBLE_EQ(matmul, n) << "the token embedding counts once, as the output head";
  }
}

TEST(GptModel, OptionsAreChecked) {
  auto context = language_context(50, 16);
  EXPECT_HAS(error_of([&] { make_gpt({{"seq_len", Value(32)}}, context); }),
             "windows hold 16 tokens");
  EXPECT_HAS(error_of([&] { make_gpt({{"d_model", Value(30)}, {"n_heads", Value(4)}}, context); }),
             "must be >= 1 and divide d_model");
  EXPECT_HAS(error_of([&] { make_gpt({{"dropout", Value(1.5)}}, context); }), "dropout");
  BuildContext images;
  images.data.input_shape = {1, 28, 28};
  images.data.num_classes = 10;
  EXPECT_HAS(error_of([&] { make_gpt({}, images); }), "needs a language-modelling dataset");
  EXPECT_NE(make_gpt({{"seq_len", Value(16)}}, context), nullptr);
}

// The shipped recipe resolves: its sections name existing plugins with valid options.
TEST(GptTextRecipe, Validates) {
  auto result = run_host({"validate", "recipes/gpt_text.toml"}, {}, 120);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  auto printed = run_host({"run", "recipes/gpt_text.toml", "--print-config"}, {}, 120);
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  for (const char* expected : {"plugin = \"gpt\"", "plugin = \"text\"", "seq_len = 128",
                               "n_layers = 4"}) {
    EXPECT_HAS(printed.out, expected);
  }
}

}  // namespace
}  // namespace trainyard::testing
