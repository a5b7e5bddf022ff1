#include "parity_runs.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "metrics_file.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard::testing {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> run_arguments(const fs::path& recipe, const fs::path& out,
                                       const std::vector<std::string>& extra) {
  std::vector<std::string> args = {recipe.string(),
                                   "--set",
                                   "run.threads=1",
                                   "--set",
                                   "run.output_dir=" + out.string(),
                                   "--set",
                                   "run.final_model_file=" + (out / "final.pt").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

CommandResult run_one_process(const fs::path& recipe, const fs::path& out,
                              const std::vector<std::string>& extra,
                              const std::vector<std::string>& env, int timeout_s) {
  std::vector<std::string> argv = {host_binary().string(), "run"};
  for (auto& arg : run_arguments(recipe, out, extra)) argv.push_back(arg);
  return run_command(argv, source_dir(), timeout_s, env);
}

CommandResult run_launched(int ranks, const fs::path& recipe, const fs::path& out,
                           const std::vector<std::string>& extra,
                           const std::vector<std::string>& env, int timeout_s) {
  return run_launcher({"--nproc-per-node", std::to_string(ranks)}, recipe, out, extra, env,
                      timeout_s);
}

CommandResult run_launcher(const std::vector<std::string>& launch_options, const fs::path& recipe,
                           const fs::path& out, const std::vector<std::string>& extra,
                           const std::vector<std::string>& env, int timeout_s) {
  std::vector<std::string> argv = {host_binary().string(), "launch"};
  argv.insert(argv.end(), launch_options.begin(), launch_options.end());
  for (auto& arg : run_arguments(recipe, out, extra)) argv.push_back(arg);
  return run_command(argv, source_dir(), timeout_s, env);
}

TensorMap exported_checkpoint(const fs::path& checkpoint, const fs::path& out) {
  auto exported = run_command({host_binary().string(), "checkpoint", "export", checkpoint.string(),
                               "--format", "safetensors", "--out", out.string()},
                              source_dir(), 120);
  EXPECT_EQ(exported.exit_code, 0) << describe(exported);
  if (exported.exit_code != 0) return {};
  Registry registry;
  load_bundled_plugins(registry);
  auto safetensors =
      registry.create<CheckpointBackend>("safetensors", Config({}, "checkpoint"), BuildContext{});
  return safetensors->read(out).tensors;
}

CommandResult validate_and_launch_bundled_recipe(const std::string& file, int ranks, int steps,
                                                 int log_every, const fs::path& out,
                                                 const std::vector<std::string>& extra) {
  const fs::path recipe = source_dir() / "recipes" / file;
  auto validated =
      run_command({host_binary().string(), "validate", recipe.string()}, source_dir(), 120);
  EXPECT_EQ(validated.exit_code, 0) << describe(validated);
  std::vector<std::string> settings = {"--set", "run.max_steps=" + std::to_string(steps),
                                       "--set", "run.log_every=" + std::to_string(log_every),
                                       "--set", "run.eval=false",
                                       "--set", "dataset.cache=" + (out / "cache").string()};
  settings.insert(settings.end(), extra.begin(), extra.end());
  return run_launched(ranks, recipe, out, settings);
}

namespace {

// Every training record of the run in `out` (metrics.jsonl, or rank 0's metrics file).
std::vector<MetricLine> train_records(const fs::path& out) {
  const fs::path file =
      fs::exists(out / "metrics.jsonl") ? out / "metrics.jsonl" : out / "metrics.rank0.jsonl";
  return of_phase(read_metrics(file), "train");
}

// `figure` of every training record of the run in `out`.
std::vector<double> logged_train_figures(const fs::path& out, const std::string& figure) {
  std::vector<double> values;
  for (const auto& line : train_records(out)) values.push_back(line.at(figure));
  return values;
}

}  // namespace

std::vector<double> logged_train_losses(const fs::path& out) {
  return logged_train_figures(out, "loss");
}

void expect_same_model_within(const fs::path& expected_file, const fs::path& actual_file,
                              double rtol, double atol) {
  TensorMap expected = read_tensor_file(expected_file);
  TensorMap actual = read_tensor_file(actual_file);
  ASSERT_EQ(expected.size(), actual.size()) << actual_file;
  ASSERT_FALSE(expected.empty());
  for (const auto& [name, tensor] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << actual_file << ": " << name;
    at::Tensor a = it->second.to(at::kDouble);
    at::Tensor e = tensor.to(at::kDouble);
    ASSERT_EQ(a.sizes(), e.sizes()) << name;
    const double worst = ((a - e).abs() - (atol + rtol * e.abs())).max().item<double>();
    EXPECT_TRUE(at::allclose(a, e, rtol, atol))
        << actual_file << " " << name << ": worst excess over the tolerance " << worst;
  }
}

void expect_same_losses_within(const fs::path& expected, const fs::path& actual, double rtol,
                               double atol) {
  const std::vector<double> e = logged_train_losses(expected);
  const std::vector<double> a = logged_train_losses(actual);
  ASSERT_EQ(e.size(), a.size()) << actual;
  ASSERT_FALSE(e.empty());
  for (std::size_t i = 0; i < e.size(); ++i) {
    EXPECT_LE(std::abs(a[i] - e[i]), atol + rtol * std::abs(e[i]))
        << actual << " step " << i + 1 << ": loss " << a[i] << " against " << e[i];
  }
}

void expect_same_grad_norms_within(const fs::path& expected, const fs::path& actual,
                                   double rtol, double atol) {
  const std::vector<double> e = logged_train_figures(expected, "grad_norm");
  const std::vector<double> a = logged_train_figures(actual, "grad_norm");
  ASSERT_EQ(e.size(), a.size()) << actual;
  ASSERT_FALSE(e.empty());
  for (std::size_t i = 0; i < e.size(); ++i) {
    EXPECT_LE(std::abs(a[i] - e[i]), atol + rtol * std::abs(e[i]))
        << actual << " record " << i + 1 << ": grad_norm " << a[i] << " against " << e[i];
  }
  // Per block (run.grad_norm_blocks), where the expected run logged them: the same blocks, each
  // within the tolerance, and their squares adding up to the total's.
  const std::vector<MetricLine> expected_records = train_records(expected);
  const std::vector<MetricLine> actual_records = train_records(actual);
  for (std::size_t i = 0; i < expected_records.size(); ++i) {
    double squares = 0;
    bool per_block = false;
    for (const auto& [key, value] : expected_records[i].values) {
      if (!key.starts_with("grad_norm/")) continue;
      per_block = true;
      ASSERT_TRUE(actual_records[i].has(key)) << actual << " record " << i + 1 << ": no " << key;
      const double got = actual_records[i].at(key);
      EXPECT_LE(std::abs(got - value), atol + rtol * std::abs(value))
          << actual << " record " << i + 1 << ": " << key << " " << got << " against " << value;
      squares += got * got;
    }
    if (per_block) {
      EXPECT_NEAR(std::sqrt(squares), a[i], 1e-5 + 1e-4 * a[i])
          << actual << " record " << i + 1 << ": the blocks' norms against grad_norm";
    }
  }
}

}  // namespace trainyard::testing
