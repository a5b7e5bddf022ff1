// Stage builds of the bundled models: a stage allocates only its own parameters (measured on the
// allocator), initial values depend on the seed and the parameter's name only, building leaves
// the global generator alone, the gpt's tied head weight, and the refusals a stage owes. (That
// every stage equals the slice of the whole model is the model conformance suite's
// StageEqualsTheSliceOfTheWholeModel.)

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <cmath>
#include <map>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"

namespace trainyard::testing {
namespace {

std::shared_ptr<Model> make(const std::string& plugin, const std::map<std::string, Value>& options,
                            BuildContext context, std::uint64_t seed,
                            std::optional<BlockRange> blocks = std::nullopt) {
  auto table = std::make_shared<Table>();
  for (const auto& [key, value] : options) table->set(key, value);
  context.seed = seed;
  context.blocks = blocks;
  return bundled_registry().create<Model>(plugin, Config(table, "model"), context);
}

BuildContext language_context() {
  BuildContext context;
  context.data.input_shape = {32};
  context.data.vocab_size = 256;
  context.data.sequence_length = 32;
  return context;
}

BuildContext image_context() {
  BuildContext context;
  context.data.input_shape = {1, 28, 28};
  context.data.num_classes = 10;
  return context;
}

std::map<std::string, Value> gpt_options(std::int64_t layers) {
  return {{"n_layers", Value(layers)}, {"n_heads", Value(4)}, {"d_model", Value(64)}};
}

std::int64_t parameter_and_buffer_bytes(torch::nn::Module& module) {
  std::int64_t bytes = 0;
  for (const auto& p : module.parameters(true)) bytes += p.nbytes();
  for (const auto& b : module.buffers(true)) bytes += b.nbytes();
  return bytes;
}

std::int64_t bytes_allocated_building(const std::optional<BlockRange>& blocks,
                                      std::shared_ptr<Model>& model) {
  AllocationTracker tracker;
  model = make("gpt", gpt_options(4), language_context(), 1, blocks);
  return tracker.peak_bytes();
}

TEST(StageBuild, AStageAllocatesOnlyItsOwnParameters) {
  // Blocks: embed, layer0 .. layer3, head.
  std::shared_ptr<Model> whole;
  const std::int64_t whole_bytes = bytes_allocated_building(std::nullopt, whole);
  EXPECT_GE(whole_bytes, parameter_and_buffer_bytes(whole->module()));
  constexpr std::int64_t kSlack = 64 * 1024;  // the generator state the build saves, and such
  for (const BlockRange range :
       {BlockRange{2, 3}, BlockRange{1, 3}, BlockRange{4, -1}, BlockRange{0, 1}}) {
    std::shared_ptr<Model> stage;
    const std::int64_t bytes = bytes_allocated_building(range, stage);
    const std::int64_t own = parameter_and_buffer_bytes(stage->module());
    const std::string label =
        "blocks [" + std::to_string(range.begin) + ", " + std::to_string(range.end) + ")";
    EXPECT_GT(own, 0) << label;
    EXPECT_LE(bytes, own + kSlack) << label << ": own parameters " << own;
    EXPECT_LT(bytes, whole_bytes / 2) << label << ": the whole model allocates " << whole_bytes;
  }
  std::shared_ptr<Model> nothing;
  EXPECT_LE(bytes_allocated_building(BlockRange{3, 3}, nothing), kSlack);
}

TEST(StageBuild, DifferentSeedsGiveDifferentValues) {
  for (const auto& [plugin, options, context] :
       {std::tuple{std::string("gpt"), gpt_options(2), language_context()},
        std::tuple{std::string("cnn"), std::map<std::string, Value>{}, image_context()},
        std::tuple{std::string("mlp"), std::map<std::string, Value>{}, image_context()}}) {
    auto first = make(plugin, options, context, 1);
    auto second = make(plugin, options, context, 2);
    auto others = second->module().named_parameters(true);
    for (const auto& item : first->module().named_parameters(true)) {
      const at::Tensor& other = others[item.key()];
      // Norms start at ones and zeros, as do the gpt's biases: only drawn values differ.
      if (item.value().eq(item.value().flatten()[0]).all().item<bool>()) {
        EXPECT_TRUE(at::equal(item.value(), other)) << plugin << " " << item.key();
      } else {
        EXPECT_FALSE(at::equal(item.value(), other)) << plugin << " " << item.key();
      }
    }
  }
}

TEST(StageBuild, AParameterHasTheSameValuesWhateverTheModelsDepth) {
  auto shallow = make("gpt", gpt_options(2), language_context(), 9);
  auto deep = make("gpt", gpt_options(4), language_context(), 9);
  auto deep_parameters = deep->module().named_parameters(true);
  std::size_t compared = 0;
  for (const auto& item : shallow->module().named_parameters(true)) {
    const at::Tensor& other = deep_parameters[item.key()];
    const bool residual = item.key().find("attention_out.weight") != std::string::npos ||
                          item.key().find("mlp_out.weight") != std::string::npos;
    if (residual) {
      // GPT-2 scales residual projections by 1 / sqrt(2 n_layers): the same draw, scaled.
      EXPECT_TRUE(at::allclose(other, item.value() * std::sqrt(2.0 / 4.0), 1e-6, 0)) << item.key();
    } else {
      EXPECT_TRUE(at::equal(item.value(), other)) << item.key();
    }
    ++compared;
  }
  EXPECT_EQ(compared, shallow->module().named_parameters(true).size());
  // The mlp's first layer does not depend on the layers after it either.
  auto narrow = make("mlp", {{"hidden", Value(Array{Value(64)})}}, image_context(), 9);
  auto wide =
      make("mlp", {{"hidden", Value(Array{Value(64), Value(32), Value(16)})}}, image_context(), 9);
  EXPECT_TRUE(at::equal(narrow->module().named_parameters()["hidden0.1.weight"],
                        wide->module().named_parameters()["hidden0.1.weight"]));
}

TEST(StageBuild, BuildingLeavesTheGlobalGeneratorAlone) {
  for (const auto& range : {std::optional<BlockRange>{}, std::optional<BlockRange>{{1, 3}}}) {
    torch::manual_seed(21);
    const at::Tensor expected = at::rand({16});
    torch::manual_seed(21);
    make("gpt", gpt_options(2), language_context(), 4, range);
    make("cnn", {}, image_context(), 4, range);
    EXPECT_TRUE(at::equal(at::rand({16}), expected))
        << "a model build drew from the global generator (dropout and shuffling draw from it)";
  }
}

TEST(StageBuild, TheLastStageHoldsACopyOfTheTiedHeadWeight) {
  auto whole = make("gpt", gpt_options(2), language_context(), 3);
  auto last = make("gpt", gpt_options(2), language_context(), 3, BlockRange{2, -1});
  const auto ties = last->tied_parameters();
  ASSERT_EQ(ties.size(), 1u);
  EXPECT_EQ(ties[0].name, "embed.token.weight");
  EXPECT_EQ(ties[0].blocks, (std::vector<std::string>{"embed", "head"}));
  EXPECT_EQ(ties[0].held_as, "head_token_weight");
  const at::Tensor copy = last->module().named_parameters()["head_token_weight"];
  EXPECT_TRUE(at::equal(copy, whole->module().named_parameters()["embed.token.weight"]));
  // The head runs on the copy.
  const auto blocks = last->blocks();
  ASSERT_EQ(blocks.back().name, "head");
  EXPECT_EQ(blocks.back().module->named_parameters()["token_weight"].data_ptr(), copy.data_ptr());

  EXPECT_EQ(whole->tied_parameters().at(0).held_as, "embed.token.weight");
  auto middle = make("gpt", gpt_options(2), language_context(), 3, BlockRange{1, 3});
  EXPECT_EQ(middle->tied_parameters().at(0).held_as, "");
}

TEST(StageBuild, StagesShareTheWholeModelsFlopsAndBlockNames) {
  for (const auto& [plugin, options, context] :
       {std::tuple{std::string("gpt"), gpt_options(3), language_context()},
        std::tuple{std::string("cnn"), std::map<std::string, Value>{}, image_context()}}) {
    auto whole = make(plugin, options, context, 0);
    const auto count = static_cast<std::int64_t>(whole->block_names().size());
    double sum = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      auto stage = make(plugin, options, context, 0, BlockRange{i, i + 1});
      EXPECT_EQ(stage->block_names(), whole->block_names());
      sum += stage->flops_per_sample();
    }
    EXPECT_NEAR(sum, whole->flops_per_sample(), 1e-9 * whole->flops_per_sample()) << plugin;
  }
}

TEST(StageBuild, RefusesRangesOutsideTheModelAndCallsAStageCannotAnswer) {
  for (const BlockRange range :
       {BlockRange{0, 7}, BlockRange{-1, 2}, BlockRange{3, 2}, BlockRange{2, -2}}) {
    const std::string message =
        error_of([&] { make("gpt", gpt_options(4), language_context(), 0, range); });
    EXPECT_TRUE(contains(message, "model 'gpt' has 6 blocks"));
    const std::string shown = std::string("[") + std::to_string(range.begin) + ", " +
                              std::to_string(range.end) + ")";
    EXPECT_TRUE(contains(message, shown));
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  EXPECT_TRUE(contains(error_of([&] {
                         make("mlp", {}, image_context(), 0, BlockRange{0, 4});
                       }),
                       "model 'mlp' has 3 blocks"));

  auto middle = make("mlp", {}, image_context(), 0, BlockRange{1, 2});
  Batch batch;
  batch.size = 2;
  batch.tensors["input"] = at::rand({2, 1, 28, 28});
  batch.tensors["target"] = at::zeros({2}, at::kLong);
  const at::Tensor logits = at::rand({2, 10});
  EXPECT_TRUE(contains(error_of([&] { middle->input(batch); }), "input() needs the first block"));
  EXPECT_TRUE(contains(error_of([&] { middle->loss(logits, batch); }),
                       "loss() needs the last block, but this build holds blocks [1, 2) of 3"));
  EXPECT_TRUE(contains(error_of([&] { middle->eval_sums(logits, batch); }), "eval_sums()"));
  auto gpt_middle = make("gpt", gpt_options(2), language_context(), 0, BlockRange{1, 2});
  EXPECT_TRUE(contains(error_of([&] { gpt_middle->input(batch); }), "input()"));
  EXPECT_TRUE(contains(error_of([&] { gpt_middle->loss(logits, batch); }), "loss()"));
}

}  // namespace
}  // namespace trainyard::testing
