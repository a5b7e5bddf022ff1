// ddp's buffer broadcast (broadcast_buffers, as PyTorch's DDP): every forward, and every
// evaluation, starts from rank 0's buffers. Two ranks as threads over gloo train a cnn with
// BatchNorm, whose running statistics are buffers each rank updates from its own batch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "step_harness.hpp"

namespace trainyard::testing {
namespace {

constexpr int kRanks = 2;
const std::vector<std::int64_t> kShape = {1, 8, 8};
constexpr std::int64_t kClasses = 10;

// The model's buffers (BatchNorm's running statistics and counters) on one rank.
TensorMap buffers_of(const Strategy& strategy) {
  CheckpointState state;
  strategy.save_state(state);
  TensorMap out;
  for (const auto& [name, tensor] : state.shared.tensors) {
    if (name.find("running_") != std::string::npos ||
        name.find("num_batches") != std::string::npos) {
      out[name] = tensor.clone();
    }
  }
  return out;
}

struct Buffers {
  TensorMap after_shared_step;
  TensorMap after_own_step;
  TensorMap after_evaluation;
};

// Step 1 on a different batch per rank, step 2 on the same batch everywhere, step 3 on a
// different batch per rank again, then one evaluation step.
Buffers run_rank(int rank, int port, bool broadcast_buffers, const std::string& recompute) {
  HarnessOptions options;
  options.strategy = "ddp";
  options.strategy_options =
      std::string("broadcast_buffers = ") + (broadcast_buffers ? "true" : "false");
  options.model = "cnn";
  options.model_options = "channels = [4, 8]\nhidden = 16\nbatch_norm = true";
  options.input_shape = kShape;
  options.classes = kClasses;
  options.as_rank(rank, kRanks, port);
  options.step.activation_checkpointing = ActivationCheckpointing::parse(recompute);
  StepHarness harness(options);
  const auto own = static_cast<std::uint64_t>(rank);
  Batch first = random_batch(8, kShape, kClasses, 10 + own);
  harness.strategy->train_step(std::span<const Batch>(&first, 1));
  Batch shared = random_batch(8, kShape, kClasses, 20);
  harness.strategy->train_step(std::span<const Batch>(&shared, 1));
  Buffers out;
  out.after_shared_step = buffers_of(*harness.strategy);
  Batch third = random_batch(8, kShape, kClasses, 30 + own);
  harness.strategy->train_step(std::span<const Batch>(&third, 1));
  out.after_own_step = buffers_of(*harness.strategy);
  harness.strategy->eval_step(random_batch(8, kShape, kClasses, 40 + own));
  out.after_evaluation = buffers_of(*harness.strategy);
  harness.context.communicator->barrier();
  return out;
}

std::vector<Buffers> run_ranks(bool broadcast_buffers, const std::string& recompute = "none") {
  return run_threaded_ranks<Buffers>(kRanks, [&](int rank, int port) {
    return run_rank(rank, port, broadcast_buffers, recompute);
  });
}

TEST(DdpBuffers, EveryForwardAndEvaluationStartsFromRankZerosBuffers) {
  at::set_num_threads(1);
  auto ranks = run_ranks(true);
  ASSERT_FALSE(ranks[0].after_shared_step.empty());
  // Step 2's forward started from rank 0's statistics of step 1 on rank 1 too, and both ranks
  // updated them from the same batch with the same parameters.
  EXPECT_TRUE(all_close_fp32(ranks[1].after_shared_step, ranks[0].after_shared_step));
  // Step 3 updates them from each rank's own batch, so they differ until the next forward...
  EXPECT_FALSE(all_close_fp32(ranks[1].after_own_step, ranks[0].after_own_step));
  // ...or evaluation (which does not update them): it runs with rank 0's on every rank.
  EXPECT_TRUE(all_close_fp32(ranks[1].after_evaluation, ranks[0].after_evaluation));
}

TEST(DdpBuffers, RecomputedBlocksBroadcastTheBuffersBackwardLeaves) {
  // Recomputing a block in backward updates its statistics a second time (as in PyTorch); the
  // next forward starts from what rank 0 holds then, so rank 0's own statistics are exactly
  // those of a run without the broadcast, and the others follow them.
  at::set_num_threads(1);
  auto ranks = run_ranks(true, "all");
  auto unsynchronised = run_ranks(false, "all");
  EXPECT_TRUE(all_close_fp32(ranks[0].after_shared_step, unsynchronised[0].after_shared_step));
  EXPECT_TRUE(all_close_fp32(ranks[0].after_evaluation, unsynchronised[0].after_evaluation));
  EXPECT_TRUE(all_close_fp32(ranks[1].after_shared_step, ranks[0].after_shared_step));
  EXPECT_TRUE(all_close_fp32(ranks[1].after_evaluation, ranks[0].after_evaluation));
}

TEST(DdpBuffers, WithoutTheBroadcastEachRankKeepsItsOwnStatistics) {
  // The check above can fail: step 1's different batches leave different statistics behind.
  at::set_num_threads(1);
  auto ranks = run_ranks(false);
  EXPECT_FALSE(all_close_fp32(ranks[1].after_shared_step, ranks[0].after_shared_step));
  EXPECT_FALSE(all_close_fp32(ranks[1].after_evaluation, ranks[0].after_evaluation));
}

}  // namespace
}  // namespace trainyard::testing
