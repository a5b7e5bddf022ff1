#pragma once
// What a strategy holds of each parameter, and its optimizer state, saved as placed pieces of the
// whole model's parameters (placed_state.hpp): "model.<parameter>" and
// "optimizer.<parameter>.<field>". Written under any layout (whole replicas, flat shards of
// several parameters, tensor-parallel boxes), read back under any other.

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainyard/placed_state.hpp"

namespace trainyard {

class Optimizer;

// A run of a held tensor's flat elements, [offset, offset + length), that is one piece of the
// whole parameter `name`, placed as `placement` says.
struct ParameterPiece {
  std::string name;
  std::int64_t offset = 0;
  std::int64_t length = 0;
  TensorPlacement placement;
};
// How one held tensor (a whole parameter, a flat shard, a box) maps onto parameters. Elements in
// no piece are padding.
using HeldLayout = std::vector<ParameterPiece>;

// A held tensor that is the whole parameter `name` of `shape`.
HeldLayout whole_parameter_layout(const std::string& name, const std::vector<std::int64_t>& shape);
// A held tensor that is box `offsets` of parameter `name` (tensor parallel): its own shape is the
// box's extent.
HeldLayout parameter_box_layout(const std::string& name,
                                const std::vector<std::int64_t>& global_shape,
                                const std::vector<std::int64_t>& offsets,
                                const std::vector<std::int64_t>& shape);
// Elements [begin, begin + count) of a flat buffer that concatenates `names` (of `shapes`) in
// order: an fsdp shard or a zero1 slice. Runs past the parameters' end are padding.
HeldLayout flat_shard_layout(const std::vector<std::string>& names,
                             const std::vector<std::vector<std::int64_t>>& shapes,
                             std::int64_t begin, std::int64_t count);

// Puts `held`'s pieces into `out` under "<prefix><parameter>".
void put_held_pieces(StateDict& out, const std::string& prefix, const torch::Tensor& held,
                     const HeldLayout& layout, const std::string& replicas = {});
// Fills `held` (its shape, dtype and device kept) from the checkpoint's "<prefix><parameter>"
// pieces; padding becomes zero. Throws Error naming what is missing.
void read_held_pieces(const PlacedState& state, const std::string& prefix, const HeldLayout& layout,
                      const torch::Tensor& held);

// Optimizer state, where the optimizer's i-th parameter is held tensor i with `layouts[i]`.
// Per-element fields (moments, momentum: one value per element of the held tensor) become pieces
// "optimizer.<parameter>.<field>" in `pieces`; other fields (step counters) are the same for
// every piece and go whole, once per parameter, into `whole`. The plugin's entries must follow
// Optimizer's key contract ("<prefix>param.<i>.<field>").
void save_optimizer_pieces(const Optimizer& plugin, const torch::optim::Optimizer& optimizer,
                           const std::vector<HeldLayout>& layouts, StateDict& pieces,
                           StateDict& whole, const std::string& replicas = {});
// The reverse: builds each held tensor's fields from the checkpoint and hands them to the
// plugin. Parameters without saved state (an optimizer that never stepped) are left without.
void load_optimizer_pieces(const Optimizer& plugin, torch::optim::Optimizer& optimizer,
                           const std::vector<HeldLayout>& layouts, const PlacedState& state);

}  // namespace trainyard
