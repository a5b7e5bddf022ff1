#pragma once
// The small models that parity tests train on a device mesh (ddp, fsdp, pipeline, tensor
// parallel and their products) and the --set arguments of each layout, shared by the test
// binaries that compare layouts with one process.

#include <filesystem>
#include <string>
#include <vector>

namespace trainyard::testing {

// PyTorch's fp32 tolerances for the logged losses; parameters after several steps of different
// summation orders get the looser pair.
inline constexpr double kLossRtol = 1.3e-6;
inline constexpr double kLossAtol = 1e-5;
inline constexpr double kParameterRtol = 1e-5;
inline constexpr double kParameterAtol = 4e-5;

// A 4-head gpt on synthetic token sequences (a map-style dataset, so runs can reshard
// mid-epoch), a global batch of 16, trained with SGD for `steps` steps: the attention's key bias
// has a gradient that is zero but for rounding (softmax ignores a shift shared by every key), and
// Adam would scale that rounding, which differs with the summation order of every split, up to
// full-size updates. Dropout is off: with sequence parallelism each rank draws the masks of its
// own slice of the sequence, which cannot equal one process's masks over the whole sequence.
std::string gpt_recipe(int steps);

// gpt_recipe with the llama in the gpt's place, configured by `config` (a TOML inline table of
// LlamaConfig keys) and `model_lines` (more of its options).
std::string llama_recipe(int steps, const std::string& config, const std::string& model_lines = "");

// `a` followed by `b`.
std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b);

// dp x pp x tp: the strategy (ddp without a pipeline), the mesh and the per-rank batch that
// keeps the global batch at 16.
std::vector<std::string> layout_sets(int dp, int pp, int tp);

// The run in `run` logged the losses and gradient norms of the one in `single` and ended with
// its parameters, within the tolerances above.
void expect_matches(const std::filesystem::path& single, const std::filesystem::path& run);

}  // namespace trainyard::testing
