#pragma once
// Activation checkpointing: a block runs its forward without keeping its intermediate
// activations and recomputes them in backward, trading compute for memory. LibTorch's C++ API has
// no torch.utils.checkpoint, so the SDK provides one that every strategy applies to its blocks.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "trainyard/api/activations.hpp"

namespace trainyard {

struct Block;
class DeviceBackend;

// Which blocks of a model are recomputed. Text form (the recipe's run.activation_checkpointing):
//   "none"                 no block
//   "all"                  every block
//   "every:K"              blocks 0, K, 2K, ... in forward order ("every:1" is "all")
//   "blocks:NAME,NAME..."  the named blocks
struct ActivationCheckpointing {
  enum class Mode { kNone, kAll, kEvery, kNamed };
  Mode mode = Mode::kNone;
  std::int64_t every = 1;
  std::vector<std::string> names;

  // Throws Error explaining the accepted forms.
  static ActivationCheckpointing parse(const std::string& text);
  std::string to_string() const;
  bool enabled() const { return mode != Mode::kNone; }
  bool selects(std::size_t index, const std::string& name) const;
};

// The blocks with the selected ones recomputed in backward. Unselected blocks are returned as
// they are. Throws Error when a named block does not exist (listing the model's blocks).
// `device` is the run's device backend (StrategyContext::device_backend): the recompute replays
// its generator through it.
std::vector<Block> with_activation_checkpointing(std::vector<Block> blocks,
                                                 const ActivationCheckpointing& selection,
                                                 std::shared_ptr<DeviceBackend> device = nullptr);

// Runs `forward(input)` without storing its intermediate activations for backward: only the
// input bundle (and the RNG and autocast state of the call) is kept: the CPU generator, the
// generator of the input's device through `device` (the backend driving that type of device; or,
// without one, ATen's default generator of a non-CPU input's device), and autocast for the CPU
// and that device's type. Backward restores that
// state, recomputes the forward with grad enabled and backpropagates through it from every output
// tensor whose gradient arrived. `parameters` are the tensors the forward reads besides its
// inputs (the block's parameters): their gradients flow through the outer graph, so gradient
// hooks (DDP's reducer) and parameters shared between blocks behave as without checkpointing.
// Without grad mode, or when nothing requires grad, it is a plain call.
Activations checkpointed_call(const std::function<Activations(const Activations&)>& forward,
                              const Activations& input, const std::vector<at::Tensor>& parameters,
                              const std::shared_ptr<DeviceBackend>& device = nullptr);

// Whether the calling thread is inside a checkpointed call's recompute (the forward that
// backward replays): what wraps a block can tell a recompute, whose backward follows at once,
// from a forward whose backward comes after the later blocks'.
bool recomputing_checkpointed_forward();

}  // namespace trainyard
