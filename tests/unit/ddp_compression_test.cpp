// ddp's gradient compression (strategy.compression = fp16 | bf16, as PyTorch's DDP compression
// hooks): each rank's share of the average travels in the narrower dtype and the sum is rounded
// to it. Two ranks as threads over gloo take one step on different batches; their averaged
// gradients are compared with what PyTorch's own bf16_compress_hook / fp16_compress_hook make of
// each rank's own gradients, run by the venv's Python on two gloo ranks
// (ddp_compression_hook.py).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "step_harness.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard::testing {
namespace {

constexpr int kRanks = 2;
const std::vector<std::int64_t> kShape = {1, 8, 8};
constexpr std::int64_t kClasses = 10;

HarnessOptions cnn_options() {
  HarnessOptions options;
  options.model = "cnn";
  options.model_options = "channels = [4, 8]\nhidden = 16";
  options.input_shape = kShape;
  options.classes = kClasses;
  return options;
}

Batch batch_of_rank(int rank) {
  return random_batch(8, kShape, kClasses, 50 + static_cast<std::uint64_t>(rank));
}

// The averaged gradients each rank holds after one ddp step with `compression`.
std::vector<TensorMap> ddp_gradients(const std::string& compression) {
  return run_threaded_ranks<TensorMap>(kRanks, [&](int rank, int port) {
    HarnessOptions options = cnn_options();
    options.strategy = "ddp";
    options.strategy_options = "compression = \"" + compression + "\"";
    options.as_rank(rank, kRanks, port);
    StepHarness harness(options);
    Batch batch = batch_of_rank(rank);
    harness.strategy->train_step(std::span<const Batch>(&batch, 1));
    TensorMap gradients = harness.gradients();
    harness.context.communicator->barrier();
    return gradients;
  });
}

// Each rank's own gradients, from one process on that rank's batch.
std::vector<TensorMap> local_gradients() {
  std::vector<TensorMap> out;
  for (int rank = 0; rank < kRanks; ++rank) {
    StepHarness harness(cnn_options());
    Batch batch = batch_of_rank(rank);
    harness.strategy->train_step(std::span<const Batch>(&batch, 1));
    out.push_back(harness.gradients());
  }
  return out;
}

at::Tensor rounded(const at::Tensor& tensor, at::ScalarType wire) {
  return tensor.to(wire).to(tensor.scalar_type());
}

// Every gradient flattened into one float32 tensor, in name order: a DDP bucket's buffer.
at::Tensor bucket_of(const TensorMap& gradients) {
  std::vector<at::Tensor> parts;
  for (const auto& [name, gradient] : gradients) parts.push_back(gradient.reshape({-1}));
  return at::cat(parts).to(at::kFloat).contiguous();
}

void write_raw(const std::filesystem::path& file, const at::Tensor& values) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data_ptr<float>()),
            static_cast<std::streamsize>(values.numel() * 4));
}

at::Tensor read_raw(const std::filesystem::path& file, std::int64_t count) {
  at::Tensor values = at::empty({count}, at::kFloat);
  std::ifstream in(file, std::ios::binary);
  in.read(reinterpret_cast<char*>(values.data_ptr<float>()),
          static_cast<std::streamsize>(count * 4));
  EXPECT_EQ(in.gcount(), count * 4) << file;
  return values;
}

void expect_compressed_average(const std::string& compression, at::ScalarType wire) {
  const std::filesystem::path python = source_dir() / ".venv/bin/python";
  if (!std::filesystem::exists(python)) {
    TRAINYARD_SKIP_MISSING() << "no " << python << ": cannot run PyTorch's compression hook";
  }
  at::set_num_threads(1);
  const std::vector<TensorMap> averaged = ddp_gradients(compression);
  const std::vector<TensorMap> local = local_gradients();
  ASSERT_EQ(averaged[0].size(), local[0].size());
  ASSERT_FALSE(averaged[0].empty());
  for (const auto& [name, gradient] : averaged[0]) {
    // Every rank holds the same average, a value of the wire dtype.
    EXPECT_TRUE(at::equal(averaged[1].at(name), gradient)) << name;
    EXPECT_TRUE(at::equal(rounded(gradient, wire), gradient)) << name;
  }
  // What PyTorch's hook makes of each rank's own gradients.
  TempDir dir;
  std::vector<std::string> argv = {python.string(),
                                   (source_dir() / "tests/unit/ddp_compression_hook.py").string(),
                                   compression};
  for (int rank = 0; rank < kRanks; ++rank) {
    const auto file = dir / ("rank" + std::to_string(rank) + ".f32");
    write_raw(file, bucket_of(local[static_cast<std::size_t>(rank)]));
    argv.push_back(file.string());
  }
  argv.push_back((dir / "average.f32").string());
  const CommandResult hook = run_command(argv, {}, 300);
  ASSERT_EQ(hook.exit_code, 0) << describe(hook);
  const at::Tensor ours = bucket_of(averaged[0]);
  const at::Tensor expected = read_raw(dir / "average.f32", ours.numel());
  // One unit in the last place of the wire dtype, relative: the local gradients of the two
  // computations may differ in their last fp32 bits, which can move a rounding by one unit;
  // nearly every value must match PyTorch's bit for bit.
  const double unit = wire == at::kHalf ? 1.0 / 1024 : 1.0 / 128;
  EXPECT_TRUE(at::allclose(ours, expected, unit, 1e-12))
      << "differs from PyTorch's hook by up to " << (ours - expected).abs().max().item<double>();
  const double same = ours.eq(expected).to(at::kDouble).mean().item<double>();
  EXPECT_GE(same, 0.99) << "share of values equal to PyTorch's hook's, bit for bit";
}

TEST(DdpCompression, Bf16AveragesEachRanksRoundedShareInBf16) {
  expect_compressed_average("bf16", at::kBFloat16);
}

TEST(DdpCompression, Fp16AveragesEachRanksRoundedShareInFp16) {
  expect_compressed_average("fp16", at::kHalf);
}

TEST(DdpCompression, WithoutCompressionTheAverageKeepsFp32) {
  // The checks above can fail: the plain fp32 average is the exact mean of the local gradients,
  // most of whose values bf16 cannot hold.
  at::set_num_threads(1);
  const std::vector<TensorMap> averaged = ddp_gradients("none");
  const std::vector<TensorMap> local = local_gradients();
  bool any_unrepresentable = false;
  for (const auto& [name, gradient] : averaged[0]) {
    at::Tensor mean = (local[0].at(name) + local[1].at(name)) / kRanks;
    EXPECT_TRUE(at::allclose(gradient, mean, 1.3e-6, 1e-5)) << name;
    if (!at::equal(rounded(gradient, at::kBFloat16), gradient)) any_unrepresentable = true;
  }
  EXPECT_TRUE(any_unrepresentable);
}

TEST(DdpCompression, UnknownDtypeIsAOneLineError) {
  BuildContext build;
  try {
    bundled_registry().create<Strategy>(
        "ddp", options_section("strategy", "compression = \"int8\""), build);
    FAIL() << "compression = int8 was accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("compression"), std::string::npos) << message;
    EXPECT_NE(message.find("int8"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace trainyard::testing
