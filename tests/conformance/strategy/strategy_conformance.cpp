// Strategy conformance, on the bundled mlp model, sgd optimizer, fp32 precision and cpu device:
// training lowers the loss, accumulation equals one larger batch, eval leaves parameters alone,
// state resumes bit for bit, full_parameters names the model's parameters, held_bytes measures
// what the strategy holds, and steps mark their phases on the engine's clock. A strategy that
// takes part in multi-rank runs is also run on two ranks (threads of this process over the
// bundled gloo communicator), where a step on two half-batches must equal one process's step on
// the whole batch and the ranks must agree.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/utils.h>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "conformance.hpp"
#include "test_support.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"
#include "trainyard/api/step_phases.hpp"
#include "trainyard/api/strategy.hpp"

namespace {

using namespace trainyard;

constexpr std::int64_t kBatch = 8;
constexpr std::int64_t kClasses = 5;
const std::vector<std::int64_t> kShape = {1, 6, 6};
constexpr int kRanks = 2;
using CommunicatorPtr = std::shared_ptr<Communicator>;

// An optimizer whose per-parameter state is a type of its own (SGD with a velocity), as a third
// party's would be: LibTorch's state types are the only ones the SDK reads directly, so a
// strategy sees this state only through the plugin's save_state entries.
struct VelocityOptions : torch::optim::OptimizerCloneableOptions<VelocityOptions> {
  explicit VelocityOptions(double lr) : lr(lr) {}
  double get_lr() const override { return lr; }
  void set_lr(const double value) override { lr = value; }
  double lr;
};

struct VelocityState : torch::optim::OptimizerCloneableParamState<VelocityState> {
  torch::Tensor velocity;
};

class VelocitySgd : public torch::optim::Optimizer {
 public:
  VelocitySgd(std::vector<torch::Tensor> params, double lr)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<VelocityOptions>(lr)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups_) {
      const double lr = group.options().get_lr();
      for (auto& param : group.params()) {
        if (!param.grad().defined()) continue;
        auto& slot = state_[param.unsafeGetTensorImpl()];
        if (!slot) {
          auto fresh = std::make_unique<VelocityState>();
          fresh->velocity = torch::zeros_like(param);
          slot = std::move(fresh);
        }
        torch::Tensor& velocity = static_cast<VelocityState&>(*slot).velocity;
        velocity.mul_(0.9).add_(param.grad());
        param.add_(velocity, -lr);
      }
    }
    return {};
  }
};

class VelocityOptimizer : public trainyard::Optimizer {
 public:
  double learning_rate() const override { return 0.1; }
  std::unique_ptr<torch::optim::Optimizer> create(std::vector<torch::Tensor> params) override {
    return std::make_unique<VelocitySgd>(std::move(params), learning_rate());
  }
  // The state-key contract (optimizer.hpp): <prefix>param.<index>.<field>.
  void save_state(const torch::optim::Optimizer& optimizer, const std::string& prefix,
                  StateDict& out) const override {
    std::size_t index = 0;
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& param : group.params()) {
        auto it = optimizer.state().find(param.unsafeGetTensorImpl());
        if (it != optimizer.state().end()) {
          out.tensors[prefix + "param." + std::to_string(index) + ".velocity"] =
              static_cast<const VelocityState&>(*it->second).velocity.clone();
        }
        ++index;
      }
    }
  }
  void load_state(torch::optim::Optimizer&, const std::string&, const StateDict&) const override {}
};

std::string first_line(const std::exception& error) {
  std::string message = error.what();
  return message.substr(0, message.find('\n'));
}

class StrategyConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (const auto& [kind, name] : std::vector<std::pair<std::string, std::string>>{
             {"model", "mlp"}, {"optimizer", "sgd"}, {"precision", "fp32"}, {"device", "cpu"}}) {
      if (!conformance::registry().contains(kind, name)) {
        TRAINYARD_SKIP_MISSING() << "needs the bundled " << kind << " '" << name << "'";
      }
    }
  }

  static BuildContext build_context() {
    BuildContext context = conformance::classification_context(kShape, kClasses);
    context.seed = 77;
    return context;
  }

  // A strategy set up on a freshly seeded mlp (the same initial parameters every time), in one
  // process, or as one rank of `communicator`'s job.
  std::shared_ptr<Strategy> make(std::int64_t accumulation = 1, double momentum = 0.0,
                                 PhaseClock* phases = nullptr,
                                 std::shared_ptr<Communicator> communicator = nullptr) {
    auto& registry = conformance::registry();
    StrategyContext context;
    context.build = build_context();
    if (communicator) {
      context.build.rank = communicator->rank();
      context.build.world_size = communicator->world_size();
      context.build.communicator = communicator;
      context.build.mesh = std::make_shared<ProcessMesh>(*communicator);
      context.communicator = communicator;
    }
    context.make_model = [&registry](const BuildContext& build) {
      // Ranks running as threads share the global generator: each draws its model right after
      // seeding it, one at a time.
      static std::mutex drawing;
      std::lock_guard<std::mutex> lock(drawing);
      torch::manual_seed(build_context().seed);
      auto options = std::make_shared<Table>();
      options->set("hidden", Value(Array{Value(16)}));
      return registry.create<Model>("mlp", conformance::section("model", options), build);
    };
    auto optimizer_options = std::make_shared<Table>();
    optimizer_options->set("lr", Value(0.1));
    if (momentum > 0) optimizer_options->set("momentum", Value(momentum));
    context.optimizer =
        optimizer_
            ? optimizer_
            : registry.create<Optimizer>(
                  "sgd", conformance::section("optimizer", optimizer_options), context.build);
    context.precision =
        registry.create<Precision>("fp32", conformance::section("precision"), context.build);
    context.device_backend =
        registry.create<DeviceBackend>("cpu", conformance::section("device"), context.build);
    context.step.accumulation = accumulation;
    context.phases = phases;
    auto strategy =
        registry.create<Strategy>(GetParam(), conformance::under_test("strategy"), context.build);
    strategy->setup(context);
    return strategy;
  }

  // The optimizer make() sets strategies up with; the bundled sgd when null.
  std::shared_ptr<Optimizer> optimizer_;

  template <class Result>
  std::vector<Result> run_ranks(const std::function<Result(const CommunicatorPtr&)>& body) {
    return conformance::run_gloo_ranks<Result>(kRanks, body);
  }

  // Why this strategy is left out of the two-rank checks, nullopt when it takes part: found by
  // setting it up on two ranks, where it must either refuse or split the data between them.
  std::optional<std::string> why_not_multi_rank() {
    if (!conformance::registry().contains("comm", "gloo")) {
      return "the two-rank checks need the bundled comm 'gloo'";
    }
    static std::map<std::string, std::optional<std::string>> reasons;
    auto known = reasons.find(GetParam());
    if (known != reasons.end()) return known->second;
    auto places = run_ranks<std::string>([&](const CommunicatorPtr& communicator) {
      try {
        const DataParallelPlace place = make(1, 0.0, nullptr, communicator)->data_parallel_place();
        if (place.size == kRanks) return std::string();
        return "on " + std::to_string(kRanks) + " ranks it reports a data-parallel size of " +
               std::to_string(place.size) + ", so each rank would train alone";
      } catch (const std::exception& error) {
        return "its setup refuses " + std::to_string(kRanks) + " ranks: " + first_line(error);
      }
    });
    std::optional<std::string> reason;
    for (const auto& place : places) {
      if (!place.empty())
        reason = "strategy '" + GetParam() + "' takes no part in multi-rank runs: " + place;
    }
    reasons[GetParam()] = reason;
    return reason;
  }

  // Drawn from its own generator, so ranks running as threads draw the same batches.
  static Batch make_batch(std::int64_t size, std::uint64_t seed) {
    at::Generator generator = at::detail::createCPUGenerator(seed);
    Batch batch;
    batch.size = size;
    std::vector<std::int64_t> shape = {size};
    shape.insert(shape.end(), kShape.begin(), kShape.end());
    batch.tensors["input"] = at::randn(shape, generator);
    batch.tensors["target"] = at::randint(kClasses, {size}, generator, at::kLong);
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
    for (const auto& [name, tensor] : strategy.full_parameters())
      out[name] = tensor.detach().clone();
    return out;
  }

  static void expect_bitwise_equal(const TensorMap& a, const TensorMap& b,
                                   const std::string& what) {
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
  // Counts every allocation of this thread from before the strategy exists: what is still live
  // after the step is what the strategy holds, measured independently of held_bytes.
  AllocationTracker tracker;
  auto strategy = make(1, /*momentum=*/0.9);
  std::int64_t full = 0;
  for (const auto& [name, tensor] : strategy->full_parameters()) full += tensor.nbytes();
  ASSERT_GT(full, 0);
  step(*strategy, make_batch(kBatch, 1));
  const HeldBytes held = strategy->held_bytes();
  // One process holds every parameter, a gradient for each and SGD's momentum buffer for each;
  // flat buffers (buckets, padded shards) may add up to as much again.
  for (const auto& [what, bytes] :
       {std::pair{"parameters", held.parameters}, std::pair{"gradients", held.gradients},
        std::pair{"optimizer state", held.optimizer_state}}) {
    EXPECT_GE(bytes, full) << what;
    EXPECT_LE(bytes, 2 * full) << what;
  }
  EXPECT_EQ(held.total(), held.parameters + held.gradients + held.optimizer_state);
  const auto live = static_cast<double>(tracker.current_bytes());
  EXPECT_NEAR(static_cast<double>(held.total()), live, 0.01 * live)
      << "held_bytes says " << held.total() << ", the allocator counts " << live << " live bytes";
}

// An optimizer plugin's own state type counts in held_bytes like LibTorch's: through the
// plugin's state entries.
TEST_P(StrategyConformance, HeldBytesCountOptimizerStateOnlyThePluginKnows) {
  AllocationTracker tracker;
  optimizer_ = std::make_shared<VelocityOptimizer>();
  auto strategy = make(1);
  std::int64_t full = 0;
  for (const auto& [name, tensor] : strategy->full_parameters()) full += tensor.nbytes();
  step(*strategy, make_batch(kBatch, 1));
  const HeldBytes held = strategy->held_bytes();
  // A velocity for each parameter (a sharded strategy may hold padded shards of them).
  EXPECT_GE(held.optimizer_state, full);
  EXPECT_LE(held.optimizer_state, 2 * full);
  const auto live = static_cast<double>(tracker.current_bytes());
  EXPECT_NEAR(static_cast<double>(held.total()), live, 0.01 * live)
      << "held_bytes says " << held.total() << ", the allocator counts " << live << " live bytes";
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
  auto model =
      registry.create<Model>("mlp", conformance::section("model", options), build_context());
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

TEST_P(StrategyConformance, TwoRanksLowerTheLossOnFixedBatches) {
  if (auto reason = why_not_multi_rank()) GTEST_SKIP() << *reason;
  auto losses = run_ranks<std::pair<double, double>>([&](const CommunicatorPtr& communicator) {
    auto strategy = make(1, 0.0, nullptr, communicator);
    const Batch batch = make_batch(kBatch, 1 + static_cast<std::uint64_t>(communicator->rank()));
    StepResult first = step(*strategy, batch);
    EXPECT_EQ(first.samples, kBatch) << "samples of this rank's batch";
    double last = first.loss.item<double>();
    for (int i = 0; i < 15; ++i) last = step(*strategy, batch).loss.item<double>();
    return std::pair{first.loss.item<double>(), last};
  });
  const double initial = (losses[0].first + losses[1].first) / 2;
  const double last = (losses[0].second + losses[1].second) / 2;
  EXPECT_TRUE(std::isfinite(initial));
  EXPECT_LT(last, initial * 0.9) << "15 sgd steps at lr 0.1 on two ranks must lower their loss";
}

TEST_P(StrategyConformance, TwoRanksOnHalfBatchesMatchOneProcessOnTheWholeBatch) {
  if (auto reason = why_not_multi_rank()) GTEST_SKIP() << *reason;
  constexpr int kSteps = 3;
  auto whole = make(1, /*momentum=*/0.9);
  std::vector<double> whole_losses;
  for (int i = 0; i < kSteps; ++i) {
    whole_losses.push_back(
        step(*whole, concat(make_batch(kBatch, 300 + i), make_batch(kBatch, 400 + i)))
            .loss.item<double>());
  }
  const TensorMap expected = snapshot(*whole);

  struct RankRun {
    std::vector<double> losses;
    TensorMap parameters;
  };
  auto runs = run_ranks<RankRun>([&](const CommunicatorPtr& communicator) {
    auto strategy = make(1, 0.9, nullptr, communicator);
    RankRun run;
    for (int i = 0; i < kSteps; ++i) {
      const std::uint64_t seed = (communicator->rank() == 0 ? 300 : 400) + i;
      StepResult result = step(*strategy, make_batch(kBatch, seed));
      EXPECT_EQ(result.samples, kBatch);
      run.losses.push_back(result.loss.item<double>());
    }
    run.parameters = snapshot(*strategy);  // collective for a sharded strategy
    return run;
  });
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_NEAR((runs[0].losses[i] + runs[1].losses[i]) / 2, whole_losses[i], 1e-5)
        << "step " << i << ": the ranks' mean loss must be the whole batch's";
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    const TensorMap& got = runs[static_cast<std::size_t>(rank)].parameters;
    ASSERT_EQ(got.size(), expected.size()) << "rank " << rank;
    for (const auto& [name, tensor] : expected) {
      ASSERT_TRUE(got.count(name)) << "rank " << rank << ": '" << name << "'";
      EXPECT_TRUE(torch::allclose(got.at(name).cpu(), tensor.cpu(), 1.3e-6, 1e-5))
          << "rank " << rank << ": '" << name << "' max diff "
          << (got.at(name).cpu() - tensor.cpu()).abs().max().item<double>();
    }
  }
  expect_bitwise_equal(runs[0].parameters, runs[1].parameters,
                       "full_parameters of rank 1 against rank 0");
}

TEST_P(StrategyConformance, TwoRankEvalStepLeavesParametersUnchanged) {
  if (auto reason = why_not_multi_rank()) GTEST_SKIP() << *reason;
  run_ranks<bool>([&](const CommunicatorPtr& communicator) {
    const int rank = communicator->rank();
    const std::string label = "rank " + std::to_string(rank);
    auto evaluated = make(1, 0.0, nullptr, communicator);
    auto reference = make(1, 0.0, nullptr, communicator);
    const Batch first = make_batch(kBatch, 10 + static_cast<std::uint64_t>(rank));
    step(*evaluated, first);
    step(*reference, first);
    TensorMap before = snapshot(*evaluated);
    EvalResult result =
        evaluated->eval_step(make_batch(kBatch, 20 + static_cast<std::uint64_t>(rank)));
    expect_bitwise_equal(before, snapshot(*evaluated), label + ": after eval_step");
    EXPECT_EQ(result.samples, kBatch) << label;
    if (result.loss_sum.defined()) {
      EXPECT_TRUE(std::isfinite(result.loss_sum.item<double>())) << label;
    } else {
      ADD_FAILURE() << label << ": no eval loss";
    }
    // Training after an evaluation is the same as training without one.
    const Batch next = make_batch(kBatch, 30 + static_cast<std::uint64_t>(rank));
    step(*evaluated, next);
    step(*reference, next);
    expect_bitwise_equal(snapshot(*evaluated), snapshot(*reference), label + ": train after eval");
    return true;
  });
}

TEST_P(StrategyConformance, TwoRankStateRoundTripResumesBitForBit) {
  if (auto reason = why_not_multi_rank()) GTEST_SKIP() << *reason;
  // As in a checkpoint: every rank loads rank 0's shared entries and its own local ones.
  std::promise<StateDict> rank0_shared;
  std::shared_future<StateDict> shared = rank0_shared.get_future().share();
  run_ranks<bool>([&](const CommunicatorPtr& communicator) {
    const int rank = communicator->rank();
    const std::string label = "rank " + std::to_string(rank);
    auto seed = [rank](std::uint64_t base) { return base + 10 * static_cast<std::uint64_t>(rank); };
    auto original = make(1, /*momentum=*/0.9, nullptr, communicator);
    for (int i = 0; i < 3; ++i) step(*original, make_batch(kBatch, seed(100 + i)));
    CheckpointState saved;
    original->save_state(saved);
    if (rank == 0) rank0_shared.set_value(saved.shared);

    // A strategy with other parameters and optimizer state: the loaded state must replace them.
    auto resumed = make(1, 0.9, nullptr, communicator);
    step(*resumed, make_batch(kBatch, seed(900)));
    CheckpointState loaded;
    loaded.shared = shared.get();
    loaded.local = saved.local;
    resumed->load_state(loaded);
    expect_bitwise_equal(snapshot(*original), snapshot(*resumed), label + ": after load_state");

    for (int i = 0; i < 2; ++i) {
      const Batch batch = make_batch(kBatch, seed(500 + i));
      StepResult a = step(*original, batch);
      StepResult b = step(*resumed, batch);
      EXPECT_EQ(a.loss.item<double>(), b.loss.item<double>()) << label << ", step " << i;
    }
    expect_bitwise_equal(snapshot(*original), snapshot(*resumed), label + ": after resumed steps");
    return true;
  });
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(StrategyConformance, "strategy");
