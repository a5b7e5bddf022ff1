// Optimizer conformance: it minimises a quadratic, honours the learning rate, and its state
// round-trips through save_state/load_state bit for bit.

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <map>

#include "conformance.hpp"
#include "trainyard/api/optimizer.hpp"

namespace {

using namespace trainyard;

class OptimizerConformance : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<Optimizer> build(std::shared_ptr<Table> options = {}) {
    return conformance::registry().create<Optimizer>(
        GetParam(), conformance::under_test("optimizer", std::move(options)),
        conformance::classification_context());
  }

  // Option sets to try: the defaults, plus momentum when the optimizer has it (so that there is
  // per-parameter state to save); each of them on every update path when the optimizer offers a
  // choice (`implementation`, as the bundled optimizers do).
  std::vector<std::pair<std::string, std::shared_ptr<Table>>> variants() {
    std::vector<std::pair<std::string, std::shared_ptr<Table>>> base = {{"defaults", nullptr}};
    if (conformance::has_option("optimizer", GetParam(), "momentum")) {
      auto table = std::make_shared<Table>();
      table->set("momentum", Value(0.9));
      base.emplace_back("momentum=0.9", table);
    }
    if (!conformance::has_option("optimizer", GetParam(), "implementation")) return base;
    std::vector<std::pair<std::string, std::shared_ptr<Table>>> out;
    for (const auto& [label, options] : base) {
      for (const char* path : {"auto", "single", "foreach", "fused"}) {
        auto table = std::make_shared<Table>();
        if (options) *table = *options;
        table->set("implementation", Value(std::string(path)));
        out.emplace_back(label + ", implementation=" + path, table);
      }
    }
    return out;
  }
};

// Parameters of two shapes and their targets.
struct Problem {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> targets;

  static Problem make() {
    torch::manual_seed(3);
    Problem p;
    p.params = {torch::randn({5}).requires_grad_(), torch::randn({2, 3}).requires_grad_()};
    p.targets = {torch::randn({5}), torch::randn({2, 3})};
    return p;
  }
  Problem clone() const {
    Problem p;
    for (const auto& t : params) p.params.push_back(t.detach().clone().requires_grad_());
    p.targets = targets;
    return p;
  }
  torch::Tensor loss() const {
    torch::Tensor total = torch::zeros({});
    for (std::size_t i = 0; i < params.size(); ++i) {
      total = total + (params[i] - targets[i]).pow(2).sum();
    }
    return total;
  }
  double step(torch::optim::Optimizer& optimizer) const {
    optimizer.zero_grad();
    torch::Tensor value = loss();
    value.backward();
    optimizer.step();
    return value.item<double>();
  }
};

TEST_P(OptimizerConformance, LearningRateIsPositiveAndApplied) {
  for (const auto& [label, options] : variants()) {
    SCOPED_TRACE(label);
    auto optimizer = build(options);
    const double lr = optimizer->learning_rate();
    EXPECT_GT(lr, 0);
    EXPECT_TRUE(std::isfinite(lr));
    Problem problem = Problem::make();
    auto torch_optimizer = optimizer->create(problem.params);
    ASSERT_NE(torch_optimizer, nullptr);
    ASSERT_FALSE(torch_optimizer->param_groups().empty());
    std::size_t count = 0;
    for (auto& group : torch_optimizer->param_groups()) {
      EXPECT_DOUBLE_EQ(group.options().get_lr(), lr) << "groups must start at learning_rate()";
      count += group.params().size();
    }
    EXPECT_EQ(count, problem.params.size()) << "create() must optimise every tensor it is given";
  }
}

TEST_P(OptimizerConformance, FiftyStepsReduceAQuadratic) {
  for (const auto& [label, options] : variants()) {
    auto optimizer = build(options);
    Problem problem = Problem::make();
    auto torch_optimizer = optimizer->create(problem.params);
    const double initial = problem.loss().item<double>();
    for (int i = 0; i < 50; ++i) problem.step(*torch_optimizer);
    const double final_loss = problem.loss().item<double>();
    EXPECT_TRUE(std::isfinite(final_loss)) << label;
    EXPECT_LT(final_loss, initial) << label;
  }
}

TEST_P(OptimizerConformance, SetLearningRateChangesTheStep) {
  for (const auto& [label, options] : variants()) {
    SCOPED_TRACE(label);
    auto optimizer = build(options);
    Problem base = Problem::make();
    Problem a = base.clone();
    Problem b = base.clone();
    auto opt_a = optimizer->create(a.params);
    auto opt_b = optimizer->create(b.params);
    set_learning_rate(*opt_b, optimizer->learning_rate() * 4);
    for (auto& group : opt_b->param_groups()) {
      EXPECT_DOUBLE_EQ(group.options().get_lr(), optimizer->learning_rate() * 4);
    }
    a.step(*opt_a);
    b.step(*opt_b);
    double moved_a = 0, moved_b = 0;
    for (std::size_t i = 0; i < base.params.size(); ++i) {
      moved_a += (a.params[i] - base.params[i]).abs().sum().item<double>();
      moved_b += (b.params[i] - base.params[i]).abs().sum().item<double>();
    }
    EXPECT_GT(moved_a, 0);
    EXPECT_GT(moved_b, moved_a * 1.5) << "a 4x learning rate must take a larger step";

    // Setting it to zero stops the first step entirely.
    Problem c = base.clone();
    auto opt_c = optimizer->create(c.params);
    set_learning_rate(*opt_c, 0.0);
    c.step(*opt_c);
    for (std::size_t i = 0; i < base.params.size(); ++i) {
      EXPECT_TRUE(at::equal(c.params[i], base.params[i])) << "lr 0 moved parameter " << i;
    }
  }
}

TEST_P(OptimizerConformance, StateRoundTripContinuesBitForBit) {
  for (const auto& [label, options] : variants()) {
    auto optimizer = build(options);
    Problem original = Problem::make();
    auto opt = optimizer->create(original.params);
    for (int i = 0; i < 3; ++i) original.step(*opt);

    StateDict saved;
    optimizer->save_state(*opt, "optimizer.", saved);
    for (const auto& [key, tensor] : saved.tensors) {
      EXPECT_EQ(key.rfind("optimizer.", 0), 0u)
          << label << ": key '" << key << "' lacks the prefix";
      EXPECT_TRUE(tensor.defined()) << label << ": " << key;
    }

    Problem resumed = original.clone();
    auto fresh_optimizer = build(options);
    auto fresh = fresh_optimizer->create(resumed.params);
    fresh_optimizer->load_state(*fresh, "optimizer.", saved);
    // The saved tensors are copies: stepping the original must not change them.
    StateDict before_steps;
    for (const auto& [key, tensor] : saved.tensors) before_steps.tensors[key] = tensor.clone();

    for (int i = 0; i < 2; ++i) {
      original.step(*opt);
      resumed.step(*fresh);
    }
    for (std::size_t i = 0; i < original.params.size(); ++i) {
      EXPECT_TRUE(at::equal(original.params[i], resumed.params[i]))
          << label << ": parameter " << i << " differs after resume; max diff "
          << (original.params[i] - resumed.params[i]).abs().max().item<double>();
    }
    for (const auto& [key, tensor] : saved.tensors) {
      EXPECT_TRUE(at::equal(tensor, before_steps.tensors.at(key)))
          << label << ": saved entry '" << key << "' aliases live optimizer state";
    }
  }
}

// The update paths compute the same rule and differ only in rounding: after twenty steps their
// parameters agree to float32 accuracy (a path that got the rule wrong moves them by far more).
TEST_P(OptimizerConformance, UpdatePathsAgreeUpToRounding) {
  if (!conformance::has_option("optimizer", GetParam(), "implementation")) {
    GTEST_SUCCEED() << "the optimizer offers one update path";
    return;
  }
  std::map<std::string, std::vector<torch::Tensor>> reference;  // by option set
  for (const auto& [label, options] : variants()) {
    const std::string base = label.substr(0, label.find(", implementation="));
    Problem problem = Problem::make();
    auto optimizer = build(options);
    auto torch_optimizer = optimizer->create(problem.params);
    for (int i = 0; i < 20; ++i) problem.step(*torch_optimizer);
    auto [it, first] = reference.emplace(base, problem.params);
    if (first) continue;
    for (std::size_t i = 0; i < problem.params.size(); ++i) {
      EXPECT_TRUE(at::allclose(problem.params[i], it->second[i], 1e-5, 1e-6))
          << label << ": parameter " << i << " differs from the first path's by "
          << (problem.params[i] - it->second[i]).abs().max().item<double>();
    }
  }
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(OptimizerConformance, "optimizer");
