#include "mesh_recipes.hpp"

#include "parity_runs.hpp"

namespace trainyard::testing {

std::string gpt_recipe(int steps) {
  return R"(
[run]
seed = 7
max_steps = )" +
         std::to_string(steps) +
         R"(
eval = false
log_every = 1

[loader]
workers = 0
batch_size = 16

[dataset]
plugin = "synthetic"
samples = 512
eval_samples = 0
input_shape = [16]
vocab_size = 64

[model]
plugin = "gpt"
n_layers = 4
n_heads = 4
d_model = 32
dropout = 0.0

[optimizer]
plugin = "sgd"
lr = 0.1
momentum = 0.9

[sinks.console]
[sinks.jsonl]
)";
}

std::string llama_recipe(int steps, const std::string& config, const std::string& model_lines) {
  std::string recipe = gpt_recipe(steps);
  const std::string gpt_model =
      "plugin = \"gpt\"\nn_layers = 4\nn_heads = 4\nd_model = 32\ndropout = 0.0\n";
  recipe.replace(recipe.find(gpt_model), gpt_model.size(),
                 "plugin = \"llama\"\nconfig = " + config + "\n" + model_lines);
  return recipe;
}

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::string> layout_sets(int dp, int pp, int tp) {
  std::vector<std::string> sets = {"--set", "parallel.pp=" + std::to_string(pp),
                                   "--set", "parallel.tp=" + std::to_string(tp),
                                   "--set", "loader.batch_size=" + std::to_string(16 / dp)};
  if (pp > 1) {
    return joined(sets, {"--set", "strategy.plugin=pipeline", "--set",
                         "strategy.micro_batches=" + std::to_string(pp > 2 ? pp : 4)});
  }
  return joined(sets, {"--set", "strategy.plugin=ddp"});
}

void expect_matches(const std::filesystem::path& single, const std::filesystem::path& run) {
  expect_same_losses_within(single, run, kLossRtol, kLossAtol);
  expect_same_grad_norms_within(single, run, kLossRtol, kLossAtol);
  expect_same_model_within(single / "final.pt", run / "final.pt", kParameterRtol, kParameterAtol);
}

}  // namespace trainyard::testing
