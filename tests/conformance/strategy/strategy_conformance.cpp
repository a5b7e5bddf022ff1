// Strategy conformance, on the bundled mlp model, sgd optimizer, fp32 precision and cpu device:
// training lowers the loss, accumulation equals one larger batch, eval leaves parameters alone,
// state resumes bit for bit, full_parameters names the model's parameters, held_bytes measures
// what the strategy holds, and steps mark their phases on the engine's clock.

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <set>

#include "conformance.hpp"
#include "trainyard/device.hpp"
#include "trainyard/model.hpp"
#include "trainyard/optimizer.hpp"
#include "trainyard/precision.hpp"
#include "trainyard/step_phases.hpp"
#include "trainyard/strategy.hpp"

namespace {

using namespace trainyard;

constexpr std::int64_t kBatch = 8;
constexpr std::int64_t kClasses = 5;
const std::vector<std::int64_t> kShape = {1, 6, 6};

class StrategyConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (const auto& [kind, name] : std::vector<std::pair<std::string, std::string>>{
             {"model", "mlp"}, {"optimizer", "sgd"}, {"precision", "fp32"}, {"device", "cpu"}}) {
      if (!conformance::registry().contains(kind, name)) {
        GTEST_SKIP() << "needs the bundled " << kind << " '" << name << "'";
      }
    }
  }

  static BuildContext build_context() {
    BuildContext context = conformance::classification_context(kShape, kClasses);
    context.seed = 77;
    return context;
  }

  // A strategy set up on a freshly seeded mlp (the same initial parameters every time).
  std::shared_ptr<Strategy> make(std::int64_t accumulation = 1, double momentum = 0.0,
                                 PhaseClock* phases = nullptr) {
    auto& registry = conformance::registry();
    StrategyContext context;
    context.build = build_context();
    context.make_model = [&registry](const BuildContext& build) {
      auto options = std::make_shared<Table>();
      options->set("hidden", Value(Array{Value(16)}));
      return registry.create<Model>("mlp", conformance::section("model", options), build);
    };
    auto optimizer_options = std::make_shared<Table>();
    optimizer_options->set("lr", Value(0.1));
    if (momentum > 0) optimizer_options->set("momentum", Value(momentum));
    context.optimizer = registry.create<Optimizer>(
        "sgd", conformance::section("optimizer", optimizer_options), context.build);
    context.precision =
        registry.create<Precision>("fp32", conformance::section("precision"), context.build);
    context.device_backend =
        registry.create<DeviceBackend>("cpu", conformance::section("device"), context.build);
    context.step.accumulation = accumulation;
    context.phases = phases;
    auto strategy = registry.create<Strategy>(GetParam(), conformance::section("strategy"),
                                              context.build);
    torch::manual_seed(context.build.seed);
    strategy->setup(context);
    return strategy;
  }

  static Batch make_batch(std::int64_t size, std::uint64_t seed) {
    torch::manual_seed(seed);
    Batch batch;
    batch.size = size;
    std::vector<std::int64_t> shape = {size};
    shape.insert(shape.end(), kShape.begin(), kShape.end());
    batch.tensors["input"] = torch::randn(shape);
    batch.tensors["target"] = torch::randint(0, kClasses, {size}, torch::kLong);
    return batch;
  }

  static Batch concat(const Batch& a, const Batch& b) {
    Batch out;
    out.size = a.size + b.size;
    for (const auto& [name, tensor] : a.tensors) {
      out.tensors[name] = torch::cat({tensor, b.tensors.at(name)});
    }
    return out;
  }

  static TensorMap snapshot(const Strategy& strategy) {
    TensorMap out;
    for (const auto& [name, tensor] : strategy.full_parameters()) out[name] = tensor.detach().clone();
    return out;
  }

  static void expect_bitwise_equal(const TensorMap& a, const TensorMap& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (const auto& [name, tensor] : a) {
      auto it = b.find(name);
      ASSERT_NE(it, b.end()) << what << ": '" << name << "'";
      EXPECT_TRUE(at::equal(tensor.cpu(), it->second.cpu()))
          << what << ": '" << name << "' differs, max diff "
          << (tensor.cpu() - it->second.cpu()).abs().max().item<double>();
    }
  }

  static StepResult step(Strategy& strategy, const Batch& batch) {
    return strategy.train_step(std::span<const Batch>(&batch, 1));
  }
};

TEST_P(StrategyConformance, HeldBytesMeasureParametersGradientsAndOptimizerState) {
  auto strategy = make(1, /*momentum=*/0.9);
  std::int64_t full = 0;
  for (const auto& [name, tensor] : strategy->full_parameters()) full += tensor.nbytes();
  ASSERT_GT(full, 0);
  step(*strategy, make_batch(kBatch, 1));
  const HeldBytes held = strategy->held_bytes();
  // One process holds every parameter, a gradient for each and SGD's momentum buffer for each;
  // flat buffers (buckets, padded shards) may add up to as much again.
  for (const auto& [what, bytes] : {std::pair{"parameters", held.parameters},
                                    std::pair{"gradients", held.gradients},
                                    std::pair{"optimizer state", held.optimizer_state}}) {
    EXPECT_GE(bytes, full) << what;
    EXPECT_LE(bytes, 2 * full) << what;
  }
  EXPECT_EQ(held.total(), held.parameters + held.gradients + held.optimizer_state);
}

TEST_P(StrategyConformance, StepsMarkForwardAndBackwardOnTheEnginesClock) {
  PhaseClock clock(nullptr, 0, /*keep_spans=*/true);
  auto strategy = make(2, 0.0, &clock);
  Batch a = make_batch(kBatch, 1);
  Batch b = make_batch(kBatch, 2);
  std::vector<Batch> micro = {a, b};
  clock.begin_step(0);
  clock.end_data_wait();
  strategy->train_step(micro);
  clock.end_step();
  PhaseRollup rollup = clock.rollup();
  EXPECT_GT(rollup.at(StepPhase::Forward), 0);
  EXPECT_GT(rollup.at(StepPhase::Backward), 0);
  std::size_t forwards = 0;
  for (const auto& span : rollup.spans) forwards += span.phase == StepPhase::Forward ? 1 : 0;
  EXPECT_EQ(forwards, 2u) << "one forward mark per micro-batch";
}

TEST_P(StrategyConformance, TrainingLowersTheLossOnAFixedBatch) {
  auto strategy = make();
  Batch batch = make_batch(kBatch, 1);
  StepResult first = step(*strategy, batch);
  ASSERT_TRUE(first.loss.defined());
  EXPECT_EQ(first.loss.dim(), 0);
  EXPECT_EQ(first.samples, kBatch);
  EXPECT_FALSE(first.skipped);
  const double initial = first.loss.item<double>();
  EXPECT_TRUE(std::isfinite(initial));
  double last = initial;
  for (int i = 0; i < 15; ++i) last = step(*strategy, batch).loss.item<double>();
  EXPECT_LT(last, initial * 0.9) << "15 sgd steps at lr 0.1 on one batch must lower its loss";
}

TEST_P(StrategyConformance, AccumulationEqualsOneLargerBatch) {
  auto accumulated = make(/*accumulation=*/2);
  auto whole = make(/*accumulation=*/1);
  expect_bitwise_equal(snapshot(*accumulated), snapshot(*whole), "initial parameters");
  for (int i = 0; i < 3; ++i) {
    Batch a = make_batch(kBatch, 100 + i);
    Batch b = make_batch(kBatch, 200 + i);
    std::vector<Batch> micro = {a, b};
    StepResult r_acc = accumulated->train_step(micro);
    StepResult r_whole = step(*whole, concat(a, b));
    EXPECT_EQ(r_acc.samples, 2 * kBatch);
    EXPECT_NEAR(r_acc.loss.item<double>(), r_whole.loss.item<double>(), 1e-5)
        << "step loss must be the mean over every sample";
  }
  TensorMap p_acc = accumulated->full_parameters();
  TensorMap p_whole = whole->full_parameters();
  ASSERT_EQ(p_acc.size(), p_whole.size());
  for (const auto& [name, tensor] : p_acc) {
    ASSERT_TRUE(p_whole.count(name)) << name;
    EXPECT_TRUE(torch::allclose(tensor.cpu(), p_whole.at(name).cpu(), 1.3e-6, 1e-5))
        << "'" << name << "' max diff "
        << (tensor.cpu() - p_whole.at(name).cpu()).abs().max().item<double>();
  }
}

TEST_P(StrategyConformance, EvalStepLeavesParametersUnchanged) {
  auto strategy = make();
  step(*strategy, make_batch(kBatch, 1));
  TensorMap before = snapshot(*strategy);
  Batch batch = make_batch(kBatch, 2);
  EvalResult result = strategy->eval_step(batch);
  expect_bitwise_equal(before, snapshot(*strategy), "after eval_step");
  EXPECT_EQ(result.samples, kBatch);
  ASSERT_TRUE(result.loss_sum.defined());
  EXPECT_TRUE(std::isfinite(result.loss_sum.item<double>()));
  EXPECT_GE(result.loss_sum.item<double>(), 0);
  for (const auto& [name, value] : result.sums) {
    EXPECT_TRUE(value.isfinite().all().item<bool>()) << name;
  }

  // Training after an evaluation is the same as training without one.
  auto reference = make();
  step(*reference, make_batch(kBatch, 1));
  Batch next = make_batch(kBatch, 3);
  step(*strategy, next);
  step(*reference, next);
  expect_bitwise_equal(snapshot(*strategy), snapshot(*reference), "train after eval");
}

TEST_P(StrategyConformance, StateRoundTripResumesBitForBit) {
  for (double momentum : {0.0, 0.9}) {
    const std::string label = "momentum " + std::to_string(momentum);
    auto original = make(1, momentum);
    for (int i = 0; i < 3; ++i) step(*original, make_batch(kBatch, 10 + i));
    CheckpointState state;
    original->save_state(state);
    EXPECT_FALSE(state.shared.tensors.empty() && state.local.tensors.empty()) << label;

    // A strategy with different parameters: the loaded state must replace them.
    auto resumed = make(1, momentum);
    step(*resumed, make_batch(kBatch, 99));
    resumed->load_state(state);
    expect_bitwise_equal(snapshot(*original), snapshot(*resumed), label + ": after load_state");

    for (int i = 0; i < 2; ++i) {
      Batch batch = make_batch(kBatch, 50 + i);
      StepResult a = step(*original, batch);
      StepResult b = step(*resumed, batch);
      EXPECT_EQ(a.loss.item<double>(), b.loss.item<double>()) << label;
    }
    expect_bitwise_equal(snapshot(*original), snapshot(*resumed), label + ": after resumed steps");
  }
}

TEST_P(StrategyConformance, SetLearningRateTakesEffect) {
  auto a = make();
  auto b = make();
  a->set_learning_rate(0.0);
  TensorMap before = snapshot(*a);
  Batch batch = make_batch(kBatch, 4);
  step(*a, batch);
  expect_bitwise_equal(before, snapshot(*a), "a step at lr 0");
  step(*b, batch);
  bool moved = false;
  for (const auto& [name, tensor] : snapshot(*b)) moved |= !at::equal(tensor, before.at(name));
  EXPECT_TRUE(moved) << "a step at lr 0.1 changed nothing";
}

TEST_P(StrategyConformance, FullParametersNameTheModelParameters) {
  auto strategy = make();
  auto& registry = conformance::registry();
  auto options = std::make_shared<Table>();
  options->set("hidden", Value(Array{Value(16)}));
  torch::manual_seed(build_context().seed);
  auto model = registry.create<Model>("mlp", conformance::section("model", options), build_context());
  std::set<std::string> expected;
  auto model_params = model->module().named_parameters(true);
  for (const auto& item : model_params) expected.insert(item.key());
  TensorMap full = strategy->full_parameters();
  std::set<std::string> got;
  for (const auto& [name, tensor] : full) {
    got.insert(name);
    if (const torch::Tensor* p = model_params.find(name)) {
      EXPECT_EQ(tensor.sizes(), p->sizes()) << name;
      EXPECT_EQ(tensor.scalar_type(), p->scalar_type()) << name;
    }
  }
  EXPECT_EQ(got, expected);
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(StrategyConformance, "strategy");
