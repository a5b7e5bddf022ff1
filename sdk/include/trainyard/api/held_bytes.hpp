#pragma once
// Bytes a rank holds in training state, measured on the tensors themselves.

#include <cstdint>
#include <vector>

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}

namespace trainyard {

class Optimizer;

// Each storage counted once: gradient buckets that gradients view into count as gradients,
// a flat shard as what it holds.
struct HeldBytes {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t total() const { return parameters + gradients + optimizer_state; }
};

// Counts the storages behind `parameters`, their gradients and `optimizer`'s state tensors
// (optimizer may be null), and `gradient_buffers` (flat communication buffers) as gradients. A
// storage shared by several tensors counts once, in the first category that reaches it. Optimizer
// state is counted for LibTorch's SGD, Adam and AdamW state types; other types contribute nothing.
HeldBytes count_held_bytes(const std::vector<at::Tensor>& parameters,
                           const torch::optim::Optimizer* optimizer,
                           const std::vector<at::Tensor>& gradient_buffers = {});

// As above, with the optimizer plugin that made `optimizer`: state of a type only the plugin
// knows is counted through its save_state_views entries (the state-key contract, optimizer.hpp),
// so a third party's optimizer shows in held_optimizer_bytes like a bundled one. What strategies
// call.
HeldBytes count_held_bytes(const std::vector<at::Tensor>& parameters,
                           const torch::optim::Optimizer* optimizer, const Optimizer& plugin,
                           const std::vector<at::Tensor>& gradient_buffers = {});

}  // namespace trainyard
