// AdamW's two-pass update against the same update operation by operation (torch.optim's
// for-loop path, which the Python parity tests hold to Python's bits): every bit of the
// parameter and both moments, over sizes with and without vector tails, tensors split over
// threads, both lerp branches, with and without weight decay, for many steps.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>

#include "adamw_update.hpp"

namespace trainyard::adamw {
namespace {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return at::equal(a.view(at::kInt), b.view(at::kInt));
}

TEST(AdamWUpdate, TwoPassesHaveTheBitsOfTheOperations) {
  ASSERT_TRUE(two_passes_match_operations()) << "the two-pass update is not in use on this machine";
  at::NoGradGuard no_grad;
  at::manual_seed(7);
  const UpdateSettings settings[] = {
      {2e-3, 0.9, 0.999, 1e-8, 0.01},  // the bundled recipes' AdamW
      {1e-2, 0.3, 0.95, 1e-6, 0.0},    // lerp weight above 0.5, no weight decay
      {5e-4, 0.0, 0.5, 1e-3, 0.1}};
  const int threads_before = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (const auto& s : settings) {
      for (std::int64_t size : {1, 5, 16, 31, 32, 33, 63, 257, 4099, 65536, 98307}) {
        SCOPED_TRACE("threads " + std::to_string(threads) + ", size " + std::to_string(size) +
                     ", beta1 " + std::to_string(s.beta1));
        at::Tensor param = at::randn({size});
        at::Tensor exp_avg = at::zeros({size});
        at::Tensor exp_avg_sq = at::zeros({size});
        at::Tensor param_ops = param.clone(), exp_avg_ops = exp_avg.clone(),
                   exp_avg_sq_ops = exp_avg_sq.clone();
        for (std::int64_t step = 1; step <= 20; ++step) {
          // Gradients of every scale, exact zeros among them.
          at::Tensor grad = at::randn({size}) * std::pow(10.0, -static_cast<double>(step % 6));
          grad.masked_fill_(at::rand({size}) < 0.05, 0);
          ASSERT_TRUE(two_passes_apply(param, grad, exp_avg, exp_avg_sq));
          update_in_two_passes(param, grad, exp_avg, exp_avg_sq, s, step);
          update_by_operations(param_ops, grad, exp_avg_ops, exp_avg_sq_ops, {}, s, step);
          ASSERT_TRUE(same_bits(exp_avg, exp_avg_ops)) << "exp_avg at step " << step;
          ASSERT_TRUE(same_bits(exp_avg_sq, exp_avg_sq_ops)) << "exp_avg_sq at step " << step;
          ASSERT_TRUE(same_bits(param, param_ops)) << "param at step " << step;
        }
      }
    }
  }
  at::set_num_threads(threads_before);
}

// A graph that saved the parameter before the step is refused afterwards, as after ATen's
// in-place operations.
TEST(AdamWUpdate, TwoPassesMoveTheVersionsOfWhatTheyWrite) {
  at::Tensor param = at::randn({64}), grad = at::randn({64});
  at::Tensor exp_avg = at::zeros({64}), exp_avg_sq = at::zeros({64});
  const auto before = {param._version(), exp_avg._version(), exp_avg_sq._version()};
  const auto grad_before = grad._version();
  {
    at::NoGradGuard no_grad;
    update_in_two_passes(param, grad, exp_avg, exp_avg_sq, {}, 1);
  }
  auto was = before.begin();
  for (const at::Tensor* written : {&param, &exp_avg, &exp_avg_sq}) {
    EXPECT_GT(written->_version(), *was++);
  }
  EXPECT_EQ(grad._version(), grad_before);
}

// What the passes cannot take goes operation by operation.
TEST(AdamWUpdate, OnlyContiguousFloat32CpuTensorsOfOneSizeTakeTwoPasses) {
  const at::Tensor t = at::zeros({4, 6});
  EXPECT_TRUE(two_passes_apply(t, t.clone(), t.clone(), t.clone()));
  EXPECT_FALSE(two_passes_apply(t, t.t().contiguous().t(), t.clone(), t.clone()));
  const at::Tensor d = at::zeros({4, 6}, at::kDouble);
  EXPECT_FALSE(two_passes_apply(d, d.clone(), d.clone(), d.clone()));
  const at::Tensor h = at::zeros({4, 6}, at::kBFloat16);
  EXPECT_FALSE(two_passes_apply(h, h.clone(), h.clone(), h.clone()));
  EXPECT_FALSE(two_passes_apply(t, at::zeros({4, 5}), t.clone(), t.clone()));
}

}  // namespace
}  // namespace trainyard::adamw
