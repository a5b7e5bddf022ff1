// Whole runs of the host binary on real recipes: training, configuration output, resume.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

TEST(RunTest, ShortCnnRecipeLossFalls) {
  TempDir dir;
  auto result = run_host({"run", "recipes/fashion_mnist_cnn.toml", "--set", "run.max_steps=120",
                          "--set", "run.log_every=20", "--set", "run.eval_max_batches=10",
                          "--set", "run.output_dir=" + dir.path().string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  auto records = read_metrics(dir / "metrics.jsonl");
  auto train = of_phase(records, "train");
  ASSERT_GE(train.size(), 6u);
  EXPECT_LT(train.back().at("loss"), 0.75 * train.front().at("loss"))
      << "first " << train.front().at("loss") << " last " << train.back().at("loss");
  auto eval = of_phase(records, "eval");
  ASSERT_EQ(eval.size(), 1u);
  EXPECT_GT(eval.front().at("accuracy"), 0.5);
  // The console shows the progress lines the sink promises.
  EXPECT_NE(result.out.find("step 120/120"), std::string::npos) << result.out;
  EXPECT_TRUE(fs::exists(dir / "checkpoints")) << "the base recipe saves at the end";
}

TEST(RunTest, ShortMlpRecipeLossFalls) {
  TempDir dir;
  auto result = run_host({"run", "recipes/fashion_mnist_mlp.toml", "--set", "run.max_steps=100",
                          "--set", "run.log_every=20", "--set", "run.eval_max_batches=10",
                          "--set", "run.output_dir=" + dir.path().string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  auto train = of_phase(read_metrics(dir / "metrics.jsonl"), "train");
  ASSERT_GE(train.size(), 5u);
  EXPECT_LT(train.back().at("loss"), 0.75 * train.front().at("loss"));
}

// loader.eval_workers prepares evaluation batches on loader threads: the same batches in the
// same order, so the same evaluation, as in line (0); -1 (the default) follows the training
// loader.
TEST(RunTest, EvaluationLoaderWorkersGiveTheSameEvaluation) {
  std::vector<std::map<std::string, std::string>> evaluations;
  for (const char* workers : {"0", "2"}) {
    TempDir dir;
    auto result = run_host({"run", "recipes/fashion_mnist_mlp.toml", "--set", "run.max_steps=20",
                            "--set", "run.log_every=10", "--set", "run.eval_max_batches=6", "--set",
                            std::string("loader.eval_workers=") + workers, "--set",
                            "run.output_dir=" + dir.path().string()});
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    EXPECT_NE(result.err.find(std::string("evaluation loader: ") + workers +
                              " workers (loader.eval_workers)"),
              std::string::npos)
        << result.err;
    auto eval = of_phase(read_metrics(dir / "metrics.jsonl"), "eval");
    ASSERT_EQ(eval.size(), 1u);
    evaluations.push_back(eval.front().raw);
  }
  for (const char* key : {"loss", "accuracy", "samples"}) {
    EXPECT_EQ(evaluations[0].at(key), evaluations[1].at(key)) << key;
  }
}

TEST(RunTest, PrintConfigShowsEveryDefault) {
  auto result = run_host({"run", "recipes/fashion_mnist_cnn.toml", "--print-config", "--set",
                          "optimizer.lr=3e-4"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  for (const char* expected :
       {"[strategy]\nplugin = \"single\"", "[precision]\nplugin = \"fp32\"",
        "[scheduler]\nplugin = \"constant\"", "lr = 0.0003", "batch_size = 64",
        "channels = [32, 64]", "beta2 = 0.999", "[sinks.console]", "[sinks.jsonl]",
        "every_steps = 0"}) {
    EXPECT_NE(result.out.find(expected), std::string::npos) << expected << "\n" << result.out;
  }
  // The printed recipe is itself a valid recipe that resolves to the same thing.
  TempDir dir;
  auto printed = dir.write("printed.toml", result.out);
  auto again = run_host({"run", printed.string(), "--print-config"});
  ASSERT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_EQ(again.out, result.out);
}

// validate builds each recipe's model on the meta device.
TEST(RunTest, ValidateAcceptsEveryShippedRecipe) {
  for (const char* recipe :
       {"recipes/fashion_mnist_cnn.toml", "recipes/fashion_mnist_mlp.toml", "recipes/gpt_text.toml",
        "recipes/gpt_pipeline.toml", "recipes/gpt_3d.toml", "recipes/llama_text.toml",
        "recipes/llama_finetune.toml"}) {
    auto result = run_host({"validate", recipe}, {}, 300);
    EXPECT_EQ(result.exit_code, 0) << recipe << "\n" << describe(result);
    EXPECT_EQ(result.out, "");
  }
}

// A run whose loss overflows (and trains on past its non-finite steps): every line of the step
// record and of metrics.jsonl is valid JSON (JSON has no NaN), the non-finite loss written as
// null with its spelling beside it.
TEST(RunTest, NonFiniteLossesAreWrittenAsValidJson) {
  TempDir dir;
  auto result =
      run_host({"run", "recipes/fashion_mnist_mlp.toml", "--set", "run.max_steps=6", "--set",
                "run.log_every=1", "--set", "run.eval=false", "--set", "optimizer.plugin=sgd",
                "--set", "optimizer.lr=1e30", "--set", "run.on_nonfinite=skip", "--set",
                "run.max_nonfinite_in_a_row=6", "--set", "run.output_dir=" + dir.path().string(),
                "--set", "run.step_record_file=" + (dir / "steps.jsonl").string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  int nonfinite = 0;
  for (const auto& line : read_lines(dir / "steps.jsonl")) {
    const nlohmann::json record = parse_strict_json(line, "step record");
    if (record.at("loss").is_null()) {
      ++nonfinite;
      const std::string spelled = record.at("nonfinite_loss").get<std::string>();
      EXPECT_TRUE(spelled == "NaN" || spelled == "Infinity" || spelled == "-Infinity") << line;
    } else {
      EXPECT_TRUE(record.at("loss").is_number()) << line;
    }
  }
  EXPECT_GT(nonfinite, 0) << "lr 1e30 should overflow the loss within 6 steps";
  for (const auto& line : read_lines(dir / "metrics.jsonl")) {
    EXPECT_NO_THROW(parse_strict_json(line, "metrics line")) << line;
  }
}

// The run's closing summary shows counts (steps, samples, workers, threads) as integers, not as
// 2.0000.
TEST(RunTest, SummaryShowsCountsAsIntegers) {
  TempDir dir;
  auto result =
      run_host({"run", "recipes/fashion_mnist_mlp.toml", "--set", "run.max_steps=3", "--set",
                "run.eval=false", "--set", "run.output_dir=" + dir.path().string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const std::string all = result.out + result.err;
  EXPECT_HAS(all, "loader_workers 0 ");
  EXPECT_FALSE(std::regex_search(
      all, std::regex(R"(\b(steps|samples|loader_workers|compute_threads) [0-9]+\.[0-9])")))
      << all;
  for (const auto& line : read_lines(dir / "metrics.jsonl")) {
    const nlohmann::json record = parse_strict_json(line, "metrics line");
    if (record.value("phase", "") != "summary") continue;
    EXPECT_TRUE(record.at("steps").is_number_integer()) << line;
  }
}

TEST(RunTest, PluginsListsKindsVersionsPathsAndOptions) {
  auto result = run_host({"plugins"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  for (const char* expected :
       {"model cnn", "model mlp", "dataset fashion_mnist", "dataset synthetic", "optimizer sgd",
        "optimizer adamw", "scheduler warmup_cosine", "strategy single", "precision fp32",
        "checkpoint torch", "sink console", "sink jsonl", "device cpu", "device cuda",
        "channels : array of integers = [32, 64]", "lr : float = 0.001",
        "libtrainyard_model_cnn.so"}) {
    EXPECT_NE(result.out.find(expected), std::string::npos) << expected << "\n" << result.out;
  }
  auto models = run_host({"plugins", "model"});
  ASSERT_EQ(models.exit_code, 0);
  EXPECT_EQ(models.out.find("dataset "), std::string::npos);
}

// Plugins come from the install's folder, TRAINYARD_PLUGIN_PATH, --plugin-path and the recipe's
// plugin_paths — never from the current directory.
TEST(RunTest, PluginsAreFoundOnlyInExplicitPlaces) {
  const std::string host = host_binary().string();
  auto from_cwd = run_command({host, "plugins", "sink"}, test_plugin_folder());
  ASSERT_EQ(from_cwd.exit_code, 0) << describe(from_cwd);
  EXPECT_EQ(from_cwd.out.find("sink throwing"), std::string::npos) << from_cwd.out;

  auto from_env = run_command({host, "plugins", "sink"}, {}, 120,
                              {"TRAINYARD_PLUGIN_PATH=/nonexistent-plugin-folder:" +
                               (test_plugin_folder() / "libthrowing.so").string()});
  EXPECT_EQ(from_env.exit_code, 1) << "a missing entry is an error: " << describe(from_env);
  EXPECT_NE(from_env.err.find("/nonexistent-plugin-folder"), std::string::npos) << from_env.err;
  auto from_env_ok = run_command({host, "plugins", "sink"}, {}, 120,
                                 {"TRAINYARD_PLUGIN_PATH=" +
                                  (test_plugin_folder() / "libthrowing.so").string()});
  ASSERT_EQ(from_env_ok.exit_code, 0) << describe(from_env_ok);
  EXPECT_NE(from_env_ok.out.find("sink throwing"), std::string::npos) << from_env_ok.out;

  TempDir dir;
  auto recipe = dir.write("recipe.toml", "plugin_paths = [\"" +
                                             (test_plugin_folder() / "libthrowing.so").string() +
                                             "\"]\n[dataset]\nplugin = \"synthetic\"\n[model]\n"
                                             "plugin = \"mlp\"\n[optimizer]\nplugin = \"sgd\"\n"
                                             "[sinks.throwing]\n");
  auto from_recipe = run_host({"validate", recipe.string()});
  EXPECT_EQ(from_recipe.exit_code, 0) << describe(from_recipe);

  auto without = run_host({"validate", recipe.string(), "--no-default-plugins"});
  EXPECT_EQ(without.exit_code, 1);
  EXPECT_NE(without.err.find("unknown dataset plugin 'synthetic'"), std::string::npos)
      << without.err;
}

TEST(RunTest, HelpIsAvailableEverywhere) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--help"}, {"run", "--help"}, {"validate", "--help"}, {"plugins", "--help"}}) {
    auto result = run_host(args);
    EXPECT_EQ(result.exit_code, 0) << args[0];
    EXPECT_NE(result.out.find("usage: trainyard"), std::string::npos) << result.out;
  }
}

// N steps, then a resumed run to 2N, equals 2N steps in one go: same losses to the last digit.
TEST(RunTest, ResumeContinuesExactly) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", R"(
[run]
seed = 3
epochs = 4
log_every = 5
[loader]
batch_size = 16
workers = 2
[dataset]
plugin = "synthetic"
samples = 320
eval_samples = 64
input_shape = [1, 8, 8]
[model]
plugin = "cnn"
channels = [4]
hidden = 16
dropout = 0.2
[optimizer]
plugin = "adamw"
[checkpoint]
plugin = "torch"
[sinks.jsonl]
)");
  auto run = [&](const std::string& out, int max_steps, bool resume) {
    std::vector<std::string> args = {"run", recipe.string(), "--set",
                                     "run.output_dir=" + (dir / out).string(), "--set",
                                     "run.max_steps=" + std::to_string(max_steps)};
    if (resume) args.insert(args.end(), {"--resume", "auto"});
    return run_host(args);
  };
  // 50 steps stop mid-epoch (20 steps per epoch).
  auto whole = run("whole", 70, false);
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  auto first = run("split", 50, false);
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  auto second = run("split", 70, true);
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.err.find("resumed from"), std::string::npos) << second.err;

  auto whole_train = of_phase(read_metrics(dir / "whole" / "metrics.jsonl"), "train");
  auto split_train = of_phase(read_metrics(dir / "split" / "metrics.jsonl"), "train");
  ASSERT_FALSE(split_train.empty());
  ASSERT_GE(whole_train.size(), split_train.size());
  // The resumed run's records are the tail of the uninterrupted run's, bit for bit.
  auto offset = whole_train.size() - split_train.size();
  for (std::size_t i = 0; i < split_train.size(); ++i) {
    EXPECT_EQ(split_train[i].at("step"), whole_train[offset + i].at("step"));
    EXPECT_EQ(split_train[i].raw.at("loss"), whole_train[offset + i].raw.at("loss"))
        << "step " << split_train[i].at("step");
  }
  auto whole_eval = of_phase(read_metrics(dir / "whole" / "metrics.jsonl"), "eval");
  auto split_eval = of_phase(read_metrics(dir / "split" / "metrics.jsonl"), "eval");
  ASSERT_FALSE(split_eval.empty());
  EXPECT_EQ(split_eval.back().raw.at("loss"), whole_eval.back().raw.at("loss"));
}

}  // namespace
}  // namespace trainyard::testing
