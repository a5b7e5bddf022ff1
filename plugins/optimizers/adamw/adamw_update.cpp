#include "adamw_update.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <vector>

namespace trainyard::adamw {
namespace {

// The per-element constants, rounded to float as ATen rounds a Python float it multiplies a
// float32 tensor by.
struct PassScalars {
  bool decay = false;
  float decay_factor = 1;  // 1 - lr * weight_decay
  float lerp_weight = 0;   // 1 - beta1
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float bias_correction2_sqrt = 1;
  float eps = 0;
  float neg_step_size = 0;  // -lr / bias_correction1
};

#if defined(__x86_64__)
#define TRAINYARD_TWO_PASS_TARGET __attribute__((target("avx2,fma")))
#else
#define TRAINYARD_TWO_PASS_TARGET
#endif

// param *= 1 - lr*wd; exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad,
// 1 - beta2). ATen's lerp with a weight under 0.5 is fma(weight, end - start, start); with a
// larger one, fma(weight - 1, end - start, end).
TRAINYARD_TWO_PASS_TARGET void decay_and_moments(float* param, const float* grad, float* exp_avg,
                                                 float* exp_avg_sq, std::int64_t count,
                                                 const PassScalars& s) {
  const bool small_weight = std::abs(s.lerp_weight) < 0.5f;
  const float coefficient = small_weight ? s.lerp_weight : s.lerp_weight - 1.0f;
  for (std::int64_t i = 0; i < count; ++i) {
    if (s.decay) param[i] = param[i] * s.decay_factor;
    const float g = grad[i];
    const float m = exp_avg[i];
    exp_avg[i] = std::fma(coefficient, g - m, small_weight ? m : g);
    exp_avg_sq[i] = std::fma(s.one_minus_beta2 * g, g, exp_avg_sq[i] * s.beta2);
  }
}

// denom = sqrt / bias_correction2_sqrt + eps; param.addcdiv_(exp_avg, denom, -step_size).
TRAINYARD_TWO_PASS_TARGET void step_parameter(float* param, const float* exp_avg,
                                              const float* sqrt_exp_avg_sq, std::int64_t count,
                                              const PassScalars& s) {
  for (std::int64_t i = 0; i < count; ++i) {
    const float denom = sqrt_exp_avg_sq[i] / s.bias_correction2_sqrt + s.eps;
    param[i] = param[i] + (s.neg_step_size * exp_avg[i]) / denom;
  }
}

bool cpu_has_avx2_and_fma() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool compute_match() {
  if (!cpu_has_avx2_and_fma()) return false;
  const UpdateSettings settings{2e-3, 0.9, 0.999, 1e-8, 0.01};
  const UpdateSettings heavy_lerp{1e-2, 0.3, 0.95, 1e-6, 0.0};
  at::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(/*seed_in=*/20261202);
  for (const auto& s : {settings, heavy_lerp}) {
    for (std::int64_t size : {1, 7, 31, 33, 100, 1000, 100003}) {
      at::Tensor param = at::randn({size}, generator, at::kFloat);
      at::Tensor exp_avg = at::randn({size}, generator, at::kFloat) * 1e-3;
      at::Tensor exp_avg_sq = at::rand({size}, generator, at::kFloat) * 1e-5;
      at::Tensor by_operations[3] = {param.clone(), exp_avg.clone(), exp_avg_sq.clone()};
      for (std::int64_t step = 1; step <= 3; ++step) {
        const at::Tensor grad = at::randn({size}, generator, at::kFloat) * 1e-2;
        update_by_operations(by_operations[0], grad, by_operations[1], by_operations[2], {}, s,
                             step);
        update_in_two_passes(param, grad, exp_avg, exp_avg_sq, s, step);
      }
      const at::Tensor passes[3] = {param, exp_avg, exp_avg_sq};
      for (int i = 0; i < 3; ++i) {
        if (!at::equal(passes[i].view(at::kInt), by_operations[i].view(at::kInt))) return false;
      }
    }
  }
  return true;
}

}  // namespace

BiasCorrected bias_corrected(const UpdateSettings& s, std::int64_t step) {
  const double bias_correction1 = 1 - std::pow(s.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(s.beta2, static_cast<double>(step));
  return {s.lr / bias_correction1, std::pow(bias_correction2, 0.5)};
}

void update_by_operations(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                          at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq,
                          const UpdateSettings& settings, std::int64_t step) {
  if (settings.weight_decay != 0) param.mul_(1 - settings.lr * settings.weight_decay);
  exp_avg.lerp_(grad, 1 - settings.beta1);
  exp_avg_sq.mul_(settings.beta2).addcmul_(grad, grad, 1 - settings.beta2);
  const BiasCorrected scalars = bias_corrected(settings, step);
  at::Tensor denom;
  if (max_exp_avg_sq.defined()) {
    at::Tensor max_sq = max_exp_avg_sq;
    at::maximum_out(max_sq, max_sq, exp_avg_sq);
    denom = (max_sq.sqrt() / scalars.bias_correction2_sqrt).add_(settings.eps);
  } else {
    denom = (exp_avg_sq.sqrt() / scalars.bias_correction2_sqrt).add_(settings.eps);
  }
  param.addcdiv_(exp_avg, denom, -scalars.step_size);
}

bool two_passes_apply(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq) {
  for (const at::Tensor* tensor : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (!tensor->device().is_cpu() || tensor->scalar_type() != at::kFloat ||
        tensor->layout() != at::kStrided || !tensor->is_contiguous() ||
        tensor->numel() != param.numel()) {
      return false;
    }
  }
  return two_passes_match_operations();
}

void update_in_two_passes(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                          at::Tensor& exp_avg_sq, const UpdateSettings& settings,
                          std::int64_t step) {
  const BiasCorrected step_values = bias_corrected(settings, step);
  PassScalars s;
  s.decay = settings.weight_decay != 0;
  s.decay_factor = static_cast<float>(1 - settings.lr * settings.weight_decay);
  s.lerp_weight = static_cast<float>(1 - settings.beta1);
  s.beta2 = static_cast<float>(settings.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - settings.beta2);
  s.bias_correction2_sqrt = static_cast<float>(step_values.bias_correction2_sqrt);
  s.eps = static_cast<float>(settings.eps);
  s.neg_step_size = static_cast<float>(-step_values.step_size);
  float* param_data = param.data_ptr<float>();
  const float* grad_data = grad.const_data_ptr<float>();
  float* exp_avg_data = exp_avg.data_ptr<float>();
  float* exp_avg_sq_data = exp_avg_sq.data_ptr<float>();
  const std::int64_t count = param.numel();
  at::parallel_for(0, count, at::internal::GRAIN_SIZE, [&](std::int64_t begin, std::int64_t end) {
    decay_and_moments(param_data + begin, grad_data + begin, exp_avg_data + begin,
                      exp_avg_sq_data + begin, end - begin, s);
  });
  const at::Tensor sqrt_exp_avg_sq = exp_avg_sq.sqrt();
  const float* sqrt_data = sqrt_exp_avg_sq.const_data_ptr<float>();
  at::parallel_for(0, count, at::internal::GRAIN_SIZE, [&](std::int64_t begin, std::int64_t end) {
    step_parameter(param_data + begin, exp_avg_data + begin, sqrt_data + begin, end - begin, s);
  });
  // Written through raw pointers: the versions move as ATen's in-place operations move them, so
  // autograd still refuses a graph that saved these tensors before the step.
  for (const at::Tensor* written : {&param, &exp_avg, &exp_avg_sq}) {
    written->unsafeGetTensorImpl()->bump_version();
  }
}

bool two_passes_match_operations() {
  static const bool match = compute_match();
  return match;
}

}  // namespace trainyard::adamw
