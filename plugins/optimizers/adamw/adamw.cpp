// Adam with decoupled weight decay, computed as Python's torch.optim.AdamW computes it.
//
// LibTorch's C++ AdamW rounds differently from Python's (it updates the first moment with
// mul_/add_ where Python lerps, and folds the bias corrections in another order), so this plugin
// steps with Python's arithmetic, operation for operation, on whichever path
// `implementation` selects (python_update.hpp). The per-parameter state stays LibTorch's
// AdamWParamState, so saving, loading and resharding it work as for torch::optim::AdamW.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/adamw.h>

#include <string>
#include <unordered_map>

#include "../python_update.hpp"
#include "adamw_update.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

using python_update::Path;

// One parameter group's tensors that take part in a step: the parameters with gradients.
struct GroupTensors {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<torch::optim::AdamWParamState*> states;
};

class PythonAdamW final : public torch::optim::AdamW {
 public:
  PythonAdamW(std::vector<torch::Tensor> params, const torch::optim::AdamWOptions& options,
              Path path)
      : torch::optim::AdamW(std::move(params), options) {
    requested_ = path;
    path_ = python_update::resolve(path, python_update::all_parameters(param_groups()));
    // Once, here: the probe of the two-pass update runs before the first step, not in it.
    how_ = describe_single();
  }

  torch::Tensor step(LossClosure closure = nullptr) override {
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    python_update::announce("adamw", requested_, path_, how_);
    at::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
      const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
      GroupTensors tensors = collect(group, options.amsgrad());
      if (tensors.params.empty()) continue;
      switch (path_) {
        case Path::kFused:
          fused(tensors, options);
          break;
        case Path::kForeach:
          foreach_path(tensors, options);
          break;
        default:
          single(tensors, options);
          break;
      }
    }
    return loss;
  }

 private:
  std::string describe_single() const {
    if (path_ != Path::kSingle) return "";
    return adamw::two_passes_match_operations()
               ? "float32 parameters in two passes each, the same bits as its operations"
               : "operation by operation (this machine's ATen rounds unlike the two passes)";
  }

  // torch.optim.Adam._init_group: lazily created zero moments for parameters with gradients.
  GroupTensors collect(torch::optim::OptimizerParamGroup& group, bool amsgrad) {
    GroupTensors out;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw Error("adamw does not support sparse gradients");
      auto& slot = state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (amsgrad) fresh->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      if (amsgrad && !state.max_exp_avg_sq().defined()) {
        state.max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
      out.params.push_back(p);
      out.grads.push_back(p.grad());
      out.exp_avgs.push_back(state.exp_avg());
      out.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (amsgrad) out.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      out.states.push_back(&state);
    }
    return out;
  }

  static adamw::UpdateSettings update_settings(const torch::optim::AdamWOptions& options) {
    adamw::UpdateSettings settings;
    settings.lr = options.lr();
    settings.beta1 = std::get<0>(options.betas());
    settings.beta2 = std::get<1>(options.betas());
    settings.eps = options.eps();
    settings.weight_decay = options.weight_decay();
    return settings;
  }

  // torch/optim/adam.py _single_tensor_adam (capturable and differentiable off), parameter by
  // parameter: in two passes where they give the same bits, else operation by operation
  // (adamw_update.hpp).
  static void single(GroupTensors& t, const torch::optim::AdamWOptions& options) {
    const adamw::UpdateSettings settings = update_settings(options);
    for (std::size_t i = 0; i < t.params.size(); ++i) {
      const std::int64_t step = t.states[i]->step() + 1;
      t.states[i]->step(step);
      if (!options.amsgrad() &&
          adamw::two_passes_apply(t.params[i], t.grads[i], t.exp_avgs[i], t.exp_avg_sqs[i])) {
        adamw::update_in_two_passes(t.params[i], t.grads[i], t.exp_avgs[i], t.exp_avg_sqs[i],
                                    settings, step);
      } else {
        adamw::update_by_operations(t.params[i], t.grads[i], t.exp_avgs[i], t.exp_avg_sqs[i],
                                    options.amsgrad() ? t.max_exp_avg_sqs[i] : at::Tensor(),
                                    settings, step);
      }
    }
  }

  // torch/optim/adam.py _multi_tensor_adam (capturable off), per device and dtype.
  static void foreach_path(GroupTensors& t, const torch::optim::AdamWOptions& options) {
    const adamw::UpdateSettings settings = update_settings(options);
    const double lr = settings.lr, beta1 = settings.beta1, beta2 = settings.beta2;
    const double weight_decay = settings.weight_decay, eps = settings.eps;
    for (const auto& indices : python_update::group_by_device_and_dtype(t.params)) {
      auto params = python_update::pick(t.params, indices);
      auto grads = python_update::pick(t.grads, indices);
      auto exp_avgs = python_update::pick(t.exp_avgs, indices);
      auto exp_avg_sqs = python_update::pick(t.exp_avg_sqs, indices);
      std::vector<at::Scalar> step_size, bias_correction2_sqrt;
      for (auto i : indices) {
        const std::int64_t step = t.states[i]->step() + 1;
        t.states[i]->step(step);
        // Python's `(lr / bias_correction1) * -1`: a negation, exact either way.
        const adamw::BiasCorrected corrected = adamw::bias_corrected(settings, step);
        step_size.emplace_back(-corrected.step_size);
        bias_correction2_sqrt.emplace_back(corrected.bias_correction2_sqrt);
      }
      if (weight_decay != 0) at::_foreach_mul_(params, 1 - lr * weight_decay);
      at::_foreach_lerp_(exp_avgs, grads, 1 - beta1);
      at::_foreach_mul_(exp_avg_sqs, beta2);
      at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
      std::vector<at::Tensor> exp_avg_sq_sqrt;
      if (options.amsgrad()) {
        auto max_exp_avg_sqs = python_update::pick(t.max_exp_avg_sqs, indices);
        at::_foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs);
        exp_avg_sq_sqrt = at::_foreach_sqrt(max_exp_avg_sqs);
      } else {
        exp_avg_sq_sqrt = at::_foreach_sqrt(exp_avg_sqs);
      }
      at::_foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt);
      at::_foreach_add_(exp_avg_sq_sqrt, eps);
      at::_foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size);
    }
  }

  // torch/optim/adam.py _fused_adam: at::_fused_adamw_ per device and dtype. The kernel reads
  // the step from float32 tensors on the parameters' device, as Python keeps it with fused=True;
  // they are kept here beside the integer counts of the state and refilled only when those
  // changed behind them (a loaded checkpoint).
  void fused(GroupTensors& t, const torch::optim::AdamWOptions& options) {
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    for (const auto& indices : python_update::group_by_device_and_dtype(t.params)) {
      std::vector<at::Tensor> steps;
      steps.reserve(indices.size());
      for (auto i : indices) {
        auto& held = device_steps_[t.params[i].unsafeGetTensorImpl()];
        const std::int64_t count = t.states[i]->step();
        if (!held.tensor.defined() || held.count != count) {
          held.tensor =
              at::full({}, static_cast<double>(count), t.params[i].options().dtype(at::kFloat));
        }
        held.count = count + 1;
        t.states[i]->step(count + 1);
        steps.push_back(held.tensor);
      }
      at::_foreach_add_(steps, 1);
      const auto max_exp_avg_sqs = options.amsgrad()
                                       ? python_update::pick(t.max_exp_avg_sqs, indices)
                                       : std::vector<at::Tensor>{};
      at::_fused_adamw_(
          python_update::pick(t.params, indices), python_update::pick(t.grads, indices),
          python_update::pick(t.exp_avgs, indices), python_update::pick(t.exp_avg_sqs, indices),
          max_exp_avg_sqs, steps, options.lr(), beta1, beta2, options.weight_decay(), options.eps(),
          options.amsgrad(), /*maximize=*/false);
    }
  }

  struct DeviceStep {
    at::Tensor tensor;
    std::int64_t count = 0;  // the value the tensor holds
  };

  Path requested_;
  Path path_;
  std::string how_;  // what the announcement adds about the path
  std::unordered_map<const void*, DeviceStep> device_steps_;
};

class AdamW final : public Optimizer {
 public:
  explicit AdamW(const Config& options)
      : settings_(options.get_float("lr")), path_(python_update::parse_path(options)) {
    double lr = options.get_float("lr");
    double beta1 = options.get_float("beta1");
    double beta2 = options.get_float("beta2");
    double eps = options.get_float("eps");
    double weight_decay = options.get_float("weight_decay");
    if (lr < 0) options.fail("lr", "must be >= 0, got " + std::to_string(lr));
    if (beta1 < 0 || beta1 >= 1) options.fail("beta1", "must be in [0, 1)");
    if (beta2 < 0 || beta2 >= 1) options.fail("beta2", "must be in [0, 1)");
    if (eps <= 0) options.fail("eps", "must be > 0");
    if (weight_decay < 0) options.fail("weight_decay", "must be >= 0");
    settings_.betas({beta1, beta2})
        .eps(eps)
        .weight_decay(weight_decay)
        .amsgrad(options.get_bool("amsgrad"));
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
    return std::make_unique<PythonAdamW>(std::move(params), settings_, path_);
  }

 private:
  torch::optim::AdamWOptions settings_;
  Path path_;
};

void register_components(Registry& registry) {
  registry.add<Optimizer>(
      "adamw",
      {option("lr", 1e-3, "learning rate"), option("beta1", 0.9, "decay of the first moment"),
       option("beta2", 0.999, "decay of the second moment"),
       option("eps", 1e-8, "added to the denominator"),
       option("weight_decay", 0.01, "decoupled weight decay"),
       option("amsgrad", false, "keep the maximum of second moments"),
       python_update::implementation_option()},
      "AdamW, computed as Python's torch.optim.AdamW computes it",
      [](const Config& options, const BuildContext&) { return std::make_unique<AdamW>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("adamw", "1.0.0", trainyard::register_components)
