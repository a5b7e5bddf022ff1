// Cutting a model's blocks into pipeline stages: as the recipe names them, or balanced by cost.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/pipeline_stages.hpp"

namespace trainyard {
namespace {

const std::vector<std::string> kBlocks = {"embed", "layer0", "layer1", "layer2", "head"};

std::vector<std::pair<std::int64_t, std::int64_t>> pairs(const std::vector<BlockRange>& ranges) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const auto& range : ranges) out.emplace_back(range.begin, range.end);
  return out;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(PipelineStages, NamedStagesBecomeConsecutiveRanges) {
  const auto ranges = named_stages({"embed, layer0", "layer1,layer2 ", " head"}, kBlocks, 3);
  EXPECT_EQ(pairs(ranges),
            (std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 2}, {2, 4}, {4, 5}}));
}

TEST(PipelineStages, NamedStagesThatDoNotListEveryBlockOnceInOrderAreRefused) {
  EXPECT_HAS(error_of([] {
               named_stages({"embed, layer0", "layer1, layer2, head"}, kBlocks, 3);
             }),
             "lists 2 stages, but pp x virtual_stages makes 3");
  EXPECT_HAS(error_of([] {
               named_stages({"embed, layer0", "layer2, head"}, kBlocks, 2);
             }),
             "names block 'layer2' where block 'layer1' comes next");
  EXPECT_HAS(error_of([] {
               named_stages({"embed, layer0", "layer1, layer9"}, kBlocks, 2);
             }),
             "names block 'layer9', which the model does not have");
  EXPECT_HAS(error_of([] {
               named_stages({"embed, layer0", "layer1"}, kBlocks, 2);
             }),
             "leave out block 'layer2'");
  EXPECT_HAS(error_of([] {
               named_stages({"embed, layer0, layer1, layer2, head", ""}, kBlocks, 2);
             }),
             "empty block name");
}

TEST(PipelineStages, BalancedStagesMinimiseTheLargestStage) {
  // Costs 1, 4, 4, 4, 3: the best 3-way cut has a largest stage of 7 (1+4 | 4 | 4+3).
  const std::vector<double> costs = {1, 4, 4, 4, 3};
  const auto ranges = balanced_stages(costs, 3);
  EXPECT_EQ(pairs(ranges),
            (std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 2}, {2, 3}, {3, 5}}));
  // Equal costs split evenly; every stage holds at least one block.
  EXPECT_EQ(pairs(balanced_stages({1, 1, 1, 1}, 2)),
            (std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 2}, {2, 4}}));
  EXPECT_EQ(pairs(balanced_stages({0, 0, 9}, 3)),
            (std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 1}, {1, 2}, {2, 3}}));
}

TEST(PipelineStages, BalancedStagesAreExactOnEveryCutOfSmallModels) {
  // Brute force over every cut of 7 blocks into 3 stages.
  const std::vector<double> costs = {5, 1, 7, 2, 2, 6, 3};
  double best = 1e9;
  for (int a = 1; a < 6; ++a) {
    for (int b = a + 1; b < 7; ++b) {
      double s0 = 0, s1 = 0, s2 = 0;
      for (int i = 0; i < 7; ++i) (i < a ? s0 : i < b ? s1 : s2) += costs[i];
      best = std::min(best, std::max({s0, s1, s2}));
    }
  }
  double largest = 0;
  for (const auto& range : balanced_stages(costs, 3)) {
    double sum = 0;
    for (auto i = range.begin; i < range.end; ++i) sum += costs[static_cast<std::size_t>(i)];
    largest = std::max(largest, sum);
  }
  EXPECT_EQ(largest, best);
}

TEST(PipelineStages, FewerBlocksThanStagesOrBadCostsAreRefused) {
  EXPECT_HAS(error_of([] {
               balanced_stages({1, 2}, 3);
             }),
             "the model has 2 blocks, fewer than the 3 stages");
  EXPECT_HAS(error_of([] { balanced_stages({1, -2, 3}, 2); }), "cannot be balanced");
}

TEST(PipelineStages, DescriptionsNameBlocksAndCostShares) {
  const auto lines = describe_stages({{0, 2}, {2, 5}}, kBlocks, {1, 1, 1, 1, 4});
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "stage 0: embed..layer0 (2 blocks, 25.0% of the cost)");
  EXPECT_EQ(lines[1], "stage 1: layer1..head (3 blocks, 75.0% of the cost)");
  EXPECT_EQ(describe_stages({{0, 1}}, {"only"}, {})[0], "stage 0: only (1 block)");
  EXPECT_EQ(stage_cut_key({{0, 2}, {2, 5}}, kBlocks), "stages embed,layer0|layer1,layer2,head");
}

}  // namespace
}  // namespace trainyard
