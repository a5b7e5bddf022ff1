// Data parallel over the device mesh's data-parallel group rather than the world: four ranks as
// threads over gloo form a mesh of pp 2 x dp 2, and each pipeline coordinate's pair of ranks
// trains on its own data over its own dp sub-group. Each pair must end bitwise where a 2-rank
// job over the world group ends on the same data, which holds only if the pairs never
// communicate with each other.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "step_harness.hpp"

namespace trainyard::testing {
namespace {

constexpr int kSteps = 3;
constexpr std::int64_t kBatch = 8;

// The batch data-parallel rank `dp_rank` trains on at `step` in data set `data`.
Batch batch_of(std::uint64_t data, int step, int dp_rank) {
  return random_batch(
      kBatch, {6}, 4,
      1000 * data + 10 * static_cast<std::uint64_t>(step) + static_cast<std::uint64_t>(dp_rank));
}

struct RankResult {
  TensorMap parameters;
  DataParallelPlace place;
};

HarnessOptions strategy_options(const std::string& strategy, const std::string& options) {
  HarnessOptions harness;
  harness.strategy = strategy;
  harness.strategy_options = options;
  harness.model_options = "hidden = [16, 12]";
  harness.optimizer = "adamw";
  harness.optimizer_options = "lr = 0.01\nweight_decay = 0.01";
  return harness;
}

// Trains kSteps on data set `data` as the strategy's data-parallel place says, then every
// rank's whole parameters.
RankResult train(HarnessOptions options, int rank, int ranks, int port, std::uint64_t data) {
  options.as_rank(rank, ranks, port);
  StepHarness harness(options);
  RankResult result;
  result.place = harness.strategy->data_parallel_place();
  for (int step = 0; step < kSteps; ++step) {
    Batch batch = batch_of(data, step, result.place.rank);
    harness.strategy->train_step(std::span<const Batch>(&batch, 1));
  }
  result.parameters = harness.parameters();
  harness.context.communicator->barrier();
  return result;
}

// A 2-rank job over the world group on data set `data`: rank 0's parameters.
TensorMap over_the_world(const HarnessOptions& options, std::uint64_t data) {
  auto ranks = run_threaded_ranks<RankResult>(
      2, [&](int rank, int port) { return train(options, rank, 2, port, data); });
  EXPECT_TRUE(all_close_fp32(ranks[1].parameters, ranks[0].parameters));
  return ranks[0].parameters;
}

bool bitwise_equal(const TensorMap& a, const TensorMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, tensor] : a) {
    auto it = b.find(name);
    if (it == b.end() || !at::equal(tensor, it->second)) return false;
  }
  return true;
}

// Four ranks, pp 2 x dp 2: ranks 0 and 1 (pipeline coordinate 0) train on data set 0, ranks 2
// and 3 on data set 1, each pair over its own dp group.
void expect_pairs_match_world_jobs(const HarnessOptions& options) {
  at::set_num_threads(1);
  const TensorMap first = over_the_world(options, 0);
  const TensorMap second = over_the_world(options, 1);
  // Different data trains to different parameters, so a pair that averaged with the other
  // pair would match neither job.
  ASSERT_FALSE(bitwise_equal(first, second));
  auto ranks = run_threaded_ranks<RankResult>(4, [&](int rank, int port) {
    HarnessOptions meshed = options;
    meshed.mesh = MeshRequest{.pp = 2, .dp_replicate = 1, .dp_shard = 2};
    return train(meshed, rank, 4, port, static_cast<std::uint64_t>(rank / 2));
  });
  for (int rank = 0; rank < 4; ++rank) {
    const RankResult& result = ranks[static_cast<std::size_t>(rank)];
    EXPECT_EQ(result.place.rank, rank % 2) << "rank " << rank;
    EXPECT_EQ(result.place.size, 2) << "rank " << rank;
    EXPECT_TRUE(bitwise_equal(result.parameters, rank < 2 ? first : second)) << "rank " << rank;
  }
}

TEST(DataParallelGroups, DdpOverEachPairsDpGroupMatchesDdpOverTheWorld) {
  // Small buckets: several all-reduces per step, launched from the hooks.
  expect_pairs_match_world_jobs(strategy_options("ddp", "bucket_cap_mb = 0.0005"));
}

TEST(DataParallelGroups, Zero1OverEachPairsDpGroupMatchesZero1OverTheWorld) {
  expect_pairs_match_world_jobs(strategy_options("ddp", "zero1 = true"));
}

TEST(DataParallelGroups, FsdpOverEachPairsDpGroupMatchesFsdpOverTheWorld) {
  expect_pairs_match_world_jobs(strategy_options("fsdp", "sharding = \"full\""));
}

// Hybrid sharding with a replicate dimension of 2 and shards of 1 (each rank holds every
// parameter; the shards' gradients are averaged across the replicate groups) ends where fsdp
// over the world ends on the same data, on both ranks.
TEST(DataParallelGroups, HybridShardingOverTheReplicateGroupMatchesFsdpOverTheWorld) {
  at::set_num_threads(1);
  const HarnessOptions options = strategy_options("fsdp", "sharding = \"full\"");
  const TensorMap world = over_the_world(options, 0);
  auto ranks = run_threaded_ranks<RankResult>(2, [&](int rank, int port) {
    HarnessOptions meshed = options;
    meshed.mesh = MeshRequest{.pp = 1, .dp_replicate = 2, .dp_shard = 1};
    return train(meshed, rank, 2, port, 0);
  });
  for (int rank = 0; rank < 2; ++rank) {
    const RankResult& result = ranks[static_cast<std::size_t>(rank)];
    EXPECT_EQ(result.place.rank, rank);
    EXPECT_EQ(result.place.size, 2);
    EXPECT_TRUE(all_close_fp32(result.parameters, world)) << "rank " << rank;
  }
}

}  // namespace
}  // namespace trainyard::testing
