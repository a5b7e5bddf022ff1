#pragma once
// Runs of the host binary that parity tests compare: one process, or several under `trainyard
// launch` over loopback, each writing its final model and jsonl metrics into its own folder.

#include <filesystem>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/batch.hpp"

namespace trainyard::testing {

// `trainyard run recipe` in one process (1 thread), output in `out`, final model out/final.pt.
CommandResult run_one_process(const std::filesystem::path& recipe, const std::filesystem::path& out,
                              const std::vector<std::string>& extra,
                              const std::vector<std::string>& env = {}, int timeout_s = 600);

// `trainyard launch --nproc-per-node ranks recipe`, as above.
CommandResult run_launched(int ranks, const std::filesystem::path& recipe,
                           const std::filesystem::path& out, const std::vector<std::string>& extra,
                           const std::vector<std::string>& env = {}, int timeout_s = 600);

// `trainyard launch LAUNCH_OPTIONS recipe`, as above (launch_options: --nproc-per-node N and
// any others).
CommandResult run_launcher(const std::vector<std::string>& launch_options,
                           const std::filesystem::path& recipe, const std::filesystem::path& out,
                           const std::vector<std::string>& extra,
                           const std::vector<std::string>& env = {}, int timeout_s = 600);

// `trainyard checkpoint export CHECKPOINT --format safetensors` into `out`, read back by the
// safetensors backend: the whole model the checkpoint's pieces assemble into. Empty (with a
// test failure naming the command's output) when the export fails.
TensorMap exported_checkpoint(const std::filesystem::path& checkpoint,
                              const std::filesystem::path& out);

// A recipe of the repository (`recipes/<file>`) validates, then trains for `steps` steps logged
// every `log_every` under `trainyard launch` on `ranks` processes into `out` (evaluation off,
// its dataset cache there too, `extra` arguments after those): the run's result.
CommandResult validate_and_launch_bundled_recipe(const std::string& file, int ranks, int steps,
                                                 int log_every, const std::filesystem::path& out,
                                                 const std::vector<std::string>& extra = {});

// The logged training losses of the run in `out` (metrics.jsonl, or rank 0's metrics file).
std::vector<double> logged_train_losses(const std::filesystem::path& out);

// Every tensor of `actual_file` within `rtol`/`atol` of `expected_file`'s (same names and
// shapes), reporting the worst excess over the tolerance.
void expect_same_model_within(const std::filesystem::path& expected_file,
                              const std::filesystem::path& actual_file, double rtol, double atol);

// The runs' logged losses agree step by step within `rtol`/`atol`.
void expect_same_losses_within(const std::filesystem::path& expected,
                               const std::filesystem::path& actual, double rtol, double atol);

// The runs' logged gradient norms (before clipping, every strategy's over the whole model)
// agree record by record within `rtol`/`atol`.
void expect_same_grad_norms_within(const std::filesystem::path& expected,
                                   const std::filesystem::path& actual, double rtol, double atol);

}  // namespace trainyard::testing
