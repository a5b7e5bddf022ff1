#include "trainyard/parallel/gradient_verdict.hpp"

#include <ATen/ATen.h>

#include <cstdlib>
#include <sstream>

#include "trainyard/api/precision.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/parallel/gradients.hpp"

namespace trainyard {
namespace {

// Per thread: ranks run as threads of one test process each count their own steps.
thread_local std::int64_t test_hook_step = -1;

bool all_finite(const at::Tensor& values) { return at::isfinite(values).all().item<bool>(); }

// The parameter names TRAINYARD_TEST_NONFINITE plans for `step`.
std::vector<std::string> planned_nonfinite(std::int64_t step) {
  const char* plan = std::getenv("TRAINYARD_TEST_NONFINITE");
  if (plan == nullptr || step < 0) return {};
  std::vector<std::string> names;
  std::istringstream entries(plan);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    const std::size_t colon = entry.find(':');
    if (colon == std::string::npos) continue;
    if (std::atoll(entry.substr(0, colon).c_str()) == step) {
      names.push_back(entry.substr(colon + 1));
    }
  }
  return names;
}

}  // namespace

GradientVerdict judge_gradients(const StrategyContext& context, const at::Tensor& found_inf,
                                const at::Tensor& norm, const std::vector<at::Tensor>& gradients,
                                const std::function<std::string()>& locate, StepResult& result) {
  result.grad_norm = norm;
  GradientVerdict verdict;
  verdict.found_inf = found_inf;
  // A precision that scales has looked at every gradient already; for the others the norm has.
  const at::Tensor nonfinite =
      found_inf.defined() ? found_inf : at::logical_not(at::isfinite(norm)).to(at::kFloat);
  verdict.step = Precision::should_step(nonfinite);
  if (!verdict.step) {
    result.skipped = true;
    result.nonfinite_parameter = locate();
    return verdict;
  }
  if (context.step.max_grad_norm > 0) clip_to_norm(gradients, norm, context.step.max_grad_norm);
  return verdict;
}

std::string first_nonfinite_parameter(const std::vector<at::Tensor>& gradients,
                                      const std::vector<HeldLayout>& layouts) {
  for (std::size_t i = 0; i < gradients.size() && i < layouts.size(); ++i) {
    if (!gradients[i].defined()) continue;
    const at::Tensor flat = gradients[i].detach().reshape({-1});
    if (all_finite(flat)) continue;
    for (const ParameterPiece& piece : layouts[i]) {
      if (!all_finite(flat.narrow(0, piece.offset, piece.length))) return piece.name;
    }
  }
  return "";
}

void test_nonfinite_hook(const std::vector<at::Tensor>& gradients,
                         const std::vector<HeldLayout>& layouts) {
  for (const std::string& name : planned_nonfinite(test_hook_step)) {
    for (std::size_t i = 0; i < gradients.size() && i < layouts.size(); ++i) {
      if (!gradients[i].defined()) continue;
      for (const ParameterPiece& piece : layouts[i]) {
        if (piece.name != name || piece.length == 0) continue;
        gradients[i].detach().view({-1}).narrow(0, piece.offset, 1).fill_(NAN);
      }
    }
  }
}

void set_test_hook_step(std::int64_t step) { test_hook_step = step; }

}  // namespace trainyard
