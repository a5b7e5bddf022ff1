#pragma once
// What a strategy holds of each parameter, and its optimizer state, saved as placed pieces of the
// whole model's parameters (placed_state.hpp): "model.<parameter>" and
// "optimizer.<parameter>.<field>". Written under any layout (whole replicas, flat shards of
// several parameters, tensor-parallel boxes), read back under any other.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainyard/api/placed_state.hpp"

namespace trainyard {

class Optimizer;

// A run of a held tensor's flat elements, [offset, offset + length), that is one piece of the
// whole parameter `name`, placed as `placement` says, saved with `shape` (a box's extent; the
// run's length for a flat range).
struct ParameterPiece {
  std::string name;
  std::int64_t offset = 0;
  std::int64_t length = 0;
  TensorPlacement placement;
  std::vector<std::int64_t> shape;
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
// order: an fsdp shard or a zero1 slice. Runs past the parameters' end are padding; a run that
// covers a whole parameter is saved whole, in its own shape.
HeldLayout flat_shard_layout(const std::vector<std::string>& names,
                             const std::vector<std::vector<std::int64_t>>& shapes,
                             std::int64_t begin, std::int64_t count);
// The same for a flat buffer that concatenates held tensors (of `numels` elements) that are
// themselves laid out as `layouts` say: whole parameters, or tensor-parallel boxes (fsdp over
// tensor-parallel pieces). A run of a box that is not a box of the whole is saved as the few
// boxes (at most two per dimension) that cover it, each a contiguous run of the buffer.
HeldLayout flat_shard_layout(const std::vector<HeldLayout>& layouts,
                             const std::vector<std::int64_t>& numels, std::int64_t begin,
                             std::int64_t count);

// Puts `held`'s pieces into `out` under "<prefix><parameter>". Pieces are views of `held` (no
// copy), as is every entry the functions below save: see Strategy::save_state.
void put_held_pieces(StateDict& out, const std::string& prefix, const torch::Tensor& held,
                     const HeldLayout& layout, const std::string& replicas = {});
// Fills `held` (its shape, dtype and device kept) from the checkpoint's "<prefix><parameter>"
// pieces; padding becomes zero. Throws Error naming what is missing.
void read_held_pieces(const PlacedState& state, const std::string& prefix, const HeldLayout& layout,
                      const torch::Tensor& held);

// The optimizer's state of each held tensor by field, as the plugin saves it (Optimizer's key
// contract: "<prefix>param.<i>.<field>").
using OptimizerFields = std::vector<std::map<std::string, torch::Tensor>>;
OptimizerFields optimizer_fields(const Optimizer& plugin, const torch::optim::Optimizer& optimizer);
// Puts `fields` as pieces: a field with as many elements as its held tensor (`held_numels`) is
// per element and split along `layouts`; any other is whole, once per parameter.
void put_optimizer_pieces(const OptimizerFields& fields,
                          const std::vector<std::int64_t>& held_numels,
                          const std::vector<HeldLayout>& layouts, StateDict& pieces,
                          StateDict& whole, const std::string& replicas = {});

// Optimizer state, where the optimizer's i-th parameter is held tensor i with `layouts[i]`.
// Per-element fields (moments, momentum: one value per element of the held tensor) become pieces
// "optimizer.<parameter>.<field>" in `pieces`; other fields (step counters) are the same for
// every piece and go whole, once per parameter piece, into `whole` (the rank file that holds the
// pieces, when each rank holds other parameters). The plugin's entries must follow
// Optimizer's key contract ("<prefix>param.<i>.<field>").
void save_optimizer_pieces(const Optimizer& plugin, const torch::optim::Optimizer& optimizer,
                           const std::vector<HeldLayout>& layouts, StateDict& pieces,
                           StateDict& whole, const std::string& replicas = {});
// The reverse: builds each held tensor's fields from the checkpoint and hands them to the
// plugin. Parameters without saved state (an optimizer that never stepped) are left without.
void load_optimizer_pieces(const Optimizer& plugin, torch::optim::Optimizer& optimizer,
                           const std::vector<HeldLayout>& layouts, const PlacedState& state);

// A module held whole on this rank, `optimizer` (when given) stepping module.parameters() in
// order: its parameters, buffers and optimizer state as whole tensors in `shared`, each placed
// with `replicas`, the mesh group whose ranks hold the same copy (one of them writes it).
void save_whole_module_state(const torch::nn::Module& module, const Optimizer& plugin,
                             const torch::optim::Optimizer* optimizer, StateDict& shared,
                             const std::string& replicas = {});
// Loads the parameters and buffers (and the optimizer state, when given) from the pieces any
// layout wrote. Throws Error naming an entry that is missing or has another shape.
void load_whole_module_state(torch::nn::Module& module, const Optimizer& plugin,
                             torch::optim::Optimizer* optimizer, const PlacedState& state);

// Whether `layout` holds its whole parameter (one piece covering it): a copy every
// tensor-parallel rank holds alike, rather than a shard.
bool holds_whole(const HeldLayout& layout);

// A module whose i-th parameter (named_parameters order) is held as `layouts[i]` (a model's
// parameter_layout: whole, or tensor-parallel boxes), `optimizer` (when given) stepping its
// parameters in order: parameters, optimizer state and (whole) buffers as pieces in `out`.
// Frozen parameters (requires_grad false, such as a base model under LoRA adapters) are neither
// saved nor loaded: they are what the model builds (its weights or its seed), never trained.
void save_module_pieces(const torch::nn::Module& module, const std::vector<HeldLayout>& layouts,
                        const Optimizer& plugin, const torch::optim::Optimizer* optimizer,
                        StateDict& out, const std::string& replicas = {});
// The reverse, from whatever layout wrote the pieces.
void load_module_pieces(torch::nn::Module& module, const std::vector<HeldLayout>& layouts,
                        const Optimizer& plugin, torch::optim::Optimizer* optimizer,
                        const PlacedState& state);

// Strategies that save their state as placed pieces mark the shared entries so, and refuse on
// load a checkpoint that lacks the mark (an earlier format), naming why.
inline constexpr const char* kPiecesFormatKey = "checkpoint.pieces_format";
void mark_pieces_format(StateDict& shared);
void require_pieces_format(const CheckpointState& state);

}  // namespace trainyard
