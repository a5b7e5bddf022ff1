// Tensors saved in pieces under one layout and read back whole, as boxes or as flat ranges under
// another.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_support.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/placed_state.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"

namespace trainyard {
namespace {

at::Tensor numbered(std::vector<std::int64_t> shape) {
  std::int64_t count = 1;
  for (auto size : shape) count *= size;
  return at::arange(count, at::TensorOptions(at::kFloat)).view(shape);
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(PlacedState, PlacementsRoundTripThroughTheirText) {
  TensorPlacement box = TensorPlacement::box({4, 6}, {2, 0});
  box.replicas = "dp";
  EXPECT_EQ(box.encode(), "global=4,6;box=2,0;replicas=dp");
  const TensorPlacement read = TensorPlacement::decode(box.encode());
  EXPECT_EQ(read.global_shape, box.global_shape);
  EXPECT_EQ(read.offsets, box.offsets);
  EXPECT_EQ(read.flat_offset, -1);
  EXPECT_EQ(read.replicas, "dp");
  EXPECT_EQ(TensorPlacement::decode("global=10;flat=8").flat_offset, 8);
  EXPECT_EQ(TensorPlacement::whole({}).encode(), "global=;box=");
  for (const char* bad : {"", "global=4", "box=0", "global=4;box=x", "global=4;flat=-1",
                          "global=4;box=0;colour=red", "global=4;flat=1,2"}) {
    EXPECT_THROW(TensorPlacement::decode(bad), Error) << bad;
  }
}

// Rows split over two saved ranks (tensor parallel), read whole, as another split, and flat.
TEST(PlacedState, BoxesFromEverySavedRankAssembleTheWholeTensor) {
  const at::Tensor weight = numbered({4, 6});
  CheckpointState state;
  for (int rank = 0; rank < 2; ++rank) {
    StateDict own;
    put_piece(own, "model.w", weight.narrow(0, 2 * rank, 2).clone(),
              TensorPlacement::box({4, 6}, {2 * rank, 0}));
    for (auto& [name, tensor] : own.tensors)
      state.local.tensors[saved_rank_key(rank, name)] = tensor;
    for (auto& [key, text] : own.metadata) state.local.metadata[saved_rank_key(rank, key)] = text;
  }
  state.shared.tensors["model.b"] = numbered({6});
  const PlacedState placed(state);
  EXPECT_EQ(placed.names("model."), (std::vector<std::string>{"model.b", "model.w"}));
  EXPECT_EQ(placed.global_shape("model.w"), (std::vector<std::int64_t>{4, 6}));
  EXPECT_TRUE(at::equal(placed.whole("model.w"), weight));
  EXPECT_TRUE(at::equal(placed.whole("model.b"), numbered({6})));
  // Columns instead of rows: a layout the checkpoint was not written in.
  EXPECT_TRUE(at::equal(placed.box("model.w", {0, 3}, {4, 3}), weight.narrow(1, 3, 3)));
  EXPECT_TRUE(at::equal(placed.flat_range("model.w", 5, 10), weight.flatten().narrow(0, 5, 10)));
}

// Flat shards padded past the end (fsdp), read back as boxes and with the padding as zeros.
TEST(PlacedState, FlatShardsWithPaddingAssembleAndReslice) {
  const at::Tensor weight = numbered({2, 5});
  CheckpointState state;
  at::Tensor padded = at::cat({weight.flatten(), at::zeros({2})});
  for (int rank = 0; rank < 3; ++rank) {
    const std::string key = saved_rank_key(rank, "model.w");
    state.local.tensors[key] = padded.narrow(0, 4 * rank, 4).clone();
    state.local.metadata[saved_rank_key(rank, placement_key("model.w"))] =
        TensorPlacement::flat({2, 5}, 4 * rank).encode();
  }
  const PlacedState placed(state);
  EXPECT_TRUE(at::equal(placed.whole("model.w"), weight));
  EXPECT_TRUE(at::equal(placed.box("model.w", {1, 0}, {1, 5}), weight.narrow(0, 1, 1)));
  EXPECT_TRUE(at::equal(placed.flat_range("model.w", 6, 6), padded.narrow(0, 6, 6)));
}

TEST(PlacedState, MissingPiecesAndMisfitsAreNamedErrors) {
  CheckpointState state;
  put_piece(state.local, "model.w", numbered({2, 6}), TensorPlacement::box({4, 6}, {0, 0}));
  const PlacedState placed(state);
  EXPECT_HAS(error_of([&] { placed.whole("model.w"); }),
             "checkpoint tensor 'model.w' is incomplete: its pieces leave 12 of 24 requested "
             "elements uncovered");
  // This rank's own part is there: reading only it needs no other rank's files.
  EXPECT_TRUE(at::equal(placed.box("model.w", {0, 0}, {2, 6}), numbered({2, 6})));
  EXPECT_TRUE(at::equal(placed.flat_range("model.w", 0, 12), numbered({12})));
  EXPECT_HAS(error_of([&] { placed.flat_range("model.w", 6, 12); }),
             "leave 6 of 12 requested elements uncovered");
  EXPECT_HAS(error_of([&] { placed.whole("model.v"); }), "checkpoint has no tensor 'model.v'");
  StateDict out;
  EXPECT_HAS(error_of([&] {
               put_piece(out, "model.w", numbered({3, 6}), TensorPlacement::box({4, 6}, {2, 0}));
             }),
             "does not fit its placement global=4,6;box=2,0: dimension 0 overruns");
  CheckpointState disagreeing;
  put_piece(disagreeing.local, "model.w", numbered({2, 6}), TensorPlacement::box({4, 6}, {0, 0}));
  disagreeing.shared.tensors["model.w"] = numbered({4, 7});
  EXPECT_HAS(error_of([&] { PlacedState(disagreeing).whole("model.w"); }),
             "pieces disagree on its shape");
}

}  // namespace
}  // namespace trainyard
