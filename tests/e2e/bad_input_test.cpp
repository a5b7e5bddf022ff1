// Bad input: every case ends with one clear error line on stderr and a non-zero exit — never a
// crash, a stack dump or a hang.

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/version.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kValidRecipe = R"([run]
max_steps = 2
[dataset]
plugin = "synthetic"
samples = 64
[model]
plugin = "mlp"
[optimizer]
plugin = "sgd"
)";

// Runs the host and checks the shape of a clean failure; returns the error line.
std::string expect_clean_failure(const std::vector<std::string>& args) {
  auto result = run_host(args, {}, 120);
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 1) << "stdout:\n" << result.out << "\nstderr:\n" << result.err;
  EXPECT_EQ(result.err.rfind("trainyard: error: ", 0), 0u) << result.err;
  // One line, no C++ backtrace, no abort message.
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_EQ(result.err.find("frame #"), std::string::npos);
  EXPECT_EQ(result.err.find("terminate called"), std::string::npos);
  return result.err;
}

TEST(BadInputTest, UnknownPluginListsTheKnownOnes) {
  TempDir dir;
  auto recipe = dir.write("r.toml", kValidRecipe);
  auto error = expect_clean_failure({"run", recipe.string(), "--set", "model.plugin=vit"});
  EXPECT_HAS(error, "unknown model plugin 'vit'");
  EXPECT_HAS(error, "known: cnn, gpt, llama, mlp, resnet");
  EXPECT_HAS(error, "--set model.plugin=vit");
}

TEST(BadInputTest, MissingPluginSectionNamesTheChoices) {
  TempDir dir;
  auto recipe = dir.write("r.toml", "[dataset]\nplugin = \"synthetic\"\n[optimizer]\nplugin = \"sgd\"\n");
  auto error = expect_clean_failure({"run", recipe.string()});
  EXPECT_HAS(error, "missing section [model]");
  EXPECT_HAS(error, "cnn, gpt, llama, mlp");
}

// Hugging Face inputs the llama does not take: each a one-line error naming the file and the
// problem, and no output folder written.
TEST(BadInputTest, HuggingFaceInputsItCannotTakeAreRefusedInOneLine) {
  TempDir dir;
  const std::string recipe = std::string(R"([run]
max_steps = 2
[dataset]
plugin = "synthetic"
samples = 64
input_shape = [8]
vocab_size = 32
[optimizer]
plugin = "sgd"
[model]
plugin = "llama"
)");
  const auto config = dir.write("config.json",
                                R"({"architectures": ["MistralForCausalLM"], "hidden_size": 32})");
  auto foreign = dir.write("foreign.toml", recipe + "config_file = \"config.json\"\n");
  auto error = expect_clean_failure({"run", foreign.string(), "--set",
                                     "run.output_dir=" + (dir / "out1").string()});
  EXPECT_HAS(error, config.string() + ": architectures [\"MistralForCausalLM\"] is not");
  EXPECT_FALSE(std::filesystem::exists(dir / "out1"));

  const auto weights = dir / "weights";
  std::filesystem::create_directories(weights);
  dir.write("weights/config.json", R"({"hidden_size": 32, "num_attention_heads": 4})");
  dir.write("weights/model.safetensors.index.json",
            R"({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})");
  auto missing = dir.write("missing.toml", recipe + "weights = \"weights\"\n");
  error = expect_clean_failure({"run", missing.string(), "--set",
                                "run.output_dir=" + (dir / "out2").string()});
  EXPECT_HAS(error, "names shard model-00001-of-00002.safetensors, which is missing");
  EXPECT_FALSE(std::filesystem::exists(dir / "out2"));
}

TEST(BadInputTest, UnknownKeyIsLocatedByLineAndColumn) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) + "chanels = [1, 2]\n");
  auto error = expect_clean_failure({"validate", recipe.string()});
  // The key's column, not its value's.
  EXPECT_HAS(error, "r.toml:10:1: unknown option 'optimizer.chanels'");
}

TEST(BadInputTest, ValuesOutsideAPluginsDeclaredRangeFailValidateAndDoctor) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) +
                                        "[scheduler]\nplugin = \"warmup_linear\"\n"
                                        "warmup_steps = -5\n");
  auto error = expect_clean_failure({"validate", recipe.string()});
  EXPECT_HAS(error, "r.toml:12:16: scheduler.warmup_steps must be >= 0, got -5");
  auto hidden = expect_clean_failure({"validate", recipe.string(), "--set",
                                      "scheduler.warmup_steps=0", "--set", "model.hidden=[-3]"});
  EXPECT_HAS(hidden, "--set model.hidden=[-3]: model.hidden must be >= 1, got -3");
  auto doctor = run_host({"doctor", recipe.string()}, {}, 120);
  EXPECT_NE(doctor.exit_code, 0);
  EXPECT_HAS(doctor.out, "scheduler.warmup_steps must be >= 0, got -5");
}

TEST(BadInputTest, PluginsListsEachOptionsRange) {
  auto listed = run_host({"plugins", "model"}, {}, 120);
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_HAS(listed.out, "hidden : array of integers = [256, 128]    hidden layer widths [>= 1]");
  EXPECT_HAS(listed.out, "dropout before the output layer [>= 0 and < 1]");
  EXPECT_HAS(listed.out, "[mean or sum]");
}

TEST(BadInputTest, SwitchingAPluginWithSetDropsTheOldOptionsWithANote) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) +
                                        "[scheduler]\nplugin = \"warmup_cosine\"\n"
                                        "warmup_steps = 5\n");
  auto switched = run_host({"validate", recipe.string(), "--set", "scheduler.plugin=constant"},
                           {}, 120);
  EXPECT_EQ(switched.exit_code, 0) << switched.err;
  EXPECT_EQ(switched.err,
            "trainyard: note: " + recipe.string() +
                ":12:1: scheduler.warmup_steps dropped: --set scheduler.plugin=constant names a "
                "constant without that option\n");
  // The removal form: the option is gone and its default applies.
  auto removed = run_host({"validate", recipe.string(), "--set", "scheduler.warmup_steps=!",
                           "--print-config"},
                          {}, 120);
  EXPECT_EQ(removed.exit_code, 0) << removed.err;
  EXPECT_HAS(removed.out, "warmup_steps = 0\n");
}

TEST(BadInputTest, UnknownPluginSaysHowToLoadOne) {
  TempDir dir;
  auto recipe = dir.write("r.toml", kValidRecipe);
  auto error = expect_clean_failure({"validate", recipe.string(), "--set", "model.plugin=vit"});
  EXPECT_HAS(error, "searched: ");
  EXPECT_HAS(error, "lib/trainyard/plugins");
  EXPECT_HAS(error, "--plugin-path");
}

TEST(BadInputTest, TypeErrorsReadAsEnglish) {
  TempDir dir;
  auto recipe = dir.write("r.toml", kValidRecipe);
  auto error = expect_clean_failure({"validate", recipe.string(), "--set", "run.epochs=\"two\""});
  EXPECT_HAS(error, "run.epochs must be an integer, got \"two\" (a string)");
}

TEST(BadInputTest, WrongTypeIsLocatedByLineAndColumn) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) + "[loader]\nbatch_size = \"64\"\n");
  auto error = expect_clean_failure({"validate", recipe.string()});
  EXPECT_HAS(error, "r.toml:11:14");
  EXPECT_HAS(error, "loader.batch_size must be");
  EXPECT_HAS(error, "integer");
}

TEST(BadInputTest, UnknownSectionIsRefused) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) + "[modle]\nplugin = \"cnn\"\n");
  auto error = expect_clean_failure({"validate", recipe.string()});
  EXPECT_HAS(error, "unknown recipe section 'modle'");
}

TEST(BadInputTest, TomlSyntaxErrorIsLocated) {
  TempDir dir;
  auto recipe = dir.write("r.toml", "[run]\nseed = = 1\n");
  auto error = expect_clean_failure({"validate", recipe.string()});
  EXPECT_HAS(error, "r.toml:2:");
}

TEST(BadInputTest, ExtendsCycleIsRefused) {
  TempDir dir;
  dir.write("a.toml", "extends = \"b.toml\"\n");
  dir.write("b.toml", "extends = \"c.toml\"\n");
  auto c = dir.write("c.toml", "extends = \"a.toml\"\n");
  auto error = expect_clean_failure({"validate", c.string()});
  EXPECT_HAS(error, "extends cycle");
  EXPECT_HAS(error, "a.toml -> ");
}

TEST(BadInputTest, ExtendsOfADeviceIsRefusedBeforeReading) {
  // /dev/zero never ends: read as a recipe it would take memory until the process is killed.
  TempDir dir;
  auto recipe = dir.write("r.toml", "extends = \"/dev/zero\"\n[run]\nmax_steps = 1\n");
  auto error = expect_clean_failure({"validate", recipe.string()});
  EXPECT_HAS(error, "/dev/zero is not a regular file");
}

TEST(BadInputTest, NonAsciiWhereTomlExpectsWhitespaceIsACleanError) {
  // toml++ 3.3.0 classifies these characters through a branch it marks unreachable (see
  // tools/fuzz/CMakeLists.txt); found by the recipe and manifest fuzzers.
  TempDir dir;
  const char* texts[] = {
      "\xef\xbb\x9f",                                  // U+FEDF alone
      "[run]\nseed = 1 \xc3\xa9\n",                   // U+00E9 after a value
      "name = \"\"\"\\\n\xc2\xa7\"\"\"\n[run]\nseed = 1\n",  // U+00A7 after a line-ending backslash
  };
  for (const char* text : texts) {
    auto recipe = dir.write("r.toml", std::string(text) + kValidRecipe);
    auto result = run_host({"validate", recipe.string()}, {}, 120);
    EXPECT_FALSE(result.timed_out);
    EXPECT_NE(result.exit_code, 0) << text;
    EXPECT_LE(result.exit_code, 2) << "crashed on " << text << ":\n" << result.err;
    EXPECT_EQ(result.err.rfind("trainyard: error: ", 0), 0u) << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  }
}

TEST(BadInputTest, SetThatIsNotUtf8IsRefused) {
  TempDir dir;
  auto recipe = dir.write("r.toml", kValidRecipe);
  auto error = expect_clean_failure({"validate", recipe.string(), "--set", "run.device=cu\xff"});
  EXPECT_HAS(error, "--set run.device=cu\\xFF: not valid UTF-8");
}

TEST(BadInputTest, ManifestNamingAFileOutsideItsCheckpointIsRefused) {
  // Verifying the checkpoint would read whatever the manifest names.
  TempDir dir;
  dir.write("step-000000001/manifest.toml",
            "format = 1\nstep = 1\nbackend = \"torch\"\nframework_version = \"0.1.0\"\n"
            "world_size = 1\n\n[[files]]\nname = \"../../../etc/passwd\"\nbytes = 1\n"
            "crc32 = 0\n");
  auto error = expect_clean_failure(
      {"checkpoint", "inspect", (dir.path() / "step-000000001").string()});
  EXPECT_HAS(error, "files.name must be a file name inside the checkpoint folder");
}

TEST(BadInputTest, ManifestThatIsADeviceIsRefusedBeforeReading) {
  TempDir dir;
  fs::create_directories(dir.path() / "step-000000001");
  fs::create_symlink("/dev/zero", dir.path() / "step-000000001" / "manifest.toml");
  auto error = expect_clean_failure(
      {"checkpoint", "inspect", (dir.path() / "step-000000001").string()});
  EXPECT_HAS(error, "manifest.toml: not a regular file");
}

TEST(BadInputTest, RecipeThatIsAFolderIsRefused) {
  TempDir dir;
  fs::create_directories(dir.path() / "folder.toml");
  auto error = expect_clean_failure({"validate", (dir.path() / "folder.toml").string()});
  EXPECT_HAS(error, "folder.toml is not a regular file");
}

TEST(BadInputTest, OversizedRecipeIsRefused) {
  TempDir dir;
  std::string comment_lines;
  for (int line = 0; line < 40000; ++line) comment_lines += "# a recipe padded with comments\n";
  auto recipe = dir.write("big.toml", comment_lines + kValidRecipe);
  auto error = expect_clean_failure({"validate", recipe.string()});
  EXPECT_HAS(error, "a recipe is at most 1048576 bytes");
}

TEST(BadInputTest, ValueOutOfItsDeclaredRangeIsRefusedByValidate) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) + "[loader]\nworkers = -3\n");
  auto error = expect_clean_failure({"validate", recipe.string()});
  EXPECT_HAS(error, "r.toml:11:11: loader.workers must be >= 0, or -1 for automatic, got -3");
  error = expect_clean_failure(
      {"validate", recipe.string(), "--set", "loader.workers=0", "--set", "run.epochs=0"});
  EXPECT_HAS(error, "run.epochs must be >= 1, got 0");
}

TEST(BadInputTest, ParallelLayoutLargerThanOneProcessIsRefused) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) + "[parallel]\ntp = 2\n");
  // The recipe is valid on its own; the run finds that one process cannot hold the mesh.
  EXPECT_EQ(run_host({"validate", recipe.string()}).exit_code, 0);
  auto error = expect_clean_failure({"run", recipe.string()});
  EXPECT_HAS(error,
             "parallel: pp 1 x dp_replicate 1 x dp_shard -1 x tp 2 needs a world size "
             "divisible by 2, but there are 1 ranks");
  error = expect_clean_failure({"run", recipe.string(), "--set", "parallel.dp_shard=1"});
  EXPECT_HAS(error, "makes 2 ranks, but there are 1");
}

TEST(BadInputTest, MissingRecipeIsNamed) {
  auto error = expect_clean_failure({"run", "recipes/no_such_recipe.toml"});
  EXPECT_HAS(error, "no_such_recipe.toml");
}

TEST(BadInputTest, BadOptionValueIsLocated) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) + "lr = -1.0\n");
  auto error = expect_clean_failure({"run", recipe.string()});
  EXPECT_HAS(error, "r.toml:10:6");
  EXPECT_HAS(error, "optimizer.lr must be >= 0");
}

TEST(BadInputTest, MissingDatasetFolderIsNamed) {
  auto error = expect_clean_failure({"run", "recipes/fashion_mnist_mlp.toml", "--set",
                                     "dataset.root=/nonexistent/fashion"});
  EXPECT_HAS(error, "/nonexistent/fashion");
}

// A copy of the real data with one file replaced.
fs::path dataset_copy(const TempDir& dir) {
  fs::path root = dir / "fashion";
  fs::create_directories(root);
  for (const auto& item : fs::directory_iterator("/usr/share/datasets/fashion-mnist")) {
    fs::copy_file(item.path(), root / item.path().filename());
  }
  return root;
}

TEST(BadInputTest, MissingDatasetFileIsNamed) {
  TempDir dir;
  fs::path root = dataset_copy(dir);
  fs::remove(root / "t10k-labels-idx1-ubyte.gz");
  auto error = expect_clean_failure({"run", "recipes/fashion_mnist_mlp.toml", "--set",
                                     "dataset.root=" + root.string()});
  EXPECT_HAS(error, "t10k-labels-idx1-ubyte");
}

TEST(BadInputTest, TruncatedGzipDatasetFileIsNamed) {
  TempDir dir;
  fs::path root = dataset_copy(dir);
  fs::path file = root / "train-labels-idx1-ubyte.gz";
  fs::resize_file(file, fs::file_size(file) / 2);
  auto error = expect_clean_failure({"run", "recipes/fashion_mnist_mlp.toml", "--set",
                                     "dataset.root=" + root.string()});
  EXPECT_HAS(error, file.string());
}

TEST(BadInputTest, IdxFileShorterThanItsHeaderSaysIsNamed) {
  TempDir dir;
  fs::path root = dataset_copy(dir);
  // A well-formed gzip stream whose IDX payload is shorter than the header promises.
  fs::path file = root / "t10k-labels-idx1-ubyte.gz";
  gzFile out = gzopen(file.c_str(), "wb");
  const unsigned char header[] = {0, 0, 8, 1, 0, 0, 0x27, 0x10, 1, 2, 3};
  gzwrite(out, header, sizeof header);
  gzclose(out);
  auto error = expect_clean_failure({"run", "recipes/fashion_mnist_mlp.toml", "--set",
                                     "dataset.root=" + root.string()});
  EXPECT_HAS(error, file.string());
  EXPECT_HAS(error, "header promises 10000");
}

TEST(BadInputTest, PluginWithAnotherAbiIsRefusedWithBothVersions) {
  TempDir dir;
  auto recipe = dir.write("r.toml", kValidRecipe);
  fs::path plugin = test_plugin_folder() / "libwrong_abi.so";
  auto error = expect_clean_failure({"run", recipe.string(), "--plugin-path", plugin.string()});
  EXPECT_HAS(error, plugin.string());
  EXPECT_HAS(error, "wrong ABI version");
  EXPECT_HAS(error, "it has version " + std::to_string(TRAINYARD_ABI_VERSION + 1) +
                        ", this host supports version " + std::to_string(TRAINYARD_ABI_VERSION));
}

TEST(BadInputTest, PluginForAnotherLibTorchIsRefusedWithBothTags) {
  fs::path plugin = test_plugin_folder() / "libwrong_build_tag.so";
  auto error = expect_clean_failure({"plugins", "--plugin-path", plugin.string()});
  EXPECT_HAS(error, plugin.string());
  EXPECT_HAS(error, "built for libtorch 1.13.1");
  EXPECT_HAS(error, "this host is built for libtorch 2.11.0");
}

TEST(BadInputTest, LibraryWithoutEntryPointIsRefused) {
  fs::path plugin = test_plugin_folder() / "libno_entry_point.so";
  auto error = expect_clean_failure({"plugins", "--plugin-path", plugin.string()});
  EXPECT_HAS(error, plugin.string());
  EXPECT_HAS(error, "no entry point 'trainyard_plugin_descriptor'");
}

TEST(BadInputTest, DuplicatePluginNamesBothLibraries) {
  fs::path plugin = test_plugin_folder() / "libduplicate_mlp.so";
  auto error = expect_clean_failure({"plugins", "--plugin-path", plugin.string()});
  EXPECT_HAS(error, "duplicate model plugin 'mlp'");
  EXPECT_HAS(error, "libtrainyard_model_mlp.so");
  EXPECT_HAS(error, plugin.string());
}

// One plugin found twice, say in the install's folder and again through --plugin-path from a
// build folder: refused, naming both files, never one silently shadowing the other.
TEST(BadInputTest, SamePluginFoundTwiceNamesBothPaths) {
  TempDir dir;
  const fs::path bundled = plugin_folder() / "libtrainyard_model_mlp.so";
  const fs::path copy = dir / "libtrainyard_model_mlp.so";
  fs::copy_file(bundled, copy);
  auto error = expect_clean_failure({"plugins", "--plugin-path", copy.string()});
  EXPECT_HAS(error, "duplicate model plugin 'mlp'");
  EXPECT_HAS(error, fs::canonical(bundled).string());
  EXPECT_HAS(error, copy.string());
}

// --resume on a recipe that saves no checkpoints says what to add to it.
TEST(BadInputTest, ResumeWithoutCheckpointSectionSaysWhatToAdd) {
  TempDir dir;
  auto recipe = dir.write("r.toml", kValidRecipe);
  auto error = expect_clean_failure({"run", recipe.string(), "--resume", "auto", "--set",
                                     "run.output_dir=" + (dir / "out").string()});
  EXPECT_HAS(error, "no [checkpoint] section");
  EXPECT_HAS(error, "--set checkpoint.plugin=torch");
}

// validate builds the model (on the meta device), so options that only the model can judge are
// refused before anything runs; the same recipe with heads that divide the width validates.
TEST(BadInputTest, ValidateRefusesAModelThatCannotBuild) {
  auto error = expect_clean_failure({"validate", "recipes/gpt_text.toml", "--set",
                                     "model.n_heads=3", "--set", "model.d_model=128"});
  EXPECT_HAS(error, "n_heads");
  EXPECT_HAS(error, "must divide d_model (128)");
  auto valid = run_host({"validate", "recipes/gpt_text.toml", "--set", "model.n_heads=8"}, {}, 300);
  EXPECT_EQ(valid.exit_code, 0) << describe(valid);
}

// validate resolves the mesh for the processes the run will have and builds the model as a rank
// of it would: a mesh whose sizes do not make that many ranks, and a tensor-parallel size that
// does not divide the heads, are one-line errors naming the numbers before any process starts;
// the same recipes on a fitting layout validate.
TEST(BadInputTest, ValidateRefusesLayoutsTheRunCannotForm) {
  auto mesh = expect_clean_failure({"validate", "recipes/gpt_3d.toml", "--nproc", "6"});
  EXPECT_HAS(mesh, "needs a world size divisible by 4, but there are 6 ranks");
  auto fits = run_host({"validate", "recipes/gpt_3d.toml", "--nproc", "8"}, {}, 300);
  EXPECT_EQ(fits.exit_code, 0) << describe(fits);
  auto explicit_sizes = expect_clean_failure(
      {"validate", "recipes/gpt_text.toml", "--set", "parallel.dp_shard=3", "--nproc", "4"});
  EXPECT_HAS(explicit_sizes, "makes 3 ranks, but there are 4");
  auto heads = expect_clean_failure({"validate", "recipes/gpt_text.toml", "--set",
                                     "parallel.tp=2", "--set", "model.n_heads=3", "--set",
                                     "model.d_model=96"});
  EXPECT_HAS(heads, "n_heads");
  EXPECT_HAS(heads, "(3) does not divide by tp (2)");
  auto one_rank = run_host({"validate", "recipes/gpt_text.toml", "--set", "model.n_heads=3",
                            "--set", "model.d_model=96"},
                           {}, 300);
  EXPECT_EQ(one_rank.exit_code, 0) << describe(one_rank);
}

// The strategy checks the model validate builds (Strategy::check_model): a sharding mode the
// model's modules cannot take, and a model that cannot be cut into the mesh's stages, are
// one-line errors naming the option and the fix before any process starts, and run refuses
// the first the same way before training.
TEST(BadInputTest, ValidateRefusesShardingModesTheModelCannotTake) {
  const std::vector<std::string> batch_norm_in_bf16 = {
      "recipes/fashion_mnist_cnn.toml", "--set", "model.batch_norm=true",
      "--set", "strategy.plugin=fsdp",  "--set", "strategy.param_dtype=bfloat16"};
  std::vector<std::string> validate = {"validate"};
  validate.insert(validate.end(), batch_norm_in_bf16.begin(), batch_norm_in_bf16.end());
  auto error = expect_clean_failure(validate);
  EXPECT_HAS(error, "param_dtype = \"bfloat16\" cannot serve the model's BatchNorm layers");
  EXPECT_HAS(error, "use \"float32\" or \"auto\"");
  auto fits = run_host({"validate", "recipes/fashion_mnist_cnn.toml", "--set",
                        "strategy.plugin=fsdp", "--set", "strategy.param_dtype=float32"},
                       {}, 300);
  EXPECT_EQ(fits.exit_code, 0) << describe(fits);
  TempDir dir;
  std::vector<std::string> run = {"run"};
  run.insert(run.end(), batch_norm_in_bf16.begin(), batch_norm_in_bf16.end());
  run.insert(run.end(), {"--set", "run.output_dir=" + (dir / "out").string()});
  auto refused = expect_clean_failure(run);
  EXPECT_HAS(refused, "param_dtype = \"bfloat16\" cannot serve the model's BatchNorm layers");
  EXPECT_FALSE(fs::exists(dir / "out" / "checkpoints"));

  auto frozen = expect_clean_failure(
      {"validate", "recipes/llama_finetune.toml", "--set", "strategy.plugin=pipeline", "--set",
       "strategy.dp_sharding=full", "--set", "parallel.pp=2", "--nproc", "4"});
  EXPECT_HAS(frozen, "is frozen (requires no gradient); dp_sharding shards trainable parameters");
  EXPECT_HAS(frozen, "set dp_sharding = \"none\", or use fsdp");
  auto replicated =
      run_host({"validate", "recipes/llama_finetune.toml", "--set", "strategy.plugin=pipeline",
                "--set", "parallel.pp=2", "--nproc", "4"},
               {}, 300);
  EXPECT_EQ(replicated.exit_code, 0) << describe(replicated);

  auto stages = expect_clean_failure({"validate", "recipes/fashion_mnist_mlp.toml", "--set",
                                      "strategy.plugin=pipeline", "--set", "parallel.pp=8",
                                      "--nproc", "8"});
  EXPECT_HAS(stages, "fewer than the 8 stages (pp 8 x virtual_stages 1); lower pp");
}

TEST(BadInputTest, PluginFactoryExceptionIsReported) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) + "[sinks.throwing]\n");
  fs::path plugin = test_plugin_folder() / "libthrowing.so";
  auto error = expect_clean_failure({"run", recipe.string(), "--plugin-path", plugin.string()});
  EXPECT_HAS(error, "sink plugin 'throwing'");
  EXPECT_HAS(error, "always throws");
}

TEST(BadInputTest, UnavailableDeviceIsNamed) {
  TempDir dir;
  auto recipe = dir.write("r.toml", kValidRecipe);
  auto result = run_host({"run", recipe.string(), "--set", "run.device=cuda"}, {}, 120);
  if (result.exit_code == 0) GTEST_SKIP() << "a CUDA device is present";
  auto error = expect_clean_failure({"run", recipe.string(), "--set", "run.device=cuda"});
  EXPECT_HAS(error, "'cuda', which is not available");
}

TEST(BadInputTest, CorruptCheckpointIsNotLoaded) {
  TempDir dir;
  auto recipe = dir.write("r.toml", std::string(kValidRecipe) + "[checkpoint]\nplugin = \"torch\"\n");
  auto out = "run.output_dir=" + (dir / "out").string();
  auto first = run_host({"run", recipe.string(), "--set", out});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // 64 samples in batches of 64 for one epoch: the checkpoint of step 1.
  fs::path checkpoint = dir / "out" / "checkpoints" / "step-000000001";
  ASSERT_TRUE(fs::exists(checkpoint / "shared.pt"));
  fs::resize_file(checkpoint / "shared.pt", 100);
  auto error = expect_clean_failure(
      {"run", recipe.string(), "--set", out, "--resume", checkpoint.string()});
  EXPECT_HAS(error, (checkpoint / "shared.pt").string());
  EXPECT_HAS(error, "truncated");
}

TEST(BadInputTest, UnknownCommandAndOptionAreUsageErrors) {
  auto command = run_host({"trian"});
  EXPECT_EQ(command.exit_code, 2);
  EXPECT_NE(command.err.find("unknown command 'trian'"), std::string::npos);
  auto option = run_host({"run", "recipes/fashion_mnist_cnn.toml", "--frobnicate"});
  EXPECT_EQ(option.exit_code, 2);
  EXPECT_NE(option.err.find("frobnicate"), std::string::npos);
}

}  // namespace
}  // namespace trainyard::testing
