#include "single_parity.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {

namespace fs = std::filesystem;

namespace {

constexpr double kRtol = 1.3e-6;
constexpr double kAtol = 1e-5;
constexpr int kSteps = 6;
const fs::path kCorpus = "/usr/share/games/fortunes";

// The recipe's settings that keep a run to a few seconds; the dataset's token cache is shared by
// the runs of one test.
std::vector<std::string> small_gpt_text(const fs::path& cache, std::int64_t batch) {
  return {"--set", "run.max_steps=" + std::to_string(kSteps), "--set", "run.log_every=1", "--set",
          "run.eval=false", "--set", "model.n_layers=2", "--set", "model.n_heads=2", "--set",
          "model.d_model=32", "--set", "dataset.seq_len=32",
          // Full learning rate from the third step, so the parameters move well beyond atol.
          "--set", "scheduler.warmup_steps=2", "--set", "dataset.cache=" + cache.string(), "--set",
          "loader.batch_size=" + std::to_string(batch)};
}

}  // namespace

void expect_matches_single(const std::string& strategy, const std::vector<std::string>& options,
                           int ranks, std::int64_t batch) {
  if (!fs::exists(kCorpus)) TRAINYARD_SKIP_MISSING() << kCorpus << " missing (fortunes)";
  TempDir dir;
  const fs::path recipe = source_dir() / "recipes" / "gpt_text.toml";
  auto single =
      run_one_process(recipe, dir / "single", small_gpt_text(dir / "cache", ranks * batch));
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  std::vector<std::string> extra = small_gpt_text(dir / "cache", batch);
  extra.insert(extra.end(), {"--set", "strategy.plugin=" + strategy});
  extra.insert(extra.end(), options.begin(), options.end());
  const fs::path out = dir / strategy;
  auto run = run_launched(ranks, recipe, out, extra);
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  ASSERT_EQ(logged_train_losses(dir / "single").size(), static_cast<std::size_t>(kSteps));
  expect_same_losses_within(dir / "single", out, kRtol, kAtol);
  expect_same_model_within(dir / "single" / "final.pt", out / "final.pt", kRtol, kAtol);
}

std::vector<std::string> sharding(const std::string& mode) {
  return {"--set", "strategy.sharding=" + mode};
}

}  // namespace trainyard::testing
