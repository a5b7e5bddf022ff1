// Parameters and optimizer state saved under one layout (flat shards over ranks, boxes, whole
// replicas) and loaded under another continue training exactly.

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "test_support.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"

namespace trainyard {
namespace {

// The SDK's default state conversion (LibTorch's AdamW).
class PlainAdamW : public Optimizer {
 public:
  double learning_rate() const override { return 0.1; }
  std::unique_ptr<torch::optim::Optimizer> create(std::vector<torch::Tensor> params) override {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.1));
  }
};

const std::vector<std::string> kNames = {"a", "b"};
const std::vector<std::vector<std::int64_t>> kShapes = {{3, 4}, {5}};

// Deterministic gradients for step `step` of the whole parameters, flattened and concatenated.
at::Tensor flat_gradient(int step) {
  return at::sin(at::arange(17, at::TensorOptions(at::kFloat)) * (step + 1));
}
at::Tensor initial_flat() { return at::cos(at::arange(17, at::TensorOptions(at::kFloat))); }

// Training the parameters as whole tensors, one optimizer over both.
struct Whole {
  std::vector<at::Tensor> parameters;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  PlainAdamW plugin;
  explicit Whole(const at::Tensor& flat) {
    parameters = {flat.narrow(0, 0, 12).view({3, 4}).clone().requires_grad_(),
                  flat.narrow(0, 12, 5).clone().requires_grad_()};
    optimizer = plugin.create(parameters);
  }
  void step(int number) {
    at::Tensor gradient = flat_gradient(number);
    parameters[0].mutable_grad() = gradient.narrow(0, 0, 12).view({3, 4}).clone();
    parameters[1].mutable_grad() = gradient.narrow(0, 12, 5).clone();
    optimizer->step();
  }
  std::vector<HeldLayout> layouts() const {
    return {whole_parameter_layout("a", {3, 4}), whole_parameter_layout("b", {5})};
  }
  at::Tensor flat() const {
    return at::cat({parameters[0].detach().reshape({-1}), parameters[1].detach().reshape({-1})});
  }
};

// The same parameters as two ranks' flat shards of 9 elements (the last one padded), each rank
// with its own optimizer, as fsdp keeps them.
struct Shards {
  std::vector<at::Tensor> shards;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;
  PlainAdamW plugin;
  explicit Shards(const at::Tensor& flat) {
    at::Tensor padded = at::cat({flat, at::zeros({1})});
    for (int rank = 0; rank < 2; ++rank) {
      shards.push_back(padded.narrow(0, 9 * rank, 9).clone().requires_grad_());
      optimizers.push_back(plugin.create({shards.back()}));
    }
  }
  void step(int number) {
    at::Tensor padded = at::cat({flat_gradient(number), at::zeros({1})});
    for (int rank = 0; rank < 2; ++rank) {
      shards[static_cast<std::size_t>(rank)].mutable_grad() = padded.narrow(0, 9 * rank, 9).clone();
      optimizers[static_cast<std::size_t>(rank)]->step();
    }
  }
  HeldLayout layout(int rank) const { return flat_shard_layout(kNames, kShapes, 9 * rank, 9); }
  at::Tensor flat() const {
    return at::cat({shards[0].detach(), shards[1].detach()}).narrow(0, 0, 17);
  }
};

// Each saved rank's entries as the checkpoint store hands them over for resharding.
void add_saved_rank(CheckpointState& state, int rank, const StateDict& own) {
  for (const auto& [name, tensor] : own.tensors)
    state.local.tensors[saved_rank_key(rank, name)] = tensor;
  for (const auto& [key, text] : own.metadata)
    state.local.metadata[saved_rank_key(rank, key)] = text;
}

TEST(ParameterPieces, FlatShardLayoutSplitsAtParameterBoundaries) {
  const HeldLayout first = flat_shard_layout(kNames, kShapes, 0, 9);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].name, "a");
  EXPECT_EQ(first[0].length, 9);
  const HeldLayout second = flat_shard_layout(kNames, kShapes, 9, 9);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].placement.encode(), "global=3,4;flat=9");
  EXPECT_EQ(second[0].length, 3);
  EXPECT_EQ(second[1].name, "b");
  EXPECT_EQ(second[1].offset, 3);
  EXPECT_EQ(second[1].length, 5);  // the ninth element is padding
}

TEST(ParameterPieces, ShardsSavedOnTwoRanksResumeAsWholeParametersExactly) {
  Shards shards(initial_flat());
  Whole reference(initial_flat());
  for (int step = 0; step < 3; ++step) {
    shards.step(step);
    reference.step(step);
  }
  CheckpointState state;
  for (int rank = 0; rank < 2; ++rank) {
    StateDict own;
    put_held_pieces(own, "model.", shards.shards[static_cast<std::size_t>(rank)],
                    shards.layout(rank));
    save_optimizer_pieces(shards.plugin, *shards.optimizers[static_cast<std::size_t>(rank)],
                          {shards.layout(rank)}, own, state.shared);
    add_saved_rank(state, rank, own);
  }
  const PlacedState placed(state);
  Whole resumed(at::zeros({17}));
  const auto layouts = resumed.layouts();
  for (std::size_t i = 0; i < 2; ++i) {
    read_held_pieces(placed, "model.", layouts[i], resumed.parameters[i]);
  }
  load_optimizer_pieces(resumed.plugin, *resumed.optimizer, layouts, placed);
  EXPECT_TRUE(at::equal(resumed.flat(), reference.flat()));
  for (int step = 3; step < 5; ++step) {
    resumed.step(step);
    reference.step(step);
  }
  EXPECT_TRUE(at::equal(resumed.flat(), reference.flat()))
      << "moments or step counters were not carried over";
}

TEST(ParameterPieces, WholeParametersResumeAsShardsExactly) {
  Whole whole(initial_flat());
  Shards reference(initial_flat());
  for (int step = 0; step < 3; ++step) {
    whole.step(step);
    reference.step(step);
  }
  CheckpointState state;
  put_held_pieces(state.shared, "model.", whole.parameters[0], whole.layouts()[0]);
  put_held_pieces(state.shared, "model.", whole.parameters[1], whole.layouts()[1]);
  save_optimizer_pieces(whole.plugin, *whole.optimizer, whole.layouts(), state.shared,
                        state.shared);
  const PlacedState placed(state);
  Shards resumed(at::zeros({17}));
  for (int rank = 0; rank < 2; ++rank) {
    const auto index = static_cast<std::size_t>(rank);
    read_held_pieces(placed, "model.", resumed.layout(rank), resumed.shards[index]);
    load_optimizer_pieces(resumed.plugin, *resumed.optimizers[index], {resumed.layout(rank)},
                          placed);
  }
  for (int step = 3; step < 5; ++step) {
    resumed.step(step);
    reference.step(step);
  }
  EXPECT_TRUE(at::equal(resumed.flat(), reference.flat()));
}

TEST(ParameterPieces, BoxesOfAParameterReassembleAcrossLayouts) {
  const at::Tensor weight = at::arange(24, at::TensorOptions(at::kFloat)).view({4, 6});
  CheckpointState state;
  for (int rank = 0; rank < 2; ++rank) {
    StateDict own;
    put_held_pieces(own, "model.", weight.narrow(1, 3 * rank, 3),
                    parameter_box_layout("w", {4, 6}, {0, 3 * rank}, {4, 3}), "dp");
    add_saved_rank(state, rank, own);
  }
  const PlacedState placed(state);
  at::Tensor rows = at::zeros({2, 6});
  read_held_pieces(placed, "model.", parameter_box_layout("w", {4, 6}, {2, 0}, {2, 6}), rows);
  EXPECT_TRUE(at::equal(rows, weight.narrow(0, 2, 2)));
  at::Tensor shard = at::zeros({10});
  read_held_pieces(placed, "model.", flat_shard_layout({"w"}, {{4, 6}}, 20, 10), shard);
  EXPECT_TRUE(at::equal(shard.narrow(0, 0, 4), weight.flatten().narrow(0, 20, 4)));
  EXPECT_TRUE(at::equal(shard.narrow(0, 4, 6), at::zeros({6})));
  at::Tensor other_shape = at::zeros({5, 6});
  EXPECT_THROW(read_held_pieces(placed, "model.", whole_parameter_layout("w", {5, 6}), other_shape),
               Error);
}

// fsdp over tensor-parallel pieces: each tp rank holds a column box of a 4 x 6 weight (row
// parallel) and the whole 5-element bias; the two held tensors are flattened together and cut
// into 4 shards whose edges fall inside box rows. Every shard's pieces fit in the whole, the
// shards of both tp ranks assemble the whole tensors, and each shard reads back its own values.
TEST(ParameterPieces, FlatShardsOfTensorParallelBoxesAssembleTheWholeParameters) {
  const at::Tensor weight = at::arange(24, at::kFloat).view({4, 6});
  const at::Tensor bias = at::arange(100, 105, at::kFloat);
  CheckpointState state;
  int saved_rank = 0;
  std::vector<std::pair<HeldLayout, at::Tensor>> shards;
  for (int tp = 0; tp < 2; ++tp) {
    const std::vector<HeldLayout> layouts = {
        parameter_box_layout("w", {4, 6}, {0, 3 * tp}, {4, 3}),
        whole_parameter_layout("b", {5})};
    const at::Tensor flat = at::cat({weight.narrow(1, 3 * tp, 3).flatten(), bias,
                                     at::zeros({3})});  // 17 elements padded to 20
    for (int shard = 0; shard < 4; ++shard) {
      const HeldLayout layout = flat_shard_layout(layouts, {12, 5}, 5 * shard, 5);
      for (const ParameterPiece& piece : layout) {
        EXPECT_EQ(piece.length, c10::multiply_integers(piece.shape)) << piece.name;
      }
      StateDict own;
      const at::Tensor held = flat.narrow(0, 5 * shard, 5).clone();
      put_held_pieces(own, "model.", held, layout);
      add_saved_rank(state, saved_rank++, own);
      shards.emplace_back(layout, held);
    }
  }
  // Shard 0 of tp rank 1: row 0 of its box and the first two columns of row 1.
  const HeldLayout first = shards[4].first;
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].placement.encode(), "global=4,6;box=0,3");
  EXPECT_EQ(first[0].shape, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(first[1].placement.encode(), "global=4,6;box=1,3");
  EXPECT_EQ(first[1].shape, (std::vector<std::int64_t>{1, 2}));
  const PlacedState placed(state);
  EXPECT_TRUE(at::equal(placed.whole("model.w"), weight));
  EXPECT_TRUE(at::equal(placed.whole("model.b"), bias));
  for (const auto& [layout, held] : shards) {
    at::Tensor read = at::full({5}, -1.0f);
    read_held_pieces(placed, "model.", layout, read);
    EXPECT_TRUE(at::equal(read, held));
  }
}

// A run that starts and ends inside rows of a 3-D box is covered by boxes, outermost first.
TEST(ParameterPieces, FlatRunOfABoxIsCoveredByFewContiguousBoxes) {
  const HeldLayout box = parameter_box_layout("t", {2, 4, 6}, {0, 0, 2}, {2, 4, 3});
  const HeldLayout layout = flat_shard_layout({box}, {24}, 2, 20);  // box elements [2, 22)
  std::vector<std::string> placements;
  std::int64_t covered = 0;
  for (const ParameterPiece& piece : layout) {
    placements.push_back(piece.placement.encode());
    EXPECT_EQ(piece.offset, covered);
    covered += piece.length;
  }
  EXPECT_EQ(covered, 20);
  EXPECT_EQ(placements, (std::vector<std::string>{
                            "global=2,4,6;box=0,0,4", "global=2,4,6;box=0,1,2",
                            "global=2,4,6;box=1,0,2", "global=2,4,6;box=1,3,2"}));
}

// A module held whole on every data-parallel rank: each entry records its replica group, and
// the state loads back into a fresh module and optimizer.
TEST(ParameterPieces, WholeModuleStateRecordsItsReplicasAndLoadsBack) {
  at::manual_seed(2);
  torch::nn::Linear trained(3, 2);
  PlainAdamW plugin;
  auto optimizer = plugin.create(trained->parameters());
  trained->weight.mutable_grad() = at::ones({2, 3});
  trained->bias.mutable_grad() = at::ones({2});
  optimizer->step();
  CheckpointState state;
  save_whole_module_state(*trained, plugin, optimizer.get(), state.shared, "dp");
  EXPECT_EQ(state.shared.metadata.at(placement_key("model.weight")),
            "global=2,3;box=0,0;replicas=dp");
  EXPECT_EQ(state.shared.metadata.at(placement_key("optimizer.bias.step")),
            "global=;box=;replicas=dp");
  torch::nn::Linear fresh(3, 2);
  auto fresh_optimizer = plugin.create(fresh->parameters());
  load_whole_module_state(*fresh, plugin, fresh_optimizer.get(), PlacedState(state));
  EXPECT_TRUE(at::equal(fresh->weight, trained->weight));
  for (auto* layer : {&trained, &fresh}) {
    (*layer)->weight.mutable_grad() = at::full({2, 3}, 0.5);
    (*layer)->bias.mutable_grad() = at::full({2}, 0.5);
  }
  optimizer->step();
  fresh_optimizer->step();
  EXPECT_TRUE(at::equal(fresh->weight, trained->weight)) << "moments or step were not restored";
  EXPECT_TRUE(at::equal(fresh->bias, trained->bias));
}

}  // namespace
}  // namespace trainyard
