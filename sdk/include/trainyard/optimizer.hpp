#pragma once
// Optimizers: factories of torch::optim optimizers over the parameters a strategy chooses.

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "trainyard/component.hpp"
#include "trainyard/state.hpp"

namespace trainyard {

// An optimizer plugin. The strategy decides which tensors are optimised (whole parameters,
// flat shards) and calls create(); the plugin decides the update rule. save_state/load_state
// turn the optimizer's per-parameter state into named tensors, so that checkpoints can be
// inspected, exported and resharded; the defaults handle LibTorch's SGD, Adam, AdamW, Adagrad
// and RMSprop.
class Optimizer : public Component {
 public:
  static constexpr const char* kKind = "optimizer";
  virtual double learning_rate() const = 0;
  virtual std::unique_ptr<torch::optim::Optimizer> create(std::vector<torch::Tensor> params) = 0;
  virtual void save_state(const torch::optim::Optimizer& optimizer, const std::string& prefix,
                          StateDict& out) const;
  virtual void load_state(torch::optim::Optimizer& optimizer, const std::string& prefix,
                          const StateDict& in) const;
};

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace trainyard
