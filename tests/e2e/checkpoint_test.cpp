// Checkpoint formats and tools: safetensors files other programs read, headers that lie,
// `trainyard checkpoint inspect` and `export`.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"
#include "trainyard/runtime/plugin_loader.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    load_bundled_plugins(registry_);
    backend_ = registry_.create<CheckpointBackend>("safetensors", Config({}, "checkpoint"),
                                                  BuildContext{});
  }

  static StateDict sample() {
    at::manual_seed(11);
    StateDict state;
    state.tensors["w.f32"] = at::randn({3, 5});
    state.tensors["w.f64"] = at::randn({4}, at::kDouble);
    state.tensors["w.f16"] = at::randn({2, 3}).to(at::kHalf);
    state.tensors["w.bf16"] = at::randn({7}).to(at::kBFloat16);
    state.tensors["i.i64"] = at::arange(-5, 5, at::kLong);
    state.tensors["i.i32"] = at::arange(0, 6, at::kInt).reshape({2, 3});
    state.tensors["u.u8"] = at::randint(0, 256, {9}, at::kByte);
    state.tensors["b.bool"] = at::rand({5}) > 0.5;
    state.tensors["s.scalar"] = at::scalar_tensor(3.25);
    state.tensors["e.empty"] = at::empty({0, 3});
    state.tensors["t.view"] = at::arange(12, at::kFloat).reshape({3, 4}).t();
    state.metadata["note"] = "line one\nline \"two\" λ";
    return state;
  }

  static void expect_equal(const StateDict& expected, const StateDict& actual) {
    ASSERT_EQ(expected.tensors.size(), actual.tensors.size());
    for (const auto& [name, tensor] : expected.tensors) {
      auto it = actual.tensors.find(name);
      ASSERT_NE(it, actual.tensors.end()) << name;
      EXPECT_EQ(it->second.scalar_type(), tensor.scalar_type()) << name;
      EXPECT_EQ(it->second.sizes(), tensor.sizes()) << name;
      EXPECT_TRUE(at::equal(it->second, tensor.contiguous())) << name;
    }
    EXPECT_EQ(actual.metadata, expected.metadata);
  }

  // A file of the given header text and data bytes, with a correct length prefix unless
  // `length` overrides it.
  fs::path craft(const std::string& name, const std::string& header, std::size_t data_bytes,
                 std::optional<std::uint64_t> length = std::nullopt) {
    fs::path file = dir_ / name;
    std::ofstream out(file, std::ios::binary);
    std::uint64_t n = length.value_or(header.size());
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xFF));
    out << header << std::string(data_bytes, '\0');
    return file;
  }

  std::string read_error(const fs::path& file) {
    std::string message = error_of([&] { backend_->read(file); });
    EXPECT_HAS(message, file.string());
    return message;
  }

  Registry registry_;
  std::shared_ptr<CheckpointBackend> backend_;
  TempDir dir_;
};

TEST_F(SafetensorsTest, FileIsReadByPythonsSafetensorsWithIdenticalTensors) {
  const fs::path python = source_dir() / ".venv" / "bin" / "python";
  if (!fs::exists(python) ||
      run_command({python.string(), "-c", "import safetensors.torch"}).exit_code != 0) {
    TRAINYARD_SKIP_MISSING() << "Python with the safetensors package is not available (tools/setup installs it)";
  }
  StateDict original = sample();
  const fs::path ours = dir_ / "ours.safetensors";
  const fs::path theirs = dir_ / "theirs.safetensors";
  backend_->write(ours, original);
  // Python loads our file and writes it back with its own writer; reading that file gives the
  // same tensors, so both directions agree.
  auto result = run_command(
      {python.string(), "-c",
       "import sys\n"
       "from safetensors import safe_open\n"
       "from safetensors.torch import load_file, save_file\n"
       "tensors = load_file(sys.argv[1])\n"
       "with safe_open(sys.argv[1], 'pt') as f: metadata = f.metadata()\n"
       "assert tensors['w.bf16'].dtype.__str__() == 'torch.bfloat16'\n"
       "assert tuple(tensors['t.view'].shape) == (4, 3)\n"
       "save_file(tensors, sys.argv[2], metadata=metadata)\n"
       "print(len(tensors))\n",
       ours.string(), theirs.string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_EQ(result.out, std::to_string(original.tensors.size()) + "\n");
  expect_equal(original, backend_->read(theirs));
}

TEST_F(SafetensorsTest, RoundTripKeepsDtypesShapesAndMetadata) {
  StateDict original = sample();
  backend_->write(dir_ / "a.safetensors", original);
  expect_equal(original, backend_->read(dir_ / "a.safetensors"));
}

TEST_F(SafetensorsTest, HeaderLengthBeyondTheFileIsRefused) {
  auto file = craft("long.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                    4, 5000);
  EXPECT_HAS(read_error(file), "runs past the end");
}

TEST_F(SafetensorsTest, HugeHeaderLengthIsRefusedBeforeReading) {
  auto file = craft("huge.safetensors", "{}", 0, std::uint64_t{1} << 40);
  EXPECT_HAS(read_error(file), "exceeds the 100 MB bound");
}

TEST_F(SafetensorsTest, OffsetsPastTheDataAreRefused) {
  auto file = craft("past.safetensors",
                    R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  std::string message = read_error(file);
  EXPECT_HAS(message, "tensor 'a' claims bytes [0, 16) of a 8-byte data section");
}

TEST_F(SafetensorsTest, SizeDisagreeingWithShapeIsRefused) {
  auto file = craft("shape.safetensors",
                    R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_HAS(read_error(file), "has 8 bytes of data but its shape and dtype need 12");
}

TEST_F(SafetensorsTest, OverlappingTensorsAreRefused) {
  auto file = craft("overlap.safetensors",
                    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12);
  EXPECT_HAS(read_error(file), "overlapping or gapped");
}

TEST_F(SafetensorsTest, TrailingBytesAreRefused) {
  auto file = craft("trailing.safetensors",
                    R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9);
  EXPECT_HAS(read_error(file), "trailing bytes");
}

TEST_F(SafetensorsTest, MalformedHeadersAreRefused) {
  EXPECT_HAS(read_error(craft("json.safetensors", R"({"a": )", 0)), "invalid JSON at byte");
  EXPECT_HAS(read_error(craft("dtype.safetensors",
                              R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})", 4)),
             "unknown dtype 'F7'");
  EXPECT_HAS(read_error(craft("dup.safetensors",
                              R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                              R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                              2)),
             "duplicate entry 'a'");
  EXPECT_HAS(read_error(craft("neg.safetensors",
                              R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1)),
             "not a non-negative integer");
  const fs::path tiny = dir_ / "tiny.safetensors";
  std::ofstream(tiny) << "abc";
  EXPECT_HAS(read_error(tiny), "shorter than the 8-byte header length");
}

TEST_F(SafetensorsTest, AmbiguousOrHostileHeadersAreRefused) {
  const std::string u8_entry = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_HAS(read_error(craft("array.safetensors", "[]", 0)), "header is not a JSON object");
  EXPECT_HAS(read_error(craft("not_entry.safetensors", R"({"a":[0,1]})", 1)),
             "tensor 'a' lacks a valid dtype, shape or data_offsets");
  EXPECT_HAS(read_error(craft("three_offsets.safetensors",
                              R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}})", 1)),
             "tensor 'a' lacks a valid dtype, shape or data_offsets");
  // A name given twice anywhere leaves the reader to guess which one counts.
  EXPECT_HAS(read_error(craft("dup_metadata.safetensors",
                              R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})", 0)),
             "duplicate entry '__metadata__'");
  EXPECT_HAS(read_error(craft("dup_metadata_key.safetensors",
                              R"({"__metadata__":{"k":"1","k":"2"}})", 0)),
             "duplicate entry 'k'");
  EXPECT_HAS(read_error(craft("dup_field.safetensors",
                              R"({"a":{"dtype":"U8","dtype":"F32","shape":[1],)"
                              R"("data_offsets":[0,1]}})",
                              1)),
             "duplicate entry 'dtype'");
  EXPECT_HAS(read_error(craft("metadata_number.safetensors", R"({"__metadata__":{"k":1}})", 0)),
             "__metadata__ entry 'k' is not a string");
  // Deep nesting is refused before it costs memory or stack.
  const std::string deep = R"({"__metadata__":)" + std::string(100000, '[') + "]}";
  EXPECT_HAS(read_error(craft("deep.safetensors", deep, 0)), "nested deeper than 64");
  // Offsets are read exactly as 64-bit integers: 2^53 + 1 has no double.
  EXPECT_HAS(read_error(craft("big_offset.safetensors",
                              R"({"a":{"dtype":"U8","shape":[1],)"
                              R"("data_offsets":[9007199254740993,9007199254740994]}})",
                              1)),
             "claims bytes [9007199254740993, 9007199254740994) of a 1-byte data section");
  EXPECT_HAS(read_error(craft("max_offset.safetensors",
                              R"({"a":{"dtype":"U8","shape":[1],)"
                              R"("data_offsets":[0,18446744073709551615]}})",
                              1)),
             "claims bytes [0, 18446744073709551615)");
  for (const char* bad : {"18446744073709551616", "1.0", "1e0", "-0", "0.5"}) {
    const std::string header =
        std::string(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,)") + bad + "]}}";
    EXPECT_HAS(read_error(craft("offset.safetensors", header, 1)),
               "tensor 'a' data offset is not a non-negative integer")
        << bad;
  }
  EXPECT_HAS(read_error(craft("string_offset.safetensors",
                              R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]}})", 1)),
             "tensor 'a' data offset is not a number");
  EXPECT_HAS(read_error(craft("huge_shape.safetensors",
                              R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,2],)"
                              R"("data_offsets":[0,4]}})",
                              4)),
             "tensor 'a' has an impossible shape");
  // No elements, but strides beyond 64 bits: LibTorch could not make the tensor.
  EXPECT_HAS(read_error(craft("huge_empty_shape.safetensors",
                              R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],)"
                              R"("data_offsets":[0,0]}})",
                              0)),
             "tensor 'a' has an impossible shape");
  EXPECT_HAS(read_error(craft("bom.safetensors", "\xEF\xBB\xBF{}", 0)), "byte order mark");
  EXPECT_HAS(read_error(craft("utf8.safetensors", "{\"\xff\":" + u8_entry + "}", 1)),
             "invalid JSON at byte 2");
  EXPECT_HAS(read_error(craft("trailing_json.safetensors", "{} {}", 0)), "invalid JSON at byte 3");
}

// A short run that leaves one checkpoint; returns its folder.
fs::path train_with_checkpoint(const TempDir& dir, const std::string& backend) {
  auto recipe = dir.write("recipe.toml", R"(
[run]
seed = 1
max_steps = 6
eval = false
[loader]
batch_size = 16
workers = 0
[dataset]
plugin = "synthetic"
samples = 128
eval_samples = 32
input_shape = [1, 8, 8]
[model]
plugin = "mlp"
hidden = [16]
[optimizer]
plugin = "adamw"
[checkpoint]
plugin = ")" + backend + R"("
)");
  auto result = run_host({"run", recipe.string(), "--set", "run.output_dir=" + (dir / "out").string()});
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  return dir / "out" / "checkpoints" / "step-000000006";
}

TEST(CheckpointCommandTest, InspectShowsStepFilesTensorsAndStatus) {
  TempDir dir;
  fs::path checkpoint = train_with_checkpoint(dir, "torch");
  auto result = run_host({"checkpoint", "inspect", checkpoint.string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.out, "step 6, backend torch");
  EXPECT_HAS(result.out, "shared.pt");
  EXPECT_HAS(result.out, "rank-00000.pt");
  EXPECT_HAS(result.out, "model.");
  EXPECT_HAS(result.out, "engine.step = 6");
  EXPECT_HAS(result.out, "status: valid");
}

TEST(CheckpointCommandTest, InspectReportsACorruptFileAndFails) {
  TempDir dir;
  fs::path checkpoint = train_with_checkpoint(dir, "safetensors");
  const fs::path shared = checkpoint / "shared.safetensors";
  {
    std::fstream file(shared, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x7f');
  }
  auto result = run_host({"checkpoint", "inspect", checkpoint.string()});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_HAS(result.out, "BAD");
  EXPECT_HAS(result.err, "trainyard: error: checkpoint file " + shared.string() + " fails its checksum");
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
}

TEST(CheckpointCommandTest, ExportWritesTheModelWeightsAsSafetensors) {
  TempDir dir;
  fs::path checkpoint = train_with_checkpoint(dir, "torch");
  const fs::path out = dir / "model.safetensors";
  auto result = run_host({"checkpoint", "export", checkpoint.string(), "--format", "safetensors",
                          "--out", out.string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_FALSE(fs::exists(out.string() + ".partial"));

  Registry registry;
  load_bundled_plugins(registry);
  auto torch_backend = registry.create<CheckpointBackend>("torch", Config({}, "checkpoint"), BuildContext{});
  auto safetensors = registry.create<CheckpointBackend>("safetensors", Config({}, "checkpoint"), BuildContext{});
  StateDict saved = torch_backend->read(checkpoint / "shared.pt");
  StateDict exported = safetensors->read(out);
  std::size_t model_entries = 0;
  for (const auto& [name, tensor] : saved.tensors) {
    if (name.rfind("model.", 0) != 0) continue;
    ++model_entries;
    auto it = exported.tensors.find(name.substr(6));
    ASSERT_NE(it, exported.tensors.end()) << name;
    EXPECT_TRUE(at::equal(it->second, tensor)) << name;
  }
  EXPECT_GT(model_entries, 0u);
  EXPECT_EQ(exported.tensors.size(), model_entries);
  EXPECT_EQ(exported.metadata.at("trainyard.step"), "6");
}

TEST(CheckpointCommandTest, ExportRefusesACorruptCheckpointAndBadArguments) {
  TempDir dir;
  fs::path checkpoint = train_with_checkpoint(dir, "torch");
  fs::resize_file(checkpoint / "shared.pt", 64);
  auto corrupt = run_host({"checkpoint", "export", checkpoint.string(), "--out",
                           (dir / "x.safetensors").string()});
  EXPECT_EQ(corrupt.exit_code, 1);
  EXPECT_HAS(corrupt.err, "truncated");
  EXPECT_FALSE(fs::exists(dir / "x.safetensors"));
  auto no_out = run_host({"checkpoint", "export", checkpoint.string()});
  EXPECT_EQ(no_out.exit_code, 2);
  EXPECT_HAS(no_out.err, "--out");
  auto missing = run_host({"checkpoint", "inspect", (dir / "nothing").string()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_HAS(missing.err, "has no manifest");
}

// --format hf needs the model's own description for transformers, which the mlp does not give;
// a shard size that is not one is refused before anything is read.
TEST(CheckpointCommandTest, HuggingFaceExportRefusesAModelWithoutAConfigAndBadSizes) {
  TempDir dir;
  fs::path checkpoint = train_with_checkpoint(dir, "torch");
  const fs::path out = dir / "hf";
  auto no_config = run_host(
      {"checkpoint", "export", checkpoint.string(), "--format", "hf", "--out", out.string()});
  EXPECT_EQ(no_config.exit_code, 1) << describe(no_config);
  EXPECT_HAS(no_config.err, "carries no Hugging Face config.json");
  EXPECT_EQ(std::count(no_config.err.begin(), no_config.err.end(), '\n'), 1) << no_config.err;
  auto bad_size = run_host({"checkpoint", "export", checkpoint.string(), "--format", "hf",
                            "--out", out.string(), "--max-shard-size", "5 GB"});
  EXPECT_EQ(bad_size.exit_code, 1) << describe(bad_size);
  EXPECT_HAS(bad_size.err, "--max-shard-size '5 GB' is not a size");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir / "hf.partial"));
}

// The shared (model + optimizer) tensors of two checkpoints are bitwise equal.
void expect_same_training_state(const fs::path& a, const fs::path& b) {
  Registry registry;
  load_bundled_plugins(registry);
  auto backend = registry.create<CheckpointBackend>("torch", Config({}, "checkpoint"), BuildContext{});
  StateDict left = backend->read(a / "shared.pt");
  StateDict right = backend->read(b / "shared.pt");
  ASSERT_EQ(left.tensors.size(), right.tensors.size());
  std::size_t compared = 0;
  for (const auto& [name, tensor] : left.tensors) {
    auto it = right.tensors.find(name);
    ASSERT_NE(it, right.tensors.end()) << name;
    EXPECT_TRUE(at::equal(tensor, it->second)) << name << " differs";
    ++compared;
  }
  EXPECT_GT(compared, 10u);
  EXPECT_EQ(left.metadata.at("engine.step"), right.metadata.at("engine.step"));
}

constexpr const char* kResumeRecipe = R"(
[run]
seed = 5
epochs = 10
log_every = 5
eval = false
[loader]
batch_size = 32
workers = 2
[dataset]
plugin = "synthetic"
samples = 640
eval_samples = 0
input_shape = [1, 16, 16]
[model]
plugin = "cnn"
channels = [4, 8]
hidden = 32
dropout = 0.3
[optimizer]
plugin = "adamw"
[checkpoint]
plugin = "torch"
every_steps = 5
keep = 0
)";

TEST(CrashResumeTest, KillNineMidEpochThenResumeIsBitwiseExact) {
  // 20 steps per epoch; the kill lands after step 30 (mid-epoch), the runs end at step 60.
  TempDir dir;
  auto recipe = dir.write("recipe.toml", kResumeRecipe);
  auto run = [&](const std::string& out, const std::vector<std::string>& extra,
                 const std::function<bool()>& kill_when = {}) {
    std::vector<std::string> argv = {host_binary().string(), "run", recipe.string(), "--set",
                                     "run.output_dir=" + (dir / out).string(), "--set",
                                     "run.max_steps=60"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_command(argv, source_dir(), 600, {}, kill_when);
  };
  auto whole = run("whole", {});
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);

  const fs::path step30 = dir / "crashed" / "checkpoints" / "step-000000030";
  auto crashed = run("crashed", {}, [&] { return fs::exists(step30 / "manifest.toml"); });
  ASSERT_TRUE(crashed.killed) << "the run ended before the kill: " << describe(crashed);
  ASSERT_FALSE(fs::exists(dir / "crashed" / "checkpoints" / "step-000000060"));

  auto resumed = run("crashed", {"--resume", "auto"});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_HAS(resumed.err, "resumed from");
  expect_same_training_state(dir / "whole" / "checkpoints" / "step-000000060",
                             dir / "crashed" / "checkpoints" / "step-000000060");
}

TEST(CrashResumeTest, AsyncSavesHoldTheSameStateAsSyncSaves) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", kResumeRecipe);
  auto run = [&](const std::string& out, bool async) {
    return run_host({"run", recipe.string(), "--set", "run.output_dir=" + (dir / out).string(),
                     "--set", "run.max_steps=25", "--set",
                     std::string("checkpoint.async=") + (async ? "true" : "false")});
  };
  auto sync = run("sync", false);
  ASSERT_EQ(sync.exit_code, 0) << describe(sync);
  auto async = run("async", true);
  ASSERT_EQ(async.exit_code, 0) << describe(async);
  for (const char* step : {"step-000000005", "step-000000020", "step-000000025"}) {
    SCOPED_TRACE(step);
    expect_same_training_state(dir / "sync" / "checkpoints" / step,
                               dir / "async" / "checkpoints" / step);
  }
}

TEST(CheckpointPolicyTest, EverySecondsSavesAtLoggingBoundariesOnceTimeIsUp) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", kResumeRecipe);
  auto result = run_host({"run", recipe.string(), "--set", "run.output_dir=" + (dir / "out").string(),
                          "--set", "run.max_steps=12", "--set", "run.log_every=4", "--set",
                          "checkpoint.every_steps=0", "--set", "checkpoint.every_seconds=0.000001",
                          "--set", "checkpoint.at_end=false"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir / "out" / "checkpoints")) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  // Time is always up, so every logging boundary before the end saves: steps 4 and 8.
  EXPECT_EQ(names, (std::vector<std::string>{"step-000000004", "step-000000008"}));
}

TEST(CrashResumeTest, KillsDuringSavesNeverLeaveAPartialCheckpointToLoad) {
  // A model whose checkpoints (weights + AdamW moments, ~25 MB) take far longer to write than
  // a step: most kills land inside a save.
  TempDir dir;
  auto recipe = dir.write("recipe.toml", R"(
[run]
seed = 2
max_steps = 100000
epochs = 1000
log_every = 1000
eval = false
threads = 1
[loader]
batch_size = 8
workers = 0
[dataset]
plugin = "synthetic"
samples = 256
eval_samples = 0
input_shape = [1, 28, 28]
[model]
plugin = "mlp"
hidden = [1024, 1024]
[optimizer]
plugin = "adamw"
[checkpoint]
plugin = "torch"
every_steps = 1
keep = 2
)");
  Registry registry;
  load_bundled_plugins(registry);
  auto backend = registry.create<CheckpointBackend>("torch", Config({}, "checkpoint"), BuildContext{});
  CheckpointStore store(backend, "torch", dir / "out" / "checkpoints", 0);

  std::mt19937 random(1234);
  std::uniform_int_distribution<int> delay_ms(0, 400);
  int resumed = 0;
  int partial_seen = 0;
  std::int64_t last_step = -1;
  const fs::path folder = dir / "out" / "checkpoints";
  // The number of entries (committed or staging) in the checkpoint folder.
  auto entries = [&] {
    std::error_code ec;
    std::size_t count = 0;
    for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      ++count;
    }
    return count;
  };
  for (int attempt = 0; attempt < 12; ++attempt) {
    // Saving has begun once the folder changes; the kill comes a random moment later.
    const std::size_t before = entries();
    std::optional<std::chrono::steady_clock::time_point> saving_since;
    const auto delay = std::chrono::milliseconds(delay_ms(random));
    auto result = run_command(
        {host_binary().string(), "run", recipe.string(), "--set",
         "run.output_dir=" + (dir / "out").string(), "--resume", "auto"},
        source_dir(), 120, {}, [&] {
          const auto now = std::chrono::steady_clock::now();
          if (!saving_since && entries() != before) saving_since = now;
          return saving_since && now - *saving_since >= delay;
        });
    ASSERT_TRUE(result.killed) << describe(result);
    // Whatever the moment of the kill, everything listed as committed verifies...
    for (const auto& checkpoint : store.list()) {
      EXPECT_NO_THROW(verify_checkpoint(checkpoint, read_manifest(checkpoint)))
          << "attempt " << attempt << ": " << checkpoint;
    }
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (entry.path().extension() == ".partial") ++partial_seen;
    }
    // ...and a resumed run starts from the newest of them, never from a partial one.
    if (result.err.find("resumed from") != std::string::npos) {
      ++resumed;
      std::smatch match;
      const std::string err = result.err;
      ASSERT_TRUE(std::regex_search(err, match, std::regex(R"(at step (\d+))"))) << err;
      const std::int64_t step = std::stoll(match[1]);
      EXPECT_GE(step, last_step) << "resumed from an older checkpoint than the last one";
      last_step = step;
    }
  }
  auto latest = store.latest_valid({});
  ASSERT_TRUE(latest);
  EXPECT_NO_THROW(store.load(*latest));
  EXPECT_GE(resumed, 8) << "too few runs got far enough to save";
  EXPECT_GE(partial_seen, 1) << "no kill landed inside a save; the test proves nothing";
}

}  // namespace
}  // namespace trainyard::testing
