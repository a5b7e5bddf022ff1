// PowerSGD against PyTorch's powerSGD_hook: ranks as threads over gloo reduce the same random
// gradients through the SDK's GradientReducer with the powersgd plugin, and PyTorch's hook,
// registered on Python DDP by the venv's Python on as many gloo ranks (powersgd_hook.py, which
// checks that DDP's buckets are the reducer's), gets the same gradients with the same
// PowerSGDState settings and seed. Every step's averaged buckets must agree within fp32
// tolerance, for 20 steps: two of plain all-reduces, then compressed ones whose error feedback
// and warm-started Q carry from step to step.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "compressed_reduction.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 20;
constexpr int kStartStep = 2;

struct Setting {
  int ranks;
  double bucket_cap_mb;
  std::int64_t matrix_rank;

  ReductionSetting reduction() const {
    return {
        ranks, kSteps, bucket_cap_mb, "powersgd",
        "rank = " + std::to_string(matrix_rank) + "\nstart_step = " + std::to_string(kStartStep)};
  }
};

at::Tensor pytorch_hook(const Setting& setting,
                        const std::vector<std::vector<std::size_t>>& buckets, std::int64_t numel) {
  const fs::path python = source_dir() / ".venv/bin/python";
  if (!fs::exists(python)) {
    ADD_FAILURE() << "no " << python << ": cannot run PyTorch's powerSGD_hook";
    return {};
  }
  TempDir dir;
  {
    std::ofstream spec(dir / "spec.txt");
    for (const auto& shape : kCompressedShapes) {
      for (std::size_t d = 0; d < shape.size(); ++d) spec << (d ? "x" : "") << shape[d];
      spec << ' ';
    }
    spec << '\n';
    for (const auto& bucket : buckets) {
      for (std::size_t i : bucket) spec << i << ' ';
      spec << '\n';
    }
  }
  const CommandResult hook = run_command(
      {python.string(), (source_dir() / "tests/unit/powersgd_hook.py").string(),
       (dir / "spec.txt").string(), std::to_string(setting.ranks), std::to_string(kSteps),
       std::to_string(setting.matrix_rank), std::to_string(kStartStep),
       std::to_string(setting.bucket_cap_mb), (dir / "out.f32").string()},
      {}, 300);
  EXPECT_EQ(hook.exit_code, 0) << describe(hook);
  at::Tensor values = at::empty({numel}, at::kFloat);
  std::ifstream in(dir / "out.f32", std::ios::binary);
  in.read(reinterpret_cast<char*>(values.data_ptr<float>()),
          static_cast<std::streamsize>(numel * 4));
  EXPECT_EQ(in.gcount(), numel * 4) << "PyTorch's hook wrote another number of values";
  return values;
}

void expect_matches_pytorch(const Setting& setting) {
  const std::vector<Reduced> ranks = reduce(setting.reduction());
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    EXPECT_TRUE(at::equal(ranks[r].averaged, ranks[0].averaged)) << "rank " << r;
  }
  const at::Tensor ours = ranks[0].averaged;
  const at::Tensor theirs = pytorch_hook(setting, ranks[0].buckets, ours.numel());
  ASSERT_TRUE(theirs.defined());
  const std::int64_t per_step = ours.numel() / kSteps;
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor a = ours.narrow(0, step * per_step, per_step);
    const at::Tensor b = theirs.narrow(0, step * per_step, per_step);
    EXPECT_TRUE(at::allclose(a, b, 1.3e-6, 1e-5))
        << "step " << step << ": differs from PyTorch's powerSGD_hook by up to "
        << (a - b).abs().max().item<double>();
  }
  // The comparison can fail: compressed steps are far from the exact mean of the gradients.
  const at::Tensor exact = exact_means(setting.ranks, kSteps, ranks[0].buckets);
  const std::int64_t plain = kStartStep * per_step;
  EXPECT_TRUE(at::allclose(ours.narrow(0, 0, plain), exact.narrow(0, 0, plain), 1.3e-6, 1e-5))
      << "before start_step the buckets are plain averages";
  const at::Tensor compressed = ours.narrow(0, plain, ours.numel() - plain);
  EXPECT_GT((compressed - exact.narrow(0, plain, compressed.numel())).abs().max().item<double>(),
            0.1);
}

TEST(PowerSgd, TwoRanksOneBucketMatchPyTorchsHook) {
  const Setting setting{2, 25, 2};
  expect_matches_pytorch(setting);
}

TEST(PowerSgd, FourRanksTwoBucketsAtRankFourMatchPyTorchsHook) {
  // Rank 4 orthogonalises by QR, rank 2 by Gram-Schmidt, as the hook chooses.
  // 2600-byte buckets: PyTorch's assignment (parameters in order) and the reducer's (in reverse)
  // both cut the parameters into {0, 1, 2} and {3, 4, 5, 6}.
  const Setting setting{4, 0.00248, 4};
  ReductionSetting plain_setting{1, 1, setting.bucket_cap_mb, "", ""};
  const std::vector<Reduced> plain = reduce(plain_setting);
  ASSERT_EQ(plain[0].buckets.size(), 2u) << "the setting is meant to make two buckets";
  expect_matches_pytorch(setting);
}

}  // namespace
}  // namespace trainyard::testing
