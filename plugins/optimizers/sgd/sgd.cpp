// Stochastic gradient descent with momentum, Nesterov momentum and weight decay, computed as
// Python's torch.optim.SGD computes it.
//
// The update follows Python's path that `implementation` selects (python_update.hpp) operation
// for operation; the first step's momentum buffer is the gradient itself (`clone().detach()`),
// as in Python. The per-parameter state stays LibTorch's SGDParamState, so saving, loading and
// resharding it work as for torch::optim::SGD.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/sgd.h>

#include <algorithm>

#include "../python_update.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

using python_update::Path;

class PythonSgd final : public torch::optim::SGD {
 public:
  PythonSgd(std::vector<torch::Tensor> params, const torch::optim::SGDOptions& options, Path path)
      : torch::optim::SGD(std::move(params), options) {
    requested_ = path;
    path_ = python_update::resolve(path, python_update::all_parameters(param_groups()));
  }

  torch::Tensor step(LossClosure closure = nullptr) override {
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    python_update::announce("sgd", requested_, path_);
    at::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
      const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
      // torch.optim.SGD._init_group: the parameters with gradients and their buffers (undefined
      // before the first step).
      std::vector<at::Tensor> params, grads, buffers;
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        if (p.grad().is_sparse()) throw Error("sgd does not support sparse gradients here");
        params.push_back(p);
        grads.push_back(p.grad());
        if (options.momentum() != 0) {
          auto it = state().find(p.unsafeGetTensorImpl());
          buffers.push_back(
              it == state().end()
                  ? at::Tensor()
                  : static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
        }
      }
      if (params.empty()) continue;
      switch (path_) {
        case Path::kFused:
          fused(params, grads, buffers, options);
          break;
        case Path::kForeach:
          foreach_path(params, grads, buffers, options);
          break;
        default:
          single(params, grads, buffers, options);
          break;
      }
      // As Python's step() does after the update: the buffers become the parameters' state.
      if (options.momentum() != 0) {
        for (std::size_t i = 0; i < params.size(); ++i) {
          auto& slot = state()[params[i].unsafeGetTensorImpl()];
          if (!slot) slot = std::make_unique<torch::optim::SGDParamState>();
          static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer(buffers[i]);
        }
      }
    }
    return loss;
  }

 private:
  // torch/optim/sgd.py _single_tensor_sgd.
  static void single(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                     std::vector<at::Tensor>& buffers, const torch::optim::SGDOptions& options) {
    const double lr = options.lr();
    const double momentum = options.momentum();
    const double dampening = options.dampening();
    const double weight_decay = options.weight_decay();
    for (std::size_t i = 0; i < params.size(); ++i) {
      at::Tensor grad = grads[i];
      if (weight_decay != 0) grad = grad.add(params[i], weight_decay);
      if (momentum != 0) {
        at::Tensor& buf = buffers[i];
        if (!buf.defined()) {
          buf = grad.detach().clone();
        } else {
          buf.mul_(momentum).add_(grad, 1 - dampening);
        }
        grad = options.nesterov() ? grad.add(buf, momentum) : buf;
      }
      params[i].add_(grad, -lr);
    }
  }

  // torch/optim/sgd.py _multi_tensor_sgd, per device and dtype.
  static void foreach_path(std::vector<at::Tensor>& all_params,
                           const std::vector<at::Tensor>& all_grads,
                           std::vector<at::Tensor>& all_buffers,
                           const torch::optim::SGDOptions& options) {
    const double lr = options.lr();
    const double momentum = options.momentum();
    const double dampening = options.dampening();
    const double weight_decay = options.weight_decay();
    for (const auto& indices : python_update::group_by_device_and_dtype(all_params)) {
      auto params = python_update::pick(all_params, indices);
      auto grads = python_update::pick(all_grads, indices);
      if (weight_decay != 0) grads = at::_foreach_add(grads, params, weight_decay);
      if (momentum != 0) {
        auto bufs = python_update::pick(all_buffers, indices);
        const bool all_have_buffers =
            std::all_of(bufs.begin(), bufs.end(), [](const at::Tensor& b) { return b.defined(); });
        if (all_have_buffers) {
          at::_foreach_mul_(bufs, momentum);
          at::_foreach_add_(bufs, grads, 1 - dampening);
        } else {
          for (std::size_t k = 0; k < bufs.size(); ++k) {
            if (!bufs[k].defined()) {
              bufs[k] = grads[k].detach().clone();
              all_buffers[indices[k]] = bufs[k];
            } else {
              bufs[k].mul_(momentum).add_(grads[k], 1 - dampening);
            }
          }
        }
        if (options.nesterov()) {
          at::_foreach_add_(grads, bufs, momentum);
        } else {
          grads = bufs;
        }
      }
      at::_foreach_add_(params, grads, -lr);
    }
  }

  // torch/optim/sgd.py _fused_sgd: at::_fused_sgd_ per device and dtype; on the first step the
  // kernel fills the (empty) buffers itself.
  static void fused(std::vector<at::Tensor>& all_params, const std::vector<at::Tensor>& all_grads,
                    std::vector<at::Tensor>& all_buffers, const torch::optim::SGDOptions& options) {
    const bool no_momentum_buffer = options.momentum() == 0;
    const bool none_yet = std::all_of(all_buffers.begin(), all_buffers.end(),
                                      [](const at::Tensor& b) { return !b.defined(); });
    const bool is_first_step = none_yet && !no_momentum_buffer;
    if (is_first_step) {
      for (std::size_t i = 0; i < all_grads.size(); ++i) {
        all_buffers[i] = at::empty_like(all_grads[i]);
      }
    } else if (!no_momentum_buffer &&
               !std::all_of(all_buffers.begin(), all_buffers.end(),
                            [](const at::Tensor& b) { return b.defined(); })) {
      throw Error(
          "sgd with implementation \"fused\": some parameters have momentum buffers and others "
          "not (a parameter without a gradient on the first step); use \"single\" or "
          "\"foreach\"");
    }
    for (const auto& indices : python_update::group_by_device_and_dtype(all_params)) {
      at::_fused_sgd_(python_update::pick(all_params, indices),
                      python_update::pick(all_grads, indices),
                      no_momentum_buffer ? std::vector<at::Tensor>{}
                                         : python_update::pick(all_buffers, indices),
                      options.weight_decay(), options.momentum(), options.lr(), options.dampening(),
                      options.nesterov(), /*maximize=*/false, is_first_step);
    }
  }

  Path requested_;
  Path path_;
};

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const Config& options)
      : settings_(options.get_float("lr")), path_(python_update::parse_path(options)) {
    double lr = options.get_float("lr");
    double momentum = options.get_float("momentum");
    double weight_decay = options.get_float("weight_decay");
    double dampening = options.get_float("dampening");
    bool nesterov = options.get_bool("nesterov");
    if (lr < 0) options.fail("lr", "must be >= 0, got " + std::to_string(lr));
    if (momentum < 0) options.fail("momentum", "must be >= 0");
    if (weight_decay < 0) options.fail("weight_decay", "must be >= 0");
    if (nesterov && (momentum <= 0 || dampening != 0)) {
      options.fail("nesterov", "needs momentum > 0 and dampening = 0");
    }
    settings_.momentum(momentum).dampening(dampening).weight_decay(weight_decay).nesterov(nesterov);
  }

  double learning_rate() const override { return settings_.lr(); }

  std::unique_ptr<torch::optim::Optimizer> create(std::vector<torch::Tensor> params) override {
    if (path_ == Path::kFused) {
      for (const auto& p : params) {
        if (!p.is_floating_point()) {
          throw Error("optimizer.implementation = \"fused\" needs floating-point parameters");
        }
      }
    }
    return std::make_unique<PythonSgd>(std::move(params), settings_, path_);
  }

 private:
  torch::optim::SGDOptions settings_;
  Path path_;
};

void register_components(Registry& registry) {
  registry.add<Optimizer>(
      "sgd",
      {option("lr", 0.01, "learning rate"), option("momentum", 0.0, "momentum factor"),
       option("dampening", 0.0, "dampening of momentum"),
       option("nesterov", false, "Nesterov momentum"), option("weight_decay", 0.0, "L2 penalty"),
       python_update::implementation_option()},
      "stochastic gradient descent, computed as Python's torch.optim.SGD "
      "computes it",
      [](const Config& options, const BuildContext&) { return std::make_unique<Sgd>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("sgd", "1.0.0", trainyard::register_components)
