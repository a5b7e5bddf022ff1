#pragma once
// Optimizers: factories of torch::optim optimizers over the parameters a strategy chooses.

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "trainyard/api/component.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

// An optimizer plugin. The strategy decides which tensors are optimised (whole parameters,
// flat shards) and calls create(); the plugin decides the update rule. save_state/load_state
// turn the optimizer's per-parameter state into named tensors, so that checkpoints can be
// inspected, exported and resharded; the defaults handle LibTorch's SGD, Adam and AdamW.
//
// The state-key contract, which a plugin with a state type of its own keeps in save_state,
// save_state_views and load_state:
// - one entry per state tensor, named `<prefix>param.<index>.<field>`: `index` counts the
//   optimizer's parameters across its param_groups in order, `field` names the tensor
//   (`exp_avg`, `momentum_buffer`, `velocity`, ...);
// - a tensor per element of its parameter has the parameter's shape (strategies cut and
//   reshard it as they cut the parameter), a 0-dim tensor is a per-parameter scalar (a step
//   count) kept whole;
// - a parameter without state yet has no entries, and load_state accepts that.
// Checkpoints save these entries, held_bytes counts their storage (held_optimizer_bytes), and
// resharding moves them with their parameters.
class Optimizer : public Component {
 public:
  static constexpr const char* kKind = "optimizer";
  virtual double learning_rate() const = 0;
  virtual std::unique_ptr<torch::optim::Optimizer> create(std::vector<torch::Tensor> params) = 0;
  virtual void save_state(const torch::optim::Optimizer& optimizer, const std::string& prefix,
                          StateDict& out) const;
  // save_state's entries without copying them: views of the optimizer's live state where it can,
  // for checkpoints (which copy what they keep while training goes on, snapshot_to_host).
  // Default: views for the state types the default save_state knows, save_state's copies for any
  // other. A plugin whose save_state changes the entries of a known type overrides this too.
  virtual void save_state_views(const torch::optim::Optimizer& optimizer,
                                const std::string& prefix, StateDict& out) const;
  virtual void load_state(torch::optim::Optimizer& optimizer, const std::string& prefix,
                          const StateDict& in) const;
};

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// What `optimizer` changes in place when it steps: its parameters and their state tensors (of
// the state types the default save_state knows; others are left out).
std::vector<torch::Tensor> stepped_tensors(const torch::optim::Optimizer& optimizer);

}  // namespace trainyard
