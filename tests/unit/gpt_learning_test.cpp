// The `gpt` model learns from the `text` dataset's stream: built through the plugin registry
// with AdamW, trained a few hundred steps on windows of a slice of the fortunes corpus, its loss
// falls clearly below the corpus' unigram entropy (the best loss without context), on the
// training stream and on the held-out split.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <fstream>
#include <numeric>

#include "test_support.hpp"
#include "trainyard/build_context.hpp"
#include "trainyard/dataset.hpp"
#include "trainyard/model.hpp"
#include "trainyard/optimizer.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCorpus = "/usr/share/games/fortunes/cookie";

Config section(const std::string& name, const std::map<std::string, Value>& options) {
  auto table = std::make_shared<Table>();
  for (const auto& [key, value] : options) table->set(key, value);
  return Config(table, name);
}

// Entropy in nats of the byte frequencies, computed here independently of the dataset.
double byte_entropy(const std::string& text) {
  std::vector<double> counts(256, 0);
  for (unsigned char c : text) counts[c] += 1;
  double entropy = 0;
  for (double count : counts) {
    if (count == 0) continue;
    const double p = count / static_cast<double>(text.size());
    entropy -= p * std::log(p);
  }
  return entropy;
}

TEST(GptLearning, LossFallsBelowTheUnigramEntropy) {
  if (!fs::exists(kCorpus)) GTEST_SKIP() << kCorpus << " missing: run tools/setup (fortunes)";
  std::string text = read_text(kCorpus).substr(0, 200000);
  TempDir dir;
  dir.write("slice.txt", text);
  const double entropy = byte_entropy(text);

  Registry registry;
  load_bundled_plugins(registry);
  BuildContext context;
  auto dataset = registry.create<Dataset>(
      "text", section("dataset", {{"path", Value((dir / "slice.txt").string())},
                                  {"cache", Value((dir / "cache").string())},
                                  {"seq_len", Value(64)}}),
      context);
  context.data = dataset->info();
  ASSERT_EQ(context.data.vocab_size, 256);
  torch::manual_seed(0);
  auto model = registry.create<Model>(
      "gpt", section("model", {{"n_layers", Value(2)}, {"n_heads", Value(4)},
                               {"d_model", Value(128)}}),
      context);
  auto optimizer_plugin = registry.create<Optimizer>(
      "adamw", section("optimizer", {{"lr", Value(3e-3)}, {"weight_decay", Value(0.01)}}),
      context);
  auto optimizer = optimizer_plugin->create(model->module().parameters());
  auto blocks = model->blocks();

  auto train = dataset->stream_split("train");
  ASSERT_NE(train, nullptr);
  StreamShard shard;
  shard.seed = 1;
  auto stream = train->open(shard);
  auto next_batch = [&] {
    std::vector<TensorMap> samples;
    while (samples.size() < 16) {
      auto sample = stream->next();
      if (!sample) {
        ++shard.epoch;
        stream = train->open(shard);
        continue;
      }
      samples.push_back(std::move(*sample));
    }
    return collate(samples);
  };

  constexpr int kSteps = 250;
  std::vector<double> losses;
  model->module().train();
  for (int step = 0; step < kSteps; ++step) {
    Batch batch = next_batch();
    optimizer->zero_grad();
    at::Tensor loss = model->loss(run_blocks(*model, blocks, batch), batch);
    loss.backward();
    optimizer->step();
    losses.push_back(loss.item<double>());
  }
  const double first = losses.front();
  const double last = std::accumulate(losses.end() - 20, losses.end(), 0.0) / 20;

  model->module().eval();
  torch::NoGradGuard no_grad;
  auto test = dataset->map_split("test");
  ASSERT_NE(test, nullptr);
  std::vector<std::int64_t> indices(static_cast<std::size_t>(std::min<std::int64_t>(test->size(), 64)));
  std::iota(indices.begin(), indices.end(), 0);
  Batch held_out = test->get_batch(indices);
  const double eval_loss = model->loss(run_blocks(*model, blocks, held_out), held_out).item<double>();

  std::cout << "unigram entropy " << entropy << " nats; loss " << first << " -> " << last
            << " (train, last 20 steps), " << eval_loss << " (held out)\n";
  EXPECT_GT(first, entropy) << "an untrained model starts above the unigram entropy";
  EXPECT_LT(last, entropy - 0.25) << "training loss must fall clearly below the unigram entropy";
  EXPECT_LT(eval_loss, entropy - 0.2) << "held-out loss must fall below the unigram entropy";
}

}  // namespace
}  // namespace trainyard::testing
