#pragma once
// One parameter's update on torch.optim.AdamW's for-loop path (_single_tensor_adam, capturable
// and differentiable off), computed two ways that give the same bits: operation by operation as
// Python issues them, and in two passes over memory. Python's step runs eight elementwise ATen
// operations per parameter, each a pass over the tensors; the two passes read and write each
// tensor about twice.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace trainyard::adamw {

struct UpdateSettings {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// The step size (lr / bias_correction1) and the square root of bias_correction2 at `step`
// (counted from 1), in doubles with C's pow, as Python computes them.
struct BiasCorrected {
  double step_size;
  double bias_correction2_sqrt;
};
BiasCorrected bias_corrected(const UpdateSettings& settings, std::int64_t step);

// torch/optim/adam.py _single_tensor_adam for one parameter at `step` (counted from 1). Python's
// floats are doubles and `x ** y` is C's pow, so the scalars are computed as Python computes
// them. `max_exp_avg_sq` is defined for amsgrad alone.
void update_by_operations(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                          at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq,
                          const UpdateSettings& settings, std::int64_t step);

// Whether update_in_two_passes takes these tensors: dense contiguous float32 on the CPU, alike in
// size, on an x86 CPU with AVX2 and FMA, where ATen's own kernels were found to round as the
// passes do (two_passes_match_operations).
bool two_passes_apply(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq);

// update_by_operations without amsgrad, in two passes: weight decay and both moments in one, the
// square root by ATen (its vectorised square root is not always correctly rounded, so it is
// ATen's call), and the step in the other. Each elementwise operation keeps ATen's rounding: the
// lerp is ATen's fused multiply-add, addcmul's product is fused into its sum as ATen's build
// fuses it, and the rest are single IEEE operations.
void update_in_two_passes(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                          at::Tensor& exp_avg_sq, const UpdateSettings& settings,
                          std::int64_t step);

// Runs both ways on probe tensors (sizes with and without vector tails, one large enough to be
// split over threads, moments near zero and far from it) and compares every bit. Checked once
// per process; false sends every parameter the operation-by-operation way.
bool two_passes_match_operations();

}  // namespace trainyard::adamw
