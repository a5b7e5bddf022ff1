// Unit tests of trainyard/recipe.hpp: parsing, extends, --set overrides, resolution against the
// bundled plugins, and printing.

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;


Value table_value(std::shared_ptr<const Table> table) { return Value(std::move(table)); }

const Value& lookup(const Table& root, const std::string& section, const std::string& key) {
  return root.at(section).as_table().at(key);
}

// The minimal recipe the bundled plugins accept.
constexpr const char* kMinimal =
    "[dataset]\nplugin = \"synthetic\"\n"
    "[model]\nplugin = \"mlp\"\n"
    "[optimizer]\nplugin = \"sgd\"\n";

class RecipeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new Registry();
    testing::load_bundled_plugins(*registry_);
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  static const Registry& registry() { return *registry_; }

  Recipe write_and_load(const std::string& text, const std::vector<std::string>& overrides = {}) {
    return load_recipe(dir_.write("recipe.toml", text), overrides);
  }
  // The minimal recipe with a [parallel] section (or none), resolved.
  Recipe resolve_parallel(const std::string& parallel) {
    return resolve_recipe(write_and_load(std::string(kMinimal) + parallel), registry());
  }
  std::string error_resolving_parallel(const std::string& parallel) {
    try {
      resolve_parallel(parallel);
    } catch (const Error& error) {
      return error.what();
    }
    return "";
  }

  TempDir dir_;
  static Registry* registry_;
};
Registry* RecipeTest::registry_ = nullptr;

TEST_F(RecipeTest, ParseTomlKeepsLocations) {
  auto root = parse_toml("name = \"x\"\n\n[run]\nepochs = 3\n  seed = 9\n", "r.toml");
  EXPECT_EQ(root->at("name").as_string(), "x");
  const Table& run = root->at("run").as_table();
  EXPECT_EQ(run.at("epochs").as_integer(), 3);
  EXPECT_EQ(run.at("epochs").where().str(), "r.toml:4:10");
  EXPECT_EQ(run.at("seed").where().str(), "r.toml:5:10");
  EXPECT_EQ(run.where.line, 3);
  EXPECT_EQ(run.where.file, "r.toml");
}

TEST_F(RecipeTest, SyntaxErrorIsLocated) {
  std::string message = error_of([] { parse_toml("[run]\nepochs = 3\nseed = = 4\n", "bad.toml"); });
  EXPECT_HAS(message, "bad.toml:3:");
  // Through a file, too.
  fs::path file = dir_.write("broken.toml", "[run]\n\nepochs = [1, 2\n");
  std::string from_file = error_of([&] { load_recipe(file); });
  EXPECT_HAS(from_file, "broken.toml:");
  EXPECT_HAS(from_file, ":3:");
}

TEST_F(RecipeTest, DatesAreRefused) {
  EXPECT_HAS(error_of([] { parse_toml("[run]\nwhen = 2024-01-01\n", "d.toml"); }), "d.toml:2:");
}

TEST_F(RecipeTest, ExtendsChainOfThreeMerges) {
  dir_.write("base/grand.toml",
             "name = \"grand\"\n"
             "[run]\nepochs = 1\nseed = 7\n"
             "[optimizer]\nplugin = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n"
             "[extra.inner]\nx = 1\ny = 2\n");
  dir_.write("base/parent.toml",
             "extends = \"grand.toml\"\n"
             "[run]\nepochs = 2\n"
             "[optimizer]\nlr = 0.2\n"
             "[extra.inner]\ny = 3\n");
  fs::path child = dir_.write("child.toml",
                              "extends = \"base/parent.toml\"\n"
                              "name = \"child\"\n"
                              "[run]\nepochs = 3\n"
                              "[extra.inner]\nz = 4\n");
  Recipe recipe = load_recipe(child);
  const Table& root = *recipe.root;
  EXPECT_FALSE(root.contains("extends"));
  EXPECT_EQ(recipe.name(), "child");
  EXPECT_EQ(recipe.path, child);
  EXPECT_EQ(lookup(root, "run", "epochs").as_integer(), 3);
  EXPECT_EQ(lookup(root, "run", "seed").as_integer(), 7);
  EXPECT_EQ(lookup(root, "optimizer", "plugin").as_string(), "sgd");
  EXPECT_DOUBLE_EQ(lookup(root, "optimizer", "lr").as_float(), 0.2);
  EXPECT_DOUBLE_EQ(lookup(root, "optimizer", "momentum").as_float(), 0.9);
  const Table& inner = root.at("extra").as_table().at("inner").as_table();
  EXPECT_EQ(inner.at("x").as_integer(), 1);
  EXPECT_EQ(inner.at("y").as_integer(), 3);
  EXPECT_EQ(inner.at("z").as_integer(), 4);
  // Every value keeps the file that wrote it.
  EXPECT_HAS(lookup(root, "run", "epochs").where().str(), "child.toml:4:");
  EXPECT_HAS(lookup(root, "optimizer", "lr").where().str(), "parent.toml:5:");
  EXPECT_HAS(lookup(root, "run", "seed").where().str(), "grand.toml:4:");
}

TEST_F(RecipeTest, ExtendsCycleNamesTheChain) {
  dir_.write("a.toml", "extends = \"b.toml\"\n[run]\nepochs = 1\n");
  dir_.write("b.toml", "extends = \"c.toml\"\n");
  dir_.write("c.toml", "extends = \"a.toml\"\n");
  std::string message = error_of([&] { load_recipe(dir_ / "a.toml"); });
  EXPECT_HAS(message, "cycle");
  EXPECT_HAS(message, "a.toml");
  EXPECT_HAS(message, "b.toml");
  EXPECT_HAS(message, "c.toml");
  EXPECT_LT(message.find("a.toml"), message.find("b.toml"));
  EXPECT_LT(message.find("b.toml"), message.find("c.toml"));

  dir_.write("self.toml", "extends = \"./self.toml\"\n");
  EXPECT_HAS(error_of([&] { load_recipe(dir_ / "self.toml"); }), "cycle");
}

TEST_F(RecipeTest, ExtendsMissingFile) {
  fs::path file = dir_.write("a.toml", "\nextends = \"nowhere/base.toml\"\n");
  std::string message = error_of([&] { load_recipe(file); });
  EXPECT_HAS(message, "a.toml:2:");
  EXPECT_HAS(message, "nowhere/base.toml");
  EXPECT_HAS(error_of([&] { load_recipe(dir_ / "absent.toml"); }), "absent.toml");
  fs::path wrong = dir_.write("w.toml", "extends = 3\n");
  EXPECT_HAS(error_of([&] { load_recipe(wrong); }), "w.toml:1:");
}

TEST_F(RecipeTest, OverridesApplyLast) {
  Recipe recipe = write_and_load("[run]\nepochs = 1\neval = true\n[optimizer]\nlr = 0.1\n",
                                 {"run.epochs=5", "run.eval=false", "run.device=cuda",
                                  "optimizer.lr=3e-4", "sinks.jsonl.path=\"m.jsonl\"",
                                  "run.output_dir=/tmp/out dir", "optimizer.betas=[0.9, 0.99]"});
  const Table& root = *recipe.root;
  EXPECT_EQ(lookup(root, "run", "epochs"), Value(5));
  EXPECT_EQ(lookup(root, "run", "eval"), Value(false));
  EXPECT_EQ(lookup(root, "run", "device"), Value("cuda"));
  EXPECT_EQ(lookup(root, "run", "output_dir"), Value("/tmp/out dir"));
  EXPECT_EQ(lookup(root, "optimizer", "lr"), Value(3e-4));
  EXPECT_EQ(lookup(root, "optimizer", "betas"), Value(Array{Value(0.9), Value(0.99)}));
  const Table& jsonl = root.at("sinks").as_table().at("jsonl").as_table();
  EXPECT_EQ(jsonl.at("path"), Value("m.jsonl"));
  // The location of an override is the --set itself.
  EXPECT_HAS(lookup(root, "run", "epochs").where().str(), "--set run.epochs=5");
  // Later overrides win over earlier ones.
  Recipe twice = write_and_load("[run]\nepochs = 1\n", {"run.epochs=2", "run.epochs=3"});
  EXPECT_EQ(lookup(*twice.root, "run", "epochs"), Value(3));
}

TEST_F(RecipeTest, MalformedOverridesAreErrors) {
  std::string no_equals = error_of([&] { write_and_load("[run]\n", {"run.epochs"}); });
  EXPECT_HAS(no_equals, "--set run.epochs");
  EXPECT_HAS(no_equals, "section.key=value");
  EXPECT_HAS(error_of([&] { write_and_load("[run]\n", {"=3"}); }), "section.key=value");
  EXPECT_HAS(error_of([&] { write_and_load("[run]\n", {"run..epochs=3"}); }), "empty key");
  std::string not_table =
      error_of([&] { write_and_load("[run]\nepochs = 1\n", {"run.epochs.x=3"}); });
  EXPECT_HAS(not_table, "--set run.epochs.x=3");
  EXPECT_HAS(not_table, "not a table");
  EXPECT_HAS(not_table, "recipe.toml:2:");
}

TEST_F(RecipeTest, OverridesThatCannotBePrintedBackAreErrors) {
  // Not UTF-8: the printed recipe (--print-config, a checkpoint's copy) could not be read back.
  std::string bytes = error_of([&] { write_and_load("[run]\n", {"run.device=cu\xff" "da"}); });
  EXPECT_HAS(bytes, "--set run.device=cu\\xFFda: not valid UTF-8");
  EXPECT_HAS(error_of([&] { write_and_load("[run]\n", {"run.\xc0\xaf=1"}); }), "not valid UTF-8");
  // More than one value after '=' was silently cut to the first.
  EXPECT_HAS(error_of([&] { write_and_load("[run]\n", {"run.epochs=2\nseed = 3"}); }),
             "expected one value after '='");
  // A trailing dot was dropped, setting the table's parent key instead.
  EXPECT_HAS(error_of([&] { write_and_load("[run]\n", {"run.epochs.=3"}); }), "empty key");
  // Multi-byte UTF-8 and comments stay accepted.
  Recipe recipe = write_and_load("[run]\n", {"run.output_dir=caf\xc3\xa9 \xe2\x82\xac",
                                             "run.epochs=4 # four"});
  EXPECT_EQ(lookup(*recipe.root, "run", "output_dir"), Value("caf\xc3\xa9 \xe2\x82\xac"));
  EXPECT_EQ(lookup(*recipe.root, "run", "epochs"), Value(4));
  EXPECT_NO_THROW(parse_toml(to_toml(*recipe.root), "printed.toml"));
}

TEST_F(RecipeTest, OverrideLocationAppearsInValidationErrors) {
  Recipe recipe = write_and_load(kMinimal, {"loader.batch_size=abc"});
  std::string message = error_of([&] { resolve_recipe(recipe, registry()); });
  EXPECT_HAS(message, "--set loader.batch_size=abc");
  EXPECT_HAS(message, "loader.batch_size");
  EXPECT_HAS(message, "integer");

  Recipe unknown = write_and_load(kMinimal, {"model.widht=3"});
  std::string unknown_message = error_of([&] { resolve_recipe(unknown, registry()); });
  EXPECT_HAS(unknown_message, "--set model.widht=3");
  EXPECT_HAS(unknown_message, "unknown");
}

TEST_F(RecipeTest, ResolveFillsDefaults) {
  Recipe resolved = resolve_recipe(write_and_load(kMinimal), registry());
  const Table& root = *resolved.root;
  EXPECT_EQ(lookup(root, "strategy", "plugin"), Value("single"));
  EXPECT_EQ(lookup(root, "precision", "plugin"), Value("fp32"));
  EXPECT_EQ(lookup(root, "scheduler", "plugin"), Value("constant"));
  const Table& sinks = root.at("sinks").as_table();
  ASSERT_EQ(sinks.entries().size(), 1u);
  EXPECT_EQ(sinks.entries()[0].first, "console");
  EXPECT_EQ(sinks.at("console").as_table().at("plugin"), Value("console"));
  EXPECT_EQ(sinks.at("console").as_table().at("enabled"), Value(true));
  // Runtime sections and plugin options get their defaults.
  EXPECT_EQ(lookup(root, "run", "epochs"), Value(1));
  EXPECT_EQ(lookup(root, "run", "device"), Value("cpu"));
  EXPECT_EQ(lookup(root, "loader", "batch_size"), Value(64));
  EXPECT_EQ(lookup(root, "loader", "shuffle"), Value(true));
  EXPECT_EQ(lookup(root, "model", "hidden"), Value(Array{Value(256), Value(128)}));
  EXPECT_EQ(lookup(root, "optimizer", "lr"), Value(0.01));
  EXPECT_EQ(lookup(root, "dataset", "samples"), Value(1024));
  // Every run option is present.
  for (const auto& spec : run_options()) EXPECT_TRUE(root.at("run").as_table().contains(spec.name)) << spec.name;
}

TEST_F(RecipeTest, ResolveKeepsWrittenValuesAndRuntimeKeys) {
  Recipe resolved = resolve_recipe(
      write_and_load(std::string(kMinimal) +
                     "[run]\nepochs = 4\n[checkpoint]\nplugin = \"torch\"\nkeep = 2\n"
                     "[sinks.jsonl]\n[sinks.console]\nenabled = false\n"),
      registry());
  const Table& root = *resolved.root;
  EXPECT_EQ(lookup(root, "run", "epochs"), Value(4));
  EXPECT_EQ(lookup(root, "checkpoint", "keep"), Value(2));
  EXPECT_EQ(lookup(root, "checkpoint", "every_steps"), Value(0));
  EXPECT_EQ(lookup(root, "checkpoint", "at_end"), Value(true));
  const Table& sinks = root.at("sinks").as_table();
  EXPECT_EQ(sinks.at("jsonl").as_table().at("plugin"), Value("jsonl"));
  EXPECT_EQ(sinks.at("console").as_table().at("enabled"), Value(false));
}

TEST_F(RecipeTest, UnknownTopLevelSection) {
  Recipe recipe = write_and_load(std::string(kMinimal) + "\n[modle]\nplugin = \"mlp\"\n");
  std::string message = error_of([&] { resolve_recipe(recipe, registry()); });
  EXPECT_HAS(message, "recipe.toml:");
  EXPECT_HAS(message, "unknown recipe section 'modle'");
  EXPECT_HAS(message, "model");  // the known ones
}

TEST_F(RecipeTest, UnknownPluginListsKnownOnes) {
  Recipe recipe = write_and_load(
      "[dataset]\nplugin = \"synthetic\"\n[model]\nplugin = \"vit\"\n[optimizer]\nplugin = \"sgd\"\n");
  std::string message = error_of([&] { resolve_recipe(recipe, registry()); });
  EXPECT_HAS(message, "recipe.toml:4:10");
  EXPECT_HAS(message, "vit");
  EXPECT_HAS(message, "cnn");
  EXPECT_HAS(message, "mlp");
}

TEST_F(RecipeTest, UnknownPluginOptionIsLocated) {
  Recipe recipe = write_and_load(
      "[dataset]\nplugin = \"synthetic\"\n[model]\nplugin = \"mlp\"\nwidht = 3\n"
      "[optimizer]\nplugin = \"sgd\"\n");
  std::string message = error_of([&] { resolve_recipe(recipe, registry()); });
  EXPECT_HAS(message, "recipe.toml:5:");
  EXPECT_HAS(message, "unknown");
  EXPECT_HAS(message, "model.widht");
  EXPECT_HAS(message, "hidden");
}

TEST_F(RecipeTest, WrongTypeOfPluginOption) {
  Recipe recipe = write_and_load(std::string(kMinimal) + "[loader]\nshuffle = \"yes\"\n");
  std::string message = error_of([&] { resolve_recipe(recipe, registry()); });
  EXPECT_HAS(message, "recipe.toml:8:11");
  EXPECT_HAS(message, "loader.shuffle");
  EXPECT_HAS(message, "boolean");
}

TEST_F(RecipeTest, MissingModelSection) {
  Recipe recipe = write_and_load("[dataset]\nplugin = \"synthetic\"\n[optimizer]\nplugin = \"sgd\"\n");
  std::string message = error_of([&] { resolve_recipe(recipe, registry()); });
  EXPECT_HAS(message, "missing section [model]");
  EXPECT_HAS(message, "recipe.toml");
  EXPECT_HAS(message, "mlp");
  // A section without its plugin key is an error too.
  Recipe no_plugin = write_and_load("[dataset]\nplugin = \"synthetic\"\n[model]\nhidden = [3]\n"
                                    "[optimizer]\nplugin = \"sgd\"\n");
  std::string needs = error_of([&] { resolve_recipe(no_plugin, registry()); });
  EXPECT_HAS(needs, "[model]");
  EXPECT_HAS(needs, "plugin");
}

TEST_F(RecipeTest, ResolvedRecipePrintsAndReparsesEqual) {
  Recipe resolved = resolve_recipe(
      write_and_load("name = \"demo\"\n" + std::string(kMinimal) +
                     "[checkpoint]\nplugin = \"torch\"\n[sinks.jsonl]\n"),
      registry());
  std::string text = to_toml(*resolved.root);
  SCOPED_TRACE(text);
  std::shared_ptr<const Table> reparsed;
  ASSERT_NO_THROW(reparsed = parse_toml(text, "printed.toml"));
  EXPECT_EQ(table_value(reparsed), table_value(resolved.root));
  // Printed again, the text is stable.
  EXPECT_EQ(to_toml(*reparsed), text);
  // The same recipe resolves again to the same thing.
  Recipe again = resolve_recipe(Recipe{reparsed, resolved.path, {}}, registry());
  EXPECT_EQ(table_value(again.root), table_value(resolved.root));
}

TEST_F(RecipeTest, ToTomlQuotesKeysThatAreNotBare) {
  auto root = parse_toml(
      "\"odd key\" = 1\n"
      "[\"my section\"]\n\"a.b\" = 2\nplain = \"x\"\n"
      "[sinks.\"x y\"]\nk = 1\n"
      "[nested.deep.er]\nv = [1, 2]\n",
      "odd.toml");
  std::string text = to_toml(*root);
  SCOPED_TRACE(text);
  std::shared_ptr<const Table> reparsed;
  ASSERT_NO_THROW(reparsed = parse_toml(text, "printed.toml"));
  EXPECT_EQ(table_value(reparsed), table_value(root));
}

TEST_F(RecipeTest, RecipePluginPathsResolveAgainstTheRecipe) {
  Recipe recipe = write_and_load("plugin_paths = [\"my/plugins\", \"/opt/plugins\"]\n");
  auto paths = recipe_plugin_paths(recipe);
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0], dir_.path() / "my/plugins");
  EXPECT_EQ(paths[1], fs::path("/opt/plugins"));
  EXPECT_TRUE(recipe_plugin_paths(write_and_load("[run]\n")).empty());
  EXPECT_HAS(error_of([&] { recipe_plugin_paths(write_and_load("plugin_paths = [1]\n")); }),
             "recipe.toml:1:");
}

TEST_F(RecipeTest, RecipeNameAndSections) {
  Recipe unnamed = write_and_load("[run]\nepochs = 2\n");
  EXPECT_EQ(unnamed.name(), "recipe");
  EXPECT_TRUE(unnamed.has_section("run"));
  EXPECT_FALSE(unnamed.has_section("model"));
  Config run = unnamed.section("run");
  EXPECT_EQ(run.name(), "run");
  EXPECT_EQ(run.get_int("epochs"), 2);
  // An absent section reads as an empty one.
  EXPECT_TRUE(unnamed.section("loader").table().empty());
  Recipe bad = write_and_load("run = 3\n");
  EXPECT_HAS(error_of([&] { bad.section("run"); }), "recipe.toml:1:");
}

TEST_F(RecipeTest, RuntimeOptionTablesAreConsistent) {
  std::vector<std::string> names;
  for (const auto& section : plugin_sections()) names.push_back(section.section);
  EXPECT_NE(std::find(names.begin(), names.end(), "model"), names.end());
  for (const auto& section : plugin_sections()) {
    if (section.section == "model" || section.section == "dataset" ||
        section.section == "optimizer") {
      EXPECT_FALSE(section.optional) << section.section;
      EXPECT_TRUE(section.default_plugin.empty()) << section.section;
    }
  }
  for (const OptionSpecs* specs : {&run_options(), &loader_options(), &checkpoint_policy_options(),
                                   &sink_common_options(), &comm_options(), &parallel_options()}) {
    for (const auto& spec : *specs) {
      ASSERT_TRUE(spec.default_value.has_value()) << spec.name;
      EXPECT_TRUE(value_matches(*spec.default_value, spec.type)) << spec.name;
      EXPECT_FALSE(spec.violation(*spec.default_value).has_value()) << spec.name;
    }
  }
}

TEST_F(RecipeTest, RuntimeRangesAreRefusedWhenResolving) {
  auto refused = [&](const std::string& section, const std::string& text) {
    Recipe recipe = write_and_load(std::string(kMinimal) + section + "\n" + text + "\n");
    return error_of([&] { resolve_recipe(recipe, registry()); });
  };
  // The value's own line (the section header is line 7) and column.
  EXPECT_HAS(refused("[run]", "epochs = 0"), "recipe.toml:8:10: run.epochs must be >= 1, got 0");
  EXPECT_HAS(refused("[run]", "grad_accumulation = 0"), "run.grad_accumulation must be >= 1");
  EXPECT_HAS(refused("[run]", "log_every = 0"), "run.log_every must be >= 1");
  EXPECT_HAS(refused("[run]", "threads = -1"), "run.threads must be >= 0");
  EXPECT_HAS(refused("[run]", "max_grad_norm = -0.5"), "run.max_grad_norm must be >= 0");
  EXPECT_HAS(refused("[run]", "peak_tflops = -1.0"), "run.peak_tflops must be >= 0");
  EXPECT_HAS(refused("[run]", "cpu_binding = \"always\""),
             "run.cpu_binding must be auto, cores or none, got \"always\"");
  EXPECT_HAS(refused("[loader]", "batch_size = 0"), "loader.batch_size must be >= 1, got 0");
  EXPECT_HAS(refused("[loader]", "workers = -2"),
             "loader.workers must be >= 0, or -1 for automatic, got -2");
  EXPECT_HAS(refused("[loader]", "prefetch = 0"), "loader.prefetch must be >= 1");
  EXPECT_HAS(refused("[checkpoint]", "keep = -1"), "checkpoint.keep must be >= 0");
  EXPECT_HAS(refused("[checkpoint]", "every_steps = -5"), "checkpoint.every_steps must be >= 0");
  EXPECT_HAS(refused("[checkpoint]", "every_seconds = -1.0"),
             "checkpoint.every_seconds must be >= 0");
  EXPECT_HAS(refused("[comm]", "timeout_s = 0"), "comm.timeout_s must be >= 1");
  EXPECT_HAS(refused("[parallel]", "tp = 0"), "parallel.tp must be >= 1");
  EXPECT_HAS(refused("[parallel]", "tp = 0"), "or -1 to fill the world, got 0");
  EXPECT_HAS(refused("[parallel]", "tp = -1\npp = -1"), "only one dimension may fill the world");
}

TEST_F(RecipeTest, MeshRequestReadsTheParallelSection) {
  Recipe recipe = write_and_load(std::string(kMinimal) + "[parallel]\ntp = 2\npp = 2\n");
  MeshRequest request = mesh_request(resolve_recipe(recipe, registry()).section("parallel"));
  EXPECT_EQ(request.pp, 2);
  EXPECT_EQ(request.dp_replicate, 1);
  EXPECT_EQ(request.dp_shard, -1);
  EXPECT_EQ(request.tp, 2);
  // The ranges hold for a section that was never resolved, too.
  Recipe unresolved = write_and_load(std::string(kMinimal) + "[parallel]\ndp_shard = 0\n");
  EXPECT_HAS(error_of([&] { mesh_request(unresolved.section("parallel")); }),
             "parallel.dp_shard must be >= 1");
}

TEST_F(RecipeTest, ParallelAbsentSectionIsDataParallelOverEveryRank) {
  const MeshRequest request = mesh_request(resolve_parallel("").section("parallel"));
  EXPECT_EQ(request.pp, 1);
  EXPECT_EQ(request.dp_replicate, 1);
  EXPECT_EQ(request.dp_shard, -1);
  EXPECT_EQ(request.tp, 1);
}

TEST_F(RecipeTest, ParallelWrittenSizesAreRead) {
  const MeshRequest request =
      mesh_request(resolve_parallel("[parallel]\npp = 2\ntp = 4\ndp_shard = 1\ndp_replicate = -1\n")
                       .section("parallel"));
  EXPECT_EQ(request.pp, 2);
  EXPECT_EQ(request.tp, 4);
  EXPECT_EQ(request.dp_shard, 1);
  EXPECT_EQ(request.dp_replicate, -1);
}

TEST_F(RecipeTest, ParallelAWrittenMinusOneTakesOverFillingFromDpShard) {
  const MeshRequest request =
      mesh_request(resolve_parallel("[parallel]\npp = -1\n").section("parallel"));
  EXPECT_EQ(request.pp, -1);
  EXPECT_EQ(request.dp_shard, 1);
  EXPECT_EQ(MeshLayout::resolve(request, 4).size(MeshAxis::kPipeline), 4);
}

TEST_F(RecipeTest, ParallelBadSizesAreLocatedErrors) {
  EXPECT_HAS(error_resolving_parallel("[parallel]\ntp = 0\n"),
             "recipe.toml:8:6: parallel.tp must be >= 1");
  EXPECT_HAS(error_resolving_parallel("[parallel]\ntp = 0\n"), "or -1 to fill the world, got 0");
  EXPECT_HAS(error_resolving_parallel("[parallel]\npp = -1\ndp_shard = -1\n"),
             "recipe.toml:9:12: parallel.dp_shard is -1, but so is parallel.pp; only one "
             "dimension may fill the world");
  EXPECT_HAS(error_resolving_parallel("[parallel]\ntp = -1\npp = -1\n"),
             "parallel.tp is -1, but so is parallel.pp");
  EXPECT_HAS(error_resolving_parallel("[parallel]\ncp = 2\n"), "parallel");
  EXPECT_HAS(error_resolving_parallel("[parallel]\ncp = 2\n"), "cp");
  EXPECT_HAS(error_resolving_parallel("[parallel]\ntp = \"two\"\n"), "parallel.tp");
}

TEST_F(RecipeTest, UnknownKeyErrorPointsAtTheKey) {
  // Line 5 is "    widht   = 3": the key starts at column 5, its value at column 13.
  Recipe recipe = write_and_load(
      "[dataset]\nplugin = \"synthetic\"\n[model]\nplugin = \"mlp\"\n    widht   = 3\n"
      "[optimizer]\nplugin = \"sgd\"\n");
  EXPECT_HAS(error_of([&] { resolve_recipe(recipe, registry()); }),
             "recipe.toml:5:5: unknown option 'model.widht'");
  // The same for a section, and for a key that an extends chain brought in.
  Recipe section = write_and_load(std::string(kMinimal) + "  [modle]\nplugin = \"mlp\"\n");
  EXPECT_HAS(error_of([&] { resolve_recipe(section, registry()); }),
             "recipe.toml:7:4: unknown recipe section 'modle'");
  dir_.write("base.toml", "[dataset]\nplugin = \"synthetic\"\n  samplez =  4\n");
  Recipe extended = write_and_load(
      "extends = \"base.toml\"\n[model]\nplugin = \"mlp\"\n[optimizer]\nplugin = \"sgd\"\n");
  EXPECT_HAS(error_of([&] { resolve_recipe(extended, registry()); }),
             "base.toml:3:3: unknown option 'dataset.samplez'");
}

TEST_F(RecipeTest, TypeErrorsUseTheRightArticle) {
  Recipe recipe = write_and_load(std::string(kMinimal) + "[run]\nepochs = \"3\"\n");
  const std::string message = error_of([&] { resolve_recipe(recipe, registry()); });
  EXPECT_HAS(message, "run.epochs must be an integer, got \"3\" (a string)");
  Recipe list = write_and_load(std::string(kMinimal) + "[run]\nstop_signals = 3\n");
  EXPECT_HAS(error_of([&] { resolve_recipe(list, registry()); }),
             "must be an array of strings, got 3 (an integer)");
}

TEST_F(RecipeTest, SetWithBangRemovesAKey) {
  const std::string text = std::string(kMinimal) + "[run]\nepochs = 4\nseed = 9\n";
  Recipe removed = write_and_load(text, {"run.epochs=!"});
  const Table& run = removed.root->at("run").as_table();
  EXPECT_FALSE(run.contains("epochs"));
  EXPECT_EQ(run.at("seed"), Value(9));
  // Resolving fills the default back in.
  EXPECT_EQ(lookup(*resolve_recipe(removed, registry()).root, "run", "epochs"), Value(1));
  // Removing what is not there is no error; a quoted "!" is the string itself.
  EXPECT_FALSE(write_and_load(text, {"run.nothing=!", "nosection.key=!"})
                   .root->contains("nosection"));
  EXPECT_EQ(write_and_load(text, {"run.device=\"!\""}).root->at("run").as_table().at("device"),
            Value("!"));
  // A whole section goes the same way.
  EXPECT_FALSE(write_and_load(text, {"run=!"}).root->contains("run"));
}

TEST_F(RecipeTest, SwitchingAPluginWithSetDropsTheOldPluginsOptions) {
  const std::string text = std::string(kMinimal) +
                           "[scheduler]\nplugin = \"warmup_cosine\"\nwarmup_steps = 10\n"
                           "min_lr_ratio = 0.1\n";
  Recipe switched = resolve_recipe(write_and_load(text, {"scheduler.plugin=constant"}), registry());
  const Table& scheduler = switched.root->at("scheduler").as_table();
  EXPECT_EQ(scheduler.at("plugin"), Value("constant"));
  EXPECT_FALSE(scheduler.contains("warmup_steps"));
  ASSERT_EQ(switched.notes.size(), 2u);
  EXPECT_HAS(switched.notes[0], "recipe.toml:9:1: scheduler.warmup_steps dropped: --set "
                                "scheduler.plugin=constant names a constant without that option");
  EXPECT_HAS(switched.notes[1], "scheduler.min_lr_ratio dropped");
  // Options the new plugin declares stay; so does the file's own plugin choice without --set.
  Recipe linear =
      resolve_recipe(write_and_load(text, {"scheduler.plugin=warmup_linear"}), registry());
  EXPECT_EQ(lookup(*linear.root, "scheduler", "warmup_steps"), Value(10));
  EXPECT_TRUE(linear.notes.empty());
  const std::string in_file = std::string(kMinimal) +
                              "[scheduler]\nplugin = \"constant\"\nwarmup_steps = 10\n";
  EXPECT_HAS(error_of([&] { resolve_recipe(write_and_load(in_file), registry()); }),
             "unknown option 'scheduler.warmup_steps'");
  // An option given with --set next to the switch is still checked.
  EXPECT_HAS(error_of([&] {
               resolve_recipe(write_and_load(text, {"scheduler.plugin=constant",
                                                    "scheduler.warmup_steps=5"}),
                              registry());
             }),
             "unknown option 'scheduler.warmup_steps'");
}

TEST_F(RecipeTest, UnknownPluginSaysWhereItLookedAndHowToAddOne) {
  Recipe recipe = write_and_load(
      "[dataset]\nplugin = \"synthetic\"\n[model]\nplugin = \"vit\"\n[optimizer]\nplugin = \"sgd\"\n");
  const std::string message = error_of([&] { resolve_recipe(recipe, registry()); });
  EXPECT_HAS(message, "searched: " + fs::absolute(testing::plugin_folder()).string());
  EXPECT_HAS(message, "--plugin-path");
  EXPECT_HAS(message, "TRAINYARD_PLUGIN_PATH");
}

TEST_F(RecipeTest, BundledPluginsDeclareTheRangesTheyNeed) {
  auto refused = [&](const std::string& section, const std::string& text) {
    Recipe recipe = write_and_load(std::string(kMinimal) + section + "\n" + text + "\n");
    return error_of([&] { resolve_recipe(recipe, registry()); });
  };
  auto refused_in_model_or_dataset = [&](const std::string& dataset, const std::string& model) {
    Recipe recipe = write_and_load("[dataset]\nplugin = \"synthetic\"\n" + dataset +
                                   "\n[model]\nplugin = \"mlp\"\n" + model +
                                   "\n[optimizer]\nplugin = \"sgd\"\n");
    return error_of([&] { resolve_recipe(recipe, registry()); });
  };
  EXPECT_HAS(refused_in_model_or_dataset("", "hidden = [64, -3]"),
             "recipe.toml:6:10: model.hidden must be >= 1, got -3");
  EXPECT_HAS(refused_in_model_or_dataset("", "dropout = 1.0"),
             "model.dropout must be >= 0 and < 1, got 1.0");
  EXPECT_HAS(refused_in_model_or_dataset("num_classes = 1", ""),
             "recipe.toml:3:15: dataset.num_classes must be >= 2, got 1");
  EXPECT_HAS(refused_in_model_or_dataset("input_shape = [0]", ""),
             "dataset.input_shape must be >= 1, got 0");
  EXPECT_HAS(refused("[scheduler]", "plugin = \"warmup_cosine\"\nmin_lr_ratio = 2.0"),
             "scheduler.min_lr_ratio must be >= 0 and <= 1, got 2.0");
  EXPECT_HAS(refused("[precision]", "plugin = \"fp16\"\nbackoff_factor = 1.0"),
             "precision.backoff_factor must be > 0 and < 1, got 1.0");
  EXPECT_HAS(refused("[strategy]", "plugin = \"fsdp\"\nsharding = \"most\""),
             "strategy.sharding must be full, grad_op or none, got \"most\"");
  EXPECT_HAS(refused("[sinks.console]", "progress = \"dots\""),
             "sinks.console.progress must be auto, bar or lines, got \"dots\"");
  // Every bundled plugin's defaults keep its own rules.
  for (const auto& info : registry().list()) {
    for (const auto& spec : info.options) {
      if (spec.default_value) {
        EXPECT_FALSE(spec.violation(*spec.default_value).has_value())
            << info.kind << " " << info.name << " " << spec.name;
      }
    }
  }
}

}  // namespace
}  // namespace trainyard
