// Checkpoint backend conformance: tensors of every common dtype and shape and metadata strings
// round-trip exactly; truncated, garbage and missing files are Errors naming the file.

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>

#include "conformance.hpp"
#include "test_support.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/error.hpp"

namespace {

namespace fs = std::filesystem;
using trainyard::CheckpointBackend;
using trainyard::StateDict;

class CheckpointConformance : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<CheckpointBackend> build() {
    return trainyard::conformance::registry().create<CheckpointBackend>(
        GetParam(), trainyard::conformance::under_test("checkpoint"),
        trainyard::conformance::classification_context());
  }

  static StateDict sample_state() {
    torch::manual_seed(5);
    StateDict state;
    state.tensors["model.weight"] = torch::randn({3, 4});
    state.tensors["model.double"] = torch::randn({2, 2}, torch::kDouble);
    state.tensors["model.bf16"] = torch::randn({5}).to(torch::kBFloat16);
    state.tensors["optimizer.param.0.step"] = torch::scalar_tensor(17, torch::kLong);
    state.tensors["long.vector"] = torch::arange(-3, 9, torch::kLong);
    state.tensors["bytes"] = torch::randint(0, 256, {2, 3, 4}, torch::kUInt8);
    state.tensors["scalar.float"] = torch::scalar_tensor(2.5f);
    state.tensors["empty"] = torch::empty({0});
    state.tensors["empty.2d"] = torch::empty({0, 7}, torch::kDouble);
    state.tensors["rng.state"] = torch::randint(0, 256, {5056}, torch::kUInt8);
    // A non-contiguous view must be written by value.
    state.tensors["transposed"] = torch::arange(12, torch::kFloat).reshape({3, 4}).t();
    state.metadata["version"] = "1.2.3";
    state.metadata["recipe"] = "name = \"x\"\n[model]\nplugin = \"mlp\"\n";
    state.metadata["empty"] = "";
    state.metadata["unicode"] = "λ — ünïcødé";
    return state;
  }

  void write_ok(const CheckpointBackend& backend, const fs::path& file) {
    backend.write(file, sample_state());
    ASSERT_GT(std::filesystem::file_size(file), 0u);
  }

  // Expects read(file) to throw trainyard::Error naming the file.
  static void expect_error_naming(const CheckpointBackend& backend, const fs::path& file,
                                  const std::string& what) {
    try {
      backend.read(file);
      ADD_FAILURE() << what << ": read() succeeded";
    } catch (const trainyard::Error& error) {
      EXPECT_NE(std::string(error.what()).find(file.string()), std::string::npos)
          << what << ": the message does not name " << file << ": " << error.what();
    } catch (const std::exception& error) {
      ADD_FAILURE() << what << ": threw something other than trainyard::Error: " << error.what();
    }
  }
};

TEST_P(CheckpointConformance, ExtensionStartsWithADot) {
  auto backend = build();
  const std::string extension = backend->extension();
  ASSERT_GE(extension.size(), 2u);
  EXPECT_EQ(extension[0], '.');
  EXPECT_EQ(extension.find('/'), std::string::npos);
}

TEST_P(CheckpointConformance, RoundTripIsExact) {
  auto backend = build();
  trainyard::testing::TempDir dir;
  const fs::path file = dir / ("state" + backend->extension());
  const StateDict expected = sample_state();
  backend->write(file, expected);
  StateDict got = backend->read(file);
  EXPECT_EQ(got.metadata, expected.metadata);
  ASSERT_EQ(got.tensors.size(), expected.tensors.size());
  for (const auto& [name, tensor] : expected.tensors) {
    auto it = got.tensors.find(name);
    ASSERT_NE(it, got.tensors.end()) << "'" << name << "' missing after read";
    const auto& back = it->second;
    EXPECT_EQ(back.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), tensor.sizes()) << name;
    EXPECT_EQ(back.device().type(), torch::kCPU) << name;
    if (back.scalar_type() == tensor.scalar_type() && back.sizes().equals(tensor.sizes())) {
      EXPECT_TRUE(at::equal(back, tensor)) << "'" << name << "' changed";
    }
  }
}

TEST_P(CheckpointConformance, EmptyStateRoundTrips) {
  auto backend = build();
  trainyard::testing::TempDir dir;
  const fs::path file = dir / ("empty" + backend->extension());
  backend->write(file, StateDict{});
  StateDict got = backend->read(file);
  EXPECT_TRUE(got.tensors.empty());
  EXPECT_TRUE(got.metadata.empty());
}

TEST_P(CheckpointConformance, TruncatedFileIsAnErrorNamingIt) {
  auto backend = build();
  trainyard::testing::TempDir dir;
  const fs::path file = dir / ("truncated" + backend->extension());
  write_ok(*backend, file);
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  expect_error_naming(*backend, file, "truncated to half");
}

TEST_P(CheckpointConformance, TruncatedAtSeveralPointsIsAnError) {
  auto backend = build();
  trainyard::testing::TempDir dir;
  const fs::path good = dir / ("good" + backend->extension());
  write_ok(*backend, good);
  const auto size = static_cast<long long>(std::filesystem::file_size(good));
  for (double fraction : {0.0, 0.1, 0.9}) {
    const auto keep = static_cast<long long>(static_cast<double>(size) * fraction);
    if (keep >= size) continue;
    const fs::path file = dir / ("cut" + std::to_string(keep) + backend->extension());
    write_ok(*backend, file);
    std::filesystem::resize_file(file, keep);
    expect_error_naming(*backend, file, "truncated to " + std::to_string(keep) + " bytes");
  }
}

TEST_P(CheckpointConformance, GarbageFileIsAnErrorNamingIt) {
  auto backend = build();
  trainyard::testing::TempDir dir;
  const fs::path file = dir / ("garbage" + backend->extension());
  {
    std::ofstream out(file, std::ios::binary);
    std::uint32_t x = 12345;
    for (int i = 0; i < 4096; ++i) {
      x = x * 1664525u + 1013904223u;
      out.put(static_cast<char>(x >> 24));
    }
  }
  expect_error_naming(*backend, file, "garbage bytes");
}

TEST_P(CheckpointConformance, LargeTensorsRoundTripAndTheWriterCountsEveryByte) {
  // Tensors of several megabytes go from their memory straight to the file, in stretches, around
  // small ones that are gathered: the order of the bytes must survive both ways.
  auto backend = build();
  trainyard::testing::TempDir dir;
  torch::manual_seed(9);
  StateDict expected;
  expected.tensors["a.large"] = torch::randn({3 << 20});
  expected.tensors["b.small"] = torch::arange(7, torch::kLong);
  expected.tensors["c.large.view"] = torch::randn({1 << 10, 5 << 10}).t();
  expected.tensors["d.tiny"] = torch::scalar_tensor(1.5);
  expected.metadata["step"] = "12";
  trainyard::CheckpointFileWriter out(dir / ("large" + backend->extension()));
  backend->write_to(out, expected);
  const trainyard::CheckpointFileInfo info = out.finish();
  EXPECT_EQ(info.bytes, static_cast<std::int64_t>(fs::file_size(out.path())));
  EXPECT_EQ(info.name, out.path().filename().string());
  StateDict got = backend->read(out.path());
  EXPECT_EQ(got.metadata, expected.metadata);
  ASSERT_EQ(got.tensors.size(), expected.tensors.size());
  for (const auto& [name, tensor] : expected.tensors) {
    ASSERT_TRUE(got.tensors.count(name)) << name;
    EXPECT_TRUE(at::equal(got.tensors.at(name), tensor)) << "'" << name << "' changed";
  }
}

TEST_P(CheckpointConformance, FullDiskIsAnErrorNamingTheFile) {
  // /dev/full accepts the open and fails every write with ENOSPC: the failure must come back as
  // an Error, whichever layer of the backend meets it (never a crash).
  auto backend = build();
  StateDict state = sample_state();
  state.tensors["large"] = torch::randn({1 << 20});
  try {
    trainyard::CheckpointFileWriter out("/dev/full");
    backend->write_to(out, state);
    out.finish();
    ADD_FAILURE() << "writing to /dev/full succeeded";
  } catch (const trainyard::Error& error) {
    EXPECT_HAS(error.what(), "/dev/full");
    EXPECT_HAS(error.what(), "No space left on device");
  }
}

TEST_P(CheckpointConformance, MissingFileIsAnErrorNamingIt) {
  auto backend = build();
  trainyard::testing::TempDir dir;
  expect_error_naming(*backend, dir / ("missing" + backend->extension()), "missing file");
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(CheckpointConformance, "checkpoint");
