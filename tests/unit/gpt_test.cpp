// The `gpt` model: causal attention (a later token never changes earlier logits), the tied
// embedding and output head held once, the FLOPs formula, the per-token loss (targets of -100
// not scored; the mean or the sum over the scored tokens; parts of a batch recombining by their
// scored tokens), and its option checks.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <cmath>
#include <set>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/model.hpp"

namespace trainyard::testing {
namespace {

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
  return bundled_registry().create<Model>("gpt", Config(table, "model"), context);
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

// Targets of -100 in sequences 0 and 2 of a [4, 16] batch: sequence 0 has 4 scored tokens,
// sequence 2 has 8, sequences 1 and 3 all 16.
Batch batch_with_ignored_targets(std::int64_t vocab) {
  Batch batch = token_batch(at::randint(0, vocab, {4, 16}, at::kLong));
  at::Tensor target = batch.at("target").clone();
  target[0].narrow(0, 0, 12).fill_(-100);
  target[2].narrow(0, 4, 8).fill_(-100);
  batch.tensors["target"] = target;
  return batch;
}

// The batch's sequences in consecutive parts of `sizes` sequences.
std::vector<Batch> split(const Batch& batch, const std::vector<std::int64_t>& sizes) {
  std::vector<Batch> parts;
  std::int64_t begin = 0;
  for (const std::int64_t size : sizes) {
    Batch part;
    part.size = size;
    for (const auto& [name, tensor] : batch.tensors) {
      part.tensors[name] = tensor.narrow(0, begin, size);
    }
    parts.push_back(std::move(part));
    begin += size;
  }
  return parts;
}

// Each scored token's cross-entropy, from log-softmax (independently of the model's loss).
at::Tensor scored_token_losses(const at::Tensor& logits, const at::Tensor& target) {
  at::Tensor log_probs = at::log_softmax(logits.to(at::kDouble), -1);
  at::Tensor picked = log_probs.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  return (-picked).masked_select(target.ne(-100));
}

// fp32 tolerance between a loss and its recombination.
bool close(double actual, double expected) {
  return std::abs(actual - expected) <= 1e-5 + 1.3e-6 * std::abs(expected);
}

TEST(GptModel, IgnoredTargetsAreNotScoredAndPartsWeighByScoredTokens) {
  torch::manual_seed(4);
  auto model = make_gpt(kSmall, language_context(50, 16));
  model->module().eval();
  torch::NoGradGuard no_grad;
  ASSERT_EQ(model->loss_reduction(), LossReduction::kMean);
  const Batch whole = batch_with_ignored_targets(50);
  EXPECT_EQ(model->loss_terms(whole), 4.0 + 16 + 8 + 16);
  const auto blocks = model->blocks();
  const at::Tensor logits = run_blocks(*model, blocks, whole);
  const double loss = model->loss(logits, whole).item<double>();
  const double expected = scored_token_losses(logits, whole.at("target")).mean().item<double>();
  EXPECT_TRUE(close(loss, expected)) << "loss " << loss << ", mean of scored tokens' " << expected;

  // Parts: sequence 0 | sequences 1 and 2 | sequence 3, holding 4, 24 and 16 scored tokens.
  double by_tokens = 0, tokens = 0, by_samples = 0;
  for (const Batch& part : split(whole, {1, 2, 1})) {
    const double part_loss = model->loss(run_blocks(*model, blocks, part), part).item<double>();
    by_tokens += model->loss_terms(part) * part_loss;
    tokens += model->loss_terms(part);
    by_samples += static_cast<double>(part.size) * part_loss;
  }
  EXPECT_EQ(tokens, 44.0);
  EXPECT_TRUE(close(by_tokens / tokens, loss))
      << "weighed by scored tokens: " << by_tokens / tokens << ", whole batch: " << loss;
  EXPECT_FALSE(close(by_samples / 4, loss))
      << "weighed by sequences, the parts must not recombine: " << by_samples / 4
      << ", whole batch: " << loss;
}

TEST(GptModel, SumReductionAddsTheScoredTokensLosses) {
  torch::manual_seed(5);
  auto options = kSmall;
  options["loss_reduction"] = Value("sum");
  auto model = make_gpt(options, language_context(50, 16));
  model->module().eval();
  torch::NoGradGuard no_grad;
  ASSERT_EQ(model->loss_reduction(), LossReduction::kSum);
  const Batch whole = batch_with_ignored_targets(50);
  const auto blocks = model->blocks();
  const at::Tensor logits = run_blocks(*model, blocks, whole);
  const double loss = model->loss(logits, whole).item<double>();
  const double expected = scored_token_losses(logits, whole.at("target")).sum().item<double>();
  EXPECT_TRUE(close(loss, expected)) << "loss " << loss << ", sum of scored tokens' " << expected;
  double parts = 0;
  for (const Batch& part : split(whole, {1, 2, 1})) {
    parts += model->loss(run_blocks(*model, blocks, part), part).item<double>();
  }
  EXPECT_TRUE(close(parts, loss)) << "parts add up to " << parts << ", whole batch: " << loss;
}

TEST(GptModel, NoScoredTokenGivesZeroLossAndAccuracy) {
  auto model = make_gpt(kSmall, language_context(50, 16));
  Batch batch = token_batch(at::randint(0, 50, {2, 16}, at::kLong));
  batch.tensors["target"] = at::full({2, 16}, -100, at::kLong);
  const at::Tensor logits = run_blocks(*model, model->blocks(), batch);
  const at::Tensor loss = model->loss(logits, batch);
  EXPECT_EQ(loss.item<double>(), 0) << "not NaN: such a part weighs nothing when recombined";
  EXPECT_EQ(model->loss_terms(batch), 0);
  EXPECT_EQ(model->eval_sums(logits.detach(), batch).at("accuracy").item<double>(), 0);
}

// Accuracy is each sequence's fraction of its scored tokens predicted.
TEST(GptModel, AccuracyCountsOnlyScoredTokens) {
  auto model = make_gpt(kSmall, language_context(5, 4));
  Batch batch;
  batch.size = 2;
  batch.tensors["input"] = at::zeros({2, 4}, at::kLong);
  // Sequence 0 scores 2 tokens and predicts 1 of them; sequence 1 scores 4 and predicts all.
  batch.tensors["target"] = at::tensor({1, 2, -100, -100, 0, 1, 2, 3}, at::kLong).view({2, 4});
  const at::Tensor predicted = at::tensor({1, 0, 3, 4, 0, 1, 2, 3}, at::kLong).view({2, 4});
  const at::Tensor logits = at::one_hot(predicted, 5).to(at::kFloat);
  EXPECT_DOUBLE_EQ(model->eval_sums(logits, batch).at("accuracy").item<double>(), 0.5 + 1.0);
}

TEST(GptModel, OptionsAreChecked) {
  auto context = language_context(50, 16);
  EXPECT_HAS(error_of([&] { make_gpt({{"seq_len", Value(32)}}, context); }),
             "windows hold 16 tokens");
  EXPECT_HAS(error_of([&] { make_gpt({{"d_model", Value(30)}, {"n_heads", Value(4)}}, context); }),
             "n_heads must divide d_model (30)");
  EXPECT_HAS(error_of([&] { make_gpt({{"dropout", Value(1.5)}}, context); }), "dropout");
  const std::string reduction = error_of([&] {
    make_gpt({{"loss_reduction", Value("median")}}, context);
  });
  EXPECT_HAS(reduction, "loss_reduction");
  EXPECT_HAS(reduction, "median");
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
