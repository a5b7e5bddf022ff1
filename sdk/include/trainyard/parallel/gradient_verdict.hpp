#pragma once
// How every strategy ends its step once the gradients are synchronised and unscaled: the norm
// recorded, non-finite gradients caught, the decision to step taken alike on every rank.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainyard/api/parameter_pieces.hpp"

namespace trainyard {

struct StrategyContext;
struct StepResult;

// Whether the optimizer steps, and the found_inf to hand to Precision::update.
struct GradientVerdict {
  bool step = true;
  at::Tensor found_inf;  // the precision's own flag, as unscale returned it and ranks agreed
};

// The end of a step, shared by every strategy so that all report and decide alike:
// - result.grad_norm = `norm`, the global norm over every gradient of every rank (pieces of a
//   sharded or tensor-parallel parameter counted once), before clipping, every step;
// - the gradients are non-finite when the precision found inf or nan (`found_inf`, agreed over
//   the ranks holding other gradients) or, for a precision that does not scale, when `norm` is
//   not finite: the norm is already global, so every rank reaches the same verdict without a
//   collective of its own, and the check costs no pass over the gradients beyond the norm's;
// - non-finite: result.skipped, and result.nonfinite_parameter = `locate()` (called only then,
//   before anything changes the gradients); finite: clipped to context.step.max_grad_norm.
// The one host read is of the verdict itself.
GradientVerdict judge_gradients(const StrategyContext& context, const at::Tensor& found_inf,
                                const at::Tensor& norm, const std::vector<at::Tensor>& gradients,
                                const std::function<std::string()>& locate, StepResult& result);

// The first parameter, in the order of `held` (with `layouts`, as the strategy holds its
// tensors), with an inf or nan in the part of its gradient on this rank; empty when none here.
// `gradients[i]` is held[i]'s gradient (undefined: none). Reads the gradients: for a step that
// was found non-finite, not for every step.
std::string first_nonfinite_parameter(const std::vector<at::Tensor>& gradients,
                                      const std::vector<HeldLayout>& layouts);

// Test hook, as test_failure_hook: with TRAINYARD_TEST_NONFINITE="STEP:NAME[,STEP:NAME...]", at
// those steps (set_test_hook_step) writes a nan into the first element of parameter NAME's
// gradient that this rank holds. Strategies call it once their gradients are synchronised.
void test_nonfinite_hook(const std::vector<at::Tensor>& gradients,
                         const std::vector<HeldLayout>& layouts);
// The step test hooks act on, for the calling thread (the one that runs train_step); the engine
// sets it before each step (0-based, as the step record counts).
void set_test_hook_step(std::int64_t step);

}  // namespace trainyard
