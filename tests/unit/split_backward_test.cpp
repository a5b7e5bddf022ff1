// SplitBackward: a backward in an input half and a weight half gives the gradients a plain
// backward gives, with every node run for each of its outputs once: a node on the path from the
// loss to the input counts its backward calls, once over both halves, where taking the input
// gradients and then the parameters' from the whole graph (what zero bubble did before) runs it
// twice.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/parallel/split_backward.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"

namespace trainyard::testing {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The identity, counting its backward calls.
struct CountedIdentity : public torch::autograd::Function<CountedIdentity> {
  static inline int calls = 0;
  static at::Tensor forward(AutogradContext* /*context*/, const at::Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext* /*context*/, variable_list grads) {
    ++calls;
    return {grads[0]};
  }
};

struct Graph {
  at::Tensor input;
  std::vector<at::Tensor> parameters;
  at::Tensor loss;
};

// x -> linear(w1) -> counted -> tanh(linear(w2)) -> sum, plus a term of w3 alone and a term
// using w1 again (a parameter with two branches), from fixed values.
Graph build(bool input_requires_grad) {
  at::manual_seed(3);
  Graph graph;
  graph.input = at::randn({4, 6}).requires_grad_(input_requires_grad);
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{5, 6}, {3, 5}, {3}}) {
    graph.parameters.push_back(at::randn(shape).requires_grad_(true));
  }
  const at::Tensor& w1 = graph.parameters[0];
  const at::Tensor& w2 = graph.parameters[1];
  const at::Tensor& w3 = graph.parameters[2];
  at::Tensor hidden = CountedIdentity::apply(at::linear(graph.input, w1));
  at::Tensor out = at::tanh(at::linear(hidden, w2));
  graph.loss = (out * w3).sum() + (w3 * w3).sum() + 0.1 * (w1 * w1).sum();
  return graph;
}

std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> out;
  for (const auto& parameter : parameters) out.push_back(parameter.grad().clone());
  return out;
}

TEST(SplitBackward, GivesThePlainGradientsRunningEachNodeOnce) {
  Graph reference = build(true);
  torch::autograd::backward({reference.loss});
  const at::Tensor expected_input = reference.input.grad().clone();
  const std::vector<at::Tensor> expected = gradients(reference.parameters);

  Graph graph = build(true);
  CountedIdentity::calls = 0;
  SplitBackward split;
  const std::vector<at::Tensor> input_grads =
      split.input_half({graph.loss}, {}, {graph.input}, graph.parameters);
  ASSERT_EQ(input_grads.size(), 1u);
  EXPECT_TRUE(at::allclose(input_grads[0], expected_input));
  EXPECT_EQ(CountedIdentity::calls, 1);
  EXPECT_GT(split.branch_points(), 0u);
  for (const auto& parameter : graph.parameters) {
    EXPECT_FALSE(parameter.grad().defined());  // the input half leaves the weights alone
  }
  split.weight_half();
  EXPECT_EQ(CountedIdentity::calls, 1);  // not run again for the weights
  const std::vector<at::Tensor> actual = gradients(graph.parameters);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(at::allclose(actual[i], expected[i], 1.3e-6, 1e-5)) << "parameter " << i;
  }
  EXPECT_FALSE(graph.input.grad().defined());  // given back, not accumulated
}

// The negative control: the input gradients and then the parameters' from the whole graph run
// the node on the input path twice.
TEST(SplitBackward, TheWholeGraphTwiceRunsTheInputPathAgain) {
  Graph graph = build(true);
  CountedIdentity::calls = 0;
  torch::autograd::grad({graph.loss}, {graph.input}, {}, /*retain_graph=*/true);
  torch::autograd::backward({graph.loss}, {}, /*retain_graph=*/false, /*create_graph=*/false,
                            graph.parameters);
  EXPECT_EQ(CountedIdentity::calls, 2);
}

// With no input that needs a gradient (a first stage), the weight half is the whole backward.
TEST(SplitBackward, WithoutInputGradientsTheWeightHalfIsTheWholeBackward) {
  Graph reference = build(false);
  torch::autograd::backward({reference.loss});
  const std::vector<at::Tensor> expected = gradients(reference.parameters);
  Graph graph = build(false);
  CountedIdentity::calls = 0;
  SplitBackward split;
  const std::vector<at::Tensor> input_grads =
      split.input_half({graph.loss}, {}, {graph.input}, graph.parameters);
  EXPECT_FALSE(input_grads[0].defined());
  EXPECT_EQ(split.branch_points(), 0u);
  EXPECT_EQ(CountedIdentity::calls, 0);
  split.weight_half();
  EXPECT_EQ(CountedIdentity::calls, 1);
  const std::vector<at::Tensor> actual = gradients(graph.parameters);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(at::equal(actual[i], expected[i])) << "parameter " << i;
  }
}

TEST(SplitBackward, EachHalfRunsOnceInOrder) {
  Graph graph = build(true);
  SplitBackward split;
  EXPECT_THROW(split.weight_half(), std::exception);
  split.input_half({graph.loss}, {}, {graph.input}, graph.parameters);
  EXPECT_THROW(split.input_half({graph.loss}, {}, {graph.input}, graph.parameters), std::exception);
  split.weight_half();
  EXPECT_THROW(split.weight_half(), std::exception);
}

// Recomputed blocks (activation checkpointing) each give all their parameters' gradients from
// one node: the weight half accumulates each block's as soon as its node has run, so it holds one
// block's new gradients at a time, not the whole chain's until its end. The gradients are those
// of a plain backward.
TEST(SplitBackward, RecomputedBlocksAccumulateTheirGradientsOneBlockAtATime) {
  constexpr int kBlocks = 4;
  constexpr std::int64_t kWidth = 256;
  at::manual_seed(5);
  std::vector<torch::nn::Linear> layers;
  std::vector<Block> plain;
  for (int i = 0; i < kBlocks; ++i) {
    layers.emplace_back(kWidth, kWidth);
    plain.push_back({"block" + std::to_string(i), layers.back().ptr(),
                     [layer = layers.back()](const Activations& x) mutable {
                       return x.with_hidden(at::tanh(layer->forward(x.hidden())));
                     }});
  }
  const std::vector<Block> blocks =
      with_activation_checkpointing(plain, ActivationCheckpointing::parse("all"));
  std::vector<at::Tensor> parameters;
  for (auto& layer : layers) {
    for (const auto& parameter : layer->parameters()) parameters.push_back(parameter);
  }
  const at::Tensor data = at::randn({8, kWidth});
  const auto loss_of = [&](const at::Tensor& input) {
    Activations x(input);
    for (const auto& block : blocks) x = block.forward(x);
    return x.hidden().pow(2).sum();
  };
  const at::Tensor reference_input = data.clone().requires_grad_(true);
  loss_of(reference_input).backward();
  const std::vector<at::Tensor> expected = gradients(parameters);
  for (auto& parameter : parameters) parameter.mutable_grad() = at::Tensor();

  const at::Tensor input = data.clone().requires_grad_(true);
  SplitBackward split;
  split.input_half({loss_of(input)}, {}, {input}, parameters);
  AllocationTracker tracker;
  split.weight_half();
  const std::int64_t block_gradients =
      static_cast<std::int64_t>((kWidth * kWidth + kWidth) * sizeof(float));
  // What stays is the chain's gradients; at the peak, besides those accumulated, one block's
  // new gradients and its recomputed activations (a few KiB).
  EXPECT_EQ(tracker.current_bytes(), kBlocks * block_gradients);
  EXPECT_LT(tracker.peak_bytes(), tracker.current_bytes() + block_gradients + (64 << 10));
  const std::vector<at::Tensor> actual = gradients(parameters);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(at::equal(actual[i], expected[i])) << "parameter " << i;
  }
}

}  // namespace
}  // namespace trainyard::testing
