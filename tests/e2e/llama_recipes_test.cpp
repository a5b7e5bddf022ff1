// The bundled Llama recipes as shipped (recipes/llama_text.toml from scratch with its tokenizer,
// recipes/llama_finetune.toml from a Hugging Face folder) and the files they read, which
// tools/make_llama_assets.py makes in data/llama (tools/setup runs it).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 12;

fs::path assets() { return source_dir() / "data" / "llama"; }
fs::path venv_python() { return source_dir() / ".venv" / "bin" / "python"; }

// data/llama as tools/setup leaves it; its absence fails the test, naming what makes it.
::testing::AssertionResult assets_present() {
  for (const char* file : {"tokenizer.json", "tiny-llama/model.safetensors",
                           "tiny-llama/config.json", "tiny-llama/tokenizer.json"}) {
    if (!fs::is_regular_file(assets() / file)) {
      return ::testing::AssertionFailure()
             << assets() / file << " is missing: tools/setup makes it (tools/make_llama_assets.py)";
    }
  }
  return ::testing::AssertionSuccess();
}

double mean(const std::vector<double>& values, std::size_t begin, std::size_t end) {
  return std::accumulate(values.begin() + begin, values.begin() + end, 0.0) / (end - begin);
}

// One logged loss per step, finite, starting near ln(vocabulary) (a model that knows nothing
// yet: both recipes start from random weights) and falling: the last three steps' mean below
// the first three's.
void expect_training_losses(const fs::path& out) {
  const std::vector<double> losses = logged_train_losses(out);
  ASSERT_EQ(losses.size(), static_cast<std::size_t>(kSteps));
  for (std::size_t i = 0; i < losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(losses[i])) << "step " << i + 1 << ": " << losses[i];
  }
  EXPECT_NEAR(losses.front(), std::log(2048.0), 0.1);
  EXPECT_LT(mean(losses, kSteps - 3, kSteps), mean(losses, 0, 3) - 0.03)
      << "first " << losses.front() << ", last " << losses.back();
}

// The run's state before the first step, by name, holds exactly the folder's tensors with their
// values (read with Python's safetensors and torch, not the readers under test) and the LoRA
// adapters beside them; at the end every adapter has trained and every tensor of the folder is
// as it was: the base model is frozen.
constexpr const char* kCompareStates = R"(
import sys, torch, torch.jit._pickle
from safetensors.torch import load_file
initial_file, final_file, weights_file = sys.argv[1:4]
def load(path):
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        return torch.load(path, weights_only=True)
published, initial, final = load_file(weights_file), load(initial_file), load(final_file)
problems = []
adapters = sorted(set(initial) - set(published))
if not set(published) <= set(initial) or set(final) != set(initial):
    problems.append(f"names: folder {sorted(published)}, initial {sorted(initial)}, "
                    f"final {sorted(final)}")
for name in adapters:
    if ".lora_A." not in name and ".lora_B." not in name:
        problems.append(f"initial {name} is neither the folder's nor an adapter")
    elif torch.equal(final[name], initial[name]):
        problems.append(f"adapter {name} did not train")
for name, tensor in published.items():
    if name in initial and not torch.equal(initial[name], tensor):
        problems.append(f"initial {name} is not the folder's")
    if name in final and not torch.equal(final[name], tensor):
        problems.append(f"final {name} changed, but the base is frozen")
print(f"{len(published)} tensors of the folder and {len(adapters)} adapters compared")
sys.exit("\n".join(problems) if problems else 0)
)";

TEST(LlamaRecipes, LlamaTextTrainsFromScratchWithItsTokenizer) {
  ASSERT_TRUE(assets_present());
  TempDir dir;
  auto run = validate_and_launch_bundled_recipe("llama_text.toml", 1, kSteps, 1, dir / "run");
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_HAS(run.err, "data/llama/tokenizer.json, vocabulary 2048");
  expect_training_losses(dir / "run");
}

TEST(LlamaRecipes, LlamaFinetuneStartsFromTheFoldersWeightsAndTrainsItsAdaptersAlone) {
  ASSERT_TRUE(assets_present());
  TempDir dir;
  auto run = validate_and_launch_bundled_recipe(
      "llama_finetune.toml", 1, kSteps, 1, dir / "run",
      {"--set", "run.initial_model_file=" + (dir / "initial.pt").string()});
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_HAS(run.err, "data/llama/tiny-llama/tokenizer.json, vocabulary 2048");
  expect_training_losses(dir / "run");
  auto compared = run_command(
      {venv_python().string(), "-c", kCompareStates, (dir / "initial.pt").string(),
       (dir / "run" / "final.pt").string(), (assets() / "tiny-llama/model.safetensors").string()},
      {}, 120);
  EXPECT_EQ(compared.exit_code, 0) << describe(compared);
  // 4 layers of 9, the embedding and the norm; 4 layers of 7 projections of 2 adapters.
  EXPECT_HAS(compared.out, "38 tensors of the folder and 56 adapters compared");
}

// The recipes copied where no data/llama is beside them, then beside a model folder without its
// weights: validate stops in one line naming the missing file.
TEST(LlamaRecipes, AMissingAssetIsAOneLineErrorNamingTheFile) {
  TempDir dir;
  fs::create_directories(dir / "recipes");
  for (const char* recipe : {"llama_text.toml", "llama_finetune.toml"}) {
    fs::copy_file(source_dir() / "recipes" / recipe, dir / "recipes" / recipe);
  }
  struct Case {
    std::string recipe;
    std::string expected;
  };
  const std::vector<Case> before = {
      {"llama_text.toml", "dataset.tokenizer does not load: " +
                              (dir / "recipes/../data/llama/tokenizer.json").string() +
                              ": cannot read: No such file or directory"},
      {"llama_finetune.toml",
       "dataset.tokenizer does not load: " +
           (dir / "recipes/../data/llama/tiny-llama/tokenizer.json").string() +
           ": cannot read: No such file or directory"}};
  const auto expect_one_line = [&](const Case& c) {
    SCOPED_TRACE(c.recipe);
    auto result = run_host({"validate", (dir / "recipes" / c.recipe).string()}, {}, 120);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_HAS(result.err, c.expected);
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  };
  for (const Case& c : before) expect_one_line(c);

  ASSERT_TRUE(assets_present());
  fs::create_directories(dir / "data/llama/tiny-llama");
  for (const char* file : {"config.json", "tokenizer.json"}) {
    fs::copy_file(assets() / "tiny-llama" / file, dir / "data/llama/tiny-llama" / file);
  }
  expect_one_line({"llama_finetune.toml", (dir / "recipes/../data/llama/tiny-llama").string() +
                                              " holds neither model.safetensors nor "
                                              "model.safetensors.index.json"});
}

// tools/make_llama_assets.py into a fresh folder gives data/llama's bytes (the same corpus and
// script, the same files); run again it keeps a complete folder as it is, and a damaged file is
// made again.
TEST(LlamaAssets, TheScriptMakesTheSameBytesKeepsThemAndRepairsThem) {
  ASSERT_TRUE(assets_present());
  TempDir dir;
  const fs::path out = dir / "llama";
  const auto make = [&] {
    return run_command(
        {venv_python().string(), (source_dir() / "tools" / "make_llama_assets.py").string(),
         "--out", out.string()},
        {}, 300);
  };
  const fs::path weights = out / "tiny-llama" / "model.safetensors";
  const auto same_as_data = [&](const std::string& file) {
    return read_text(out / file) == read_text(assets() / file);
  };

  auto made = make();
  ASSERT_EQ(made.exit_code, 0) << describe(made);
  EXPECT_HAS(made.out, "make_llama_assets: wrote " + out.string());
  EXPECT_TRUE(same_as_data("assets.json"))
      << assets() << " is not what the script makes now (tools/setup brings it up to date):\n"
      << read_text(out / "assets.json") << "against\n"
      << read_text(assets() / "assets.json");
  EXPECT_TRUE(same_as_data("tiny-llama/model.safetensors"));
  EXPECT_TRUE(same_as_data("tokenizer.json"));

  const auto written = fs::last_write_time(weights);
  auto again = make();
  ASSERT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_EQ(again.out, "");
  EXPECT_EQ(fs::last_write_time(weights), written);

  fs::resize_file(weights, fs::file_size(weights) / 2);
  auto repaired = make();
  ASSERT_EQ(repaired.exit_code, 0) << describe(repaired);
  EXPECT_HAS(repaired.out, "make_llama_assets: wrote");
  EXPECT_TRUE(same_as_data("tiny-llama/model.safetensors"));
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(left, std::vector<std::string>{"llama"});  // no temporary folder left beside it
}

}  // namespace
}  // namespace trainyard::testing
