#include "trainyard/parallel/sharded_optimizer_state.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <utility>

#include "released_collective.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/parallel/distributed.hpp"

namespace trainyard {

struct ShardedOptimizerState::State {
  State(std::vector<at::Tensor> parameters_in, c10::intrusive_ptr<c10d::Backend> group_in,
        Optimizer& plugin)
      : parameters(std::move(parameters_in)),
        group(std::move(group_in)),
        rank(group ? group->getRank() : 0),
        ranks(group ? group->getSize() : 1) {
    for (const auto& parameter : parameters) numel += parameter.numel();
    shard_numel = (numel + ranks - 1) / ranks;
    at::NoGradGuard no_grad;
    at::Tensor flat = flatten(/*gradients=*/false);
    master = flat.narrow(0, rank * shard_numel, shard_numel).clone();
    master.requires_grad_(true);
    optimizer = plugin.create({master});
  }

  // Parameters (or their gradients, zero where absent) in one flat tensor, padded to whole
  // slices.
  at::Tensor flatten(bool gradients) const {
    at::Tensor flat =
        at::zeros({shard_numel * ranks}, parameters.front().options().requires_grad(false));
    std::int64_t offset = 0;
    for (const auto& tensor : parameters) {
      const at::Tensor source = gradients ? tensor.grad() : tensor.detach();
      if (source.defined()) flat.narrow(0, offset, tensor.numel()).copy_(source.reshape({-1}));
      offset += tensor.numel();
    }
    return flat;
  }

  void step() {
    at::NoGradGuard no_grad;
    at::Tensor gradients = flatten(/*gradients=*/true);
    master.mutable_grad() = gradients.narrow(0, rank * shard_numel, shard_numel).clone();
    optimizer->step();
    master.mutable_grad() = at::Tensor();  // the whole gradients stay in the parameters' .grad
    at::Tensor gathered = at::empty({shard_numel * ranks}, master.options().requires_grad(false));
    at::Tensor input = master.detach();
    if (group) {
      wait_released(group->_allgather_base(gathered, input), gathered.is_cpu());
    } else {
      gathered.copy_(input);
    }
    std::int64_t offset = 0;
    for (auto& parameter : parameters) {
      parameter.detach().copy_(
          gathered.narrow(0, offset, parameter.numel()).view(parameter.sizes()));
      offset += parameter.numel();
    }
    // Freed now rather than when the last reference goes: should the communicator's worker
    // hold the finished all-gather (and so this buffer) past wait_released's limit, a whole flat
    // copy of the parameters would still be held when the next step starts.
    gathered.storage().unsafeGetStorageImpl()->reset();
  }

  std::vector<at::Tensor> parameters;
  c10::intrusive_ptr<c10d::Backend> group;
  std::int64_t rank;
  std::int64_t ranks;
  std::int64_t numel = 0;
  std::int64_t shard_numel = 0;
  at::Tensor master;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

ShardedOptimizerState::ShardedOptimizerState(std::vector<at::Tensor> parameters,
                                             const c10::intrusive_ptr<c10d::Backend>& group,
                                             Optimizer& optimizer)
    : state_(std::make_unique<State>(std::move(parameters), group, optimizer)) {}

ShardedOptimizerState::~ShardedOptimizerState() = default;

torch::optim::Optimizer& ShardedOptimizerState::optimizer() { return *state_->optimizer; }

const at::Tensor& ShardedOptimizerState::master() const { return state_->master; }

void ShardedOptimizerState::step() { state_->step(); }

}  // namespace trainyard
