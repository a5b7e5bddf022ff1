// Every strategy ends its step alike (judge_gradients): the gradient norm is reported every
// step, the same number as one process's on the global batch, and a step whose gradients hold a
// nan steps no optimizer on any rank. The nan is planted by the TRAINYARD_TEST_NONFINITE hook
// in one parameter's synchronised gradient at step 1 of 3; each strategy must then name that
// parameter on the ranks holding it and end where one process ends that trained on the other two
// batches only. A strategy that stepped on the nan ends with nans; one that stepped on zeroed
// gradients instead moves by momentum and weight decay, and ends elsewhere.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "step_harness.hpp"
#include "trainyard/parallel/gradient_verdict.hpp"

namespace trainyard::testing {
namespace {

constexpr int kSteps = 3;
constexpr int kPoisonedStep = 1;
constexpr std::int64_t kGlobalBatch = 8;
constexpr std::int64_t kVocab = 64;
constexpr std::int64_t kLength = 16;
// Split by tensor parallelism, held by the second pipeline stage, sharded by fsdp.
const char* const kPoisoned = "layer1.mlp_in.weight";

// The global batch of `step`.
Batch global_batch(int step) {
  at::Generator generator =
      at::detail::createCPUGenerator(100 * static_cast<std::uint64_t>(step) + 7);
  Batch batch;
  batch.size = kGlobalBatch;
  batch.tensors["input"] = at::randint(kVocab, {kGlobalBatch, kLength}, generator, at::kLong);
  batch.tensors["target"] = batch.tensors["input"].roll(-1, 1);
  return batch;
}

// Data-parallel rank `rank` of `ranks`' share of `batch`.
Batch share_of(const Batch& batch, const DataParallelPlace& place) {
  const std::int64_t size = batch.size / place.size;
  Batch share;
  share.size = size;
  for (const auto& [name, tensor] : batch.tensors) {
    share.tensors[name] = tensor.narrow(0, place.rank * size, size).contiguous();
  }
  return share;
}

struct Layout {
  std::string strategy = "single";
  std::string strategy_options;
  int ranks = 1;
  std::optional<MeshRequest> mesh;
  std::string precision = "fp32";
};

struct RankRun {
  std::vector<double> norms;           // per step
  std::vector<bool> skipped;           // per step
  std::vector<std::string> nonfinite;  // per step: the parameter this rank named
  TensorMap parameters;
};

HarnessOptions options_for(const Layout& layout) {
  HarnessOptions options;
  options.strategy = layout.strategy;
  options.strategy_options = layout.strategy_options;
  options.model = "gpt";
  options.model_options = "n_layers = 2\nn_heads = 4\nd_model = 32\ndropout = 0.0";
  // Momentum and weight decay move the parameters even on zero gradients. (Adam would scale up
  // the rounding of the attention's key bias gradient, zero but for rounding, which differs
  // with the summation order of every split.)
  options.optimizer = "sgd";
  options.optimizer_options = "lr = 0.1\nmomentum = 0.9\nweight_decay = 0.01";
  options.precision = layout.precision;
  options.input_shape = {kLength};
  options.vocab_size = kVocab;
  options.seed = 11;
  options.mesh = layout.mesh;
  return options;
}

// Trains the global batches of `steps` under `layout`, one rank per thread.
std::vector<RankRun> train(const Layout& layout, const std::vector<int>& steps) {
  return run_threaded_ranks<RankRun>(layout.ranks, [&](int rank, int port) {
    HarnessOptions options = options_for(layout);
    options.as_rank(rank, layout.ranks, port);
    StepHarness harness(options);
    RankRun run;
    const DataParallelPlace place = harness.strategy->data_parallel_place();
    for (int step : steps) {
      set_test_hook_step(step);
      Batch batch = share_of(global_batch(step), place);
      const StepResult result = harness.strategy->train_step(std::span<const Batch>(&batch, 1));
      run.norms.push_back(result.grad_norm.item<double>());
      run.skipped.push_back(result.skipped);
      run.nonfinite.push_back(result.nonfinite_parameter);
    }
    run.parameters = harness.parameters();
    if (harness.context.communicator) harness.context.communicator->barrier();
    return run;
  });
}

class PoisonedGradient {
 public:
  PoisonedGradient() {
    const std::string plan = std::to_string(kPoisonedStep) + ":" + kPoisoned;
    ::setenv("TRAINYARD_TEST_NONFINITE", plan.c_str(), 1);
  }
  ~PoisonedGradient() {
    ::unsetenv("TRAINYARD_TEST_NONFINITE");
    set_test_hook_step(-1);
  }
};

// PyTorch's tolerances for the precision: a split batch autocast to bfloat16 rounds otherwise
// than the whole one (the absolute one looser, for parameters near zero after two updates).
struct Tolerance {
  double rtol;
  double atol;
};
Tolerance tolerance_of(const Layout& layout) {
  return layout.precision == "bf16" ? Tolerance{1.6e-2, 1e-4} : Tolerance{1.3e-6, 1e-5};
}

bool close(double actual, double expected, const Tolerance& tolerance) {
  return std::abs(actual - expected) <= tolerance.atol + tolerance.rtol * std::abs(expected);
}

::testing::AssertionResult all_close(const TensorMap& actual, const TensorMap& expected,
                                     const Tolerance& tolerance) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "different keys";
  for (const auto& [name, tensor] : actual) {
    if (!at::allclose(tensor, expected.at(name), tolerance.rtol, tolerance.atol)) {
      return ::testing::AssertionFailure()
             << name << " differs by " << (tensor - expected.at(name)).abs().max().item<double>();
    }
  }
  return ::testing::AssertionSuccess();
}

void expect_skips_the_poisoned_step(const Layout& layout) {
  at::set_num_threads(1);
  // One process that never saw the poisoned batch.
  Layout single = layout;
  single.strategy = "single";
  single.strategy_options.clear();
  single.ranks = 1;
  single.mesh.reset();
  const RankRun reference = train(single, {0, 2}).front();

  std::vector<RankRun> ranks;
  {
    PoisonedGradient poisoned;
    ranks = train(layout, {0, 1, 2});
  }
  const Tolerance tolerance = tolerance_of(layout);
  bool named = false;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const RankRun& run = ranks[r];
    SCOPED_TRACE(layout.strategy + " rank " + std::to_string(r));
    EXPECT_FALSE(run.skipped[0]);
    EXPECT_TRUE(run.skipped[1]) << "every rank skips the poisoned step";
    EXPECT_FALSE(run.skipped[2]);
    EXPECT_FALSE(std::isfinite(run.norms[1]));
    EXPECT_TRUE(close(run.norms[0], reference.norms[0], tolerance))
        << run.norms[0] << " against one process's " << reference.norms[0];
    EXPECT_TRUE(close(run.norms[2], reference.norms[1], tolerance))
        << run.norms[2] << " against one process's " << reference.norms[1];
    EXPECT_TRUE(run.nonfinite[1].empty() || run.nonfinite[1] == kPoisoned) << run.nonfinite[1];
    named = named || run.nonfinite[1] == kPoisoned;
    EXPECT_TRUE(all_close(run.parameters, reference.parameters, tolerance));
  }
  EXPECT_TRUE(named) << "no rank named " << kPoisoned;
}

Layout on_ranks(const std::string& strategy, int ranks, const std::optional<MeshRequest>& mesh,
                const std::string& strategy_options = "") {
  Layout layout;
  layout.strategy = strategy;
  layout.strategy_options = strategy_options;
  layout.ranks = ranks;
  layout.mesh = mesh;
  return layout;
}

Layout under_bf16(Layout layout) {
  layout.precision = "bf16";
  return layout;
}

TEST(NonfiniteStep, SingleSkipsTheStepAndNamesTheParameter) {
  expect_skips_the_poisoned_step(Layout{});
}

TEST(NonfiniteStep, SingleUnderBf16) { expect_skips_the_poisoned_step(under_bf16(Layout{})); }

TEST(NonfiniteStep, DdpOnTwoRanks) { expect_skips_the_poisoned_step(on_ranks("ddp", 2, {})); }

TEST(NonfiniteStep, DdpUnderBf16) {
  expect_skips_the_poisoned_step(under_bf16(on_ranks("ddp", 2, {})));
}

TEST(NonfiniteStep, FsdpOnTwoRanks) { expect_skips_the_poisoned_step(on_ranks("fsdp", 2, {})); }

TEST(NonfiniteStep, TensorParallelOnTwoRanks) {
  expect_skips_the_poisoned_step(
      on_ranks("ddp", 2, MeshRequest{.pp = 1, .dp_replicate = 1, .dp_shard = 1, .tp = 2}));
}

TEST(NonfiniteStep, PipelineOfTwoStages) {
  expect_skips_the_poisoned_step(
      on_ranks("pipeline", 2, MeshRequest{.pp = 2, .dp_replicate = 1, .dp_shard = 1, .tp = 1},
               "micro_batches = 2"));
}

TEST(NonfiniteStep, FsdpOverTensorParallelShards) {
  expect_skips_the_poisoned_step(
      on_ranks("fsdp", 4, MeshRequest{.pp = 1, .dp_replicate = 1, .dp_shard = 2, .tp = 2}));
}

}  // namespace
}  // namespace trainyard::testing
