// Per-parameter initialization: stable seeds, the values Python's torch draws from the same seed,
// the same values whatever the tensor's dtype, layout or device, LibTorch's default
// distributions, and the global generator left alone.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <cmath>

#include "test_support.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/models/parameter_init.hpp"

namespace trainyard {
namespace {

// Pinned so that a checkpoint's initial values never change under a rebuild; computed
// independently (FNV-1a in Python) from the definition in parameter_init.hpp.
TEST(ParameterSeed, IsFnv1aOfTheSeedAndTheNameFoldedTo32Bits) {
  EXPECT_EQ(parameter_seed(0, ""), 2162016759u);
  EXPECT_EQ(parameter_seed(1234, "layer0.qkv.weight"), 2525839062u);
  EXPECT_EQ(parameter_seed(~std::uint64_t{0}, "embed.token.weight"), 3656593939u);
  EXPECT_NE(parameter_seed(1234, "layer0.qkv.weight"), parameter_seed(1235, "layer0.qkv.weight"));
  EXPECT_NE(parameter_seed(1234, "layer0.qkv.weight"), parameter_seed(1234, "layer1.qkv.weight"));
}

// What torch.empty(4).uniform_(-1, 1, generator=torch.Generator().manual_seed(2525839062))
// gives in Python.
TEST(ParameterInit, DrawsWhatPythonDrawsFromTheParametersSeed) {
  at::Tensor values = at::empty({4});
  ParameterInit(1234).uniform(values, "layer0.qkv.weight", -1, 1);
  const std::vector<float> expected = {0.7687294483184814f, 0.798392653465271f,
                                       -0.15004920959472656f, 0.9033758640289307f};
  for (std::int64_t i = 0; i < 4; ++i) EXPECT_EQ(values[i].item<float>(), expected[i]) << i;
}

TEST(ParameterInit, SameNameSameValuesWhateverTheDtypeOrLayout) {
  const ParameterInit init(7);
  at::Tensor reference = at::empty({16, 9});
  init.normal(reference, "w", 0.0, 0.5);
  at::Tensor in_double = at::empty({16, 9}, at::kDouble);
  init.normal(in_double, "w", 0.0, 0.5);
  EXPECT_TRUE(at::equal(in_double, reference.to(at::kDouble)));
  // A transposed view is not contiguous: it is filled in the parameter's logical order.
  at::Tensor storage = at::empty({9, 16});
  init.normal(storage.t(), "w", 0.0, 0.5);
  EXPECT_TRUE(at::equal(storage.t(), reference));
  at::Tensor other = at::empty({16, 9});
  init.normal(other, "v", 0.0, 0.5);
  EXPECT_FALSE(at::equal(other, reference));
}

TEST(ParameterInit, ACudaTensorGetsTheCpuValues) {
  if (!torch::cuda::is_available()) TRAINYARD_SKIP_WITHOUT_GPU() << "no CUDA device";
  const ParameterInit init(7);
  at::Tensor on_cpu = at::empty({64, 33});
  init.kaiming_uniform(on_cpu, "layer0.qkv.weight", std::sqrt(5.0));
  at::Tensor on_cuda = at::empty({64, 33}, at::TensorOptions().device(at::kCUDA));
  init.kaiming_uniform(on_cuda, "layer0.qkv.weight", std::sqrt(5.0));
  EXPECT_TRUE(at::equal(on_cuda.cpu(), on_cpu));
}

TEST(ParameterInit, DefaultsFollowLibTorchsDistributions) {
  torch::nn::Sequential layers(
      torch::nn::Linear(400, 300), torch::nn::Conv2d(3, 8, 5), torch::nn::Embedding(50, 6),
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})), torch::nn::BatchNorm1d(5));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : layers->parameters()) p.fill_(42);
    for (auto& b : layers->buffers()) b.fill_(42);
  }
  ParameterInit(3).initialize_defaults(*layers, "block");
  auto params = layers->named_parameters();
  // kaiming_uniform_(a = sqrt(5)): bound sqrt(6 / (6 fan_in)) = 1 / sqrt(fan_in), as the bias's.
  for (const auto& [name, fan_in] :
       std::vector<std::pair<std::string, double>>{{"0", 400}, {"1", 75}}) {
    for (const char* part : {"weight", "bias"}) {
      const at::Tensor& p = params[name + "." + part];
      const double bound = 1 / std::sqrt(fan_in);
      EXPECT_LE(p.abs().max().item<double>(), bound) << name << "." << part;
      if (p.numel() >= 100) {  // enough draws to come near the bound
        EXPECT_GT(p.abs().max().item<double>(), 0.9 * bound) << name << "." << part;
      }
    }
  }
  const at::Tensor& embedding = params["2.weight"];
  EXPECT_NEAR(embedding.std().item<double>(), 1.0, 0.15);
  EXPECT_TRUE(at::equal(params["3.weight"], at::ones({6})));
  EXPECT_TRUE(at::equal(params["3.bias"], at::zeros({6})));
  EXPECT_TRUE(at::equal(params["4.weight"], at::ones({5})));
  auto buffers = layers->named_buffers();
  EXPECT_TRUE(at::equal(buffers["4.running_mean"], at::zeros({5})));
  EXPECT_TRUE(at::equal(buffers["4.running_var"], at::ones({5})));
  EXPECT_EQ(buffers["4.num_batches_tracked"].item<std::int64_t>(), 0);

  // Each parameter's stream is its full name's.
  at::Tensor expected = at::empty({300, 400});
  ParameterInit(3).kaiming_uniform(expected, "block.0.weight", std::sqrt(5.0));
  EXPECT_TRUE(at::equal(params["0.weight"], expected));
}

TEST(ParameterInit, RefusesModulesWithoutAKnownDefault) {
  struct Custom : torch::nn::Module {
    Custom() { register_parameter("scale", at::ones({3})); }
  };
  torch::nn::Module block;
  block.register_module("custom", std::make_shared<Custom>());
  try {
    ParameterInit(0).initialize_defaults(block, "head");
    ADD_FAILURE() << "a module without a known default must be refused";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("'head.custom'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("'scale'"), std::string::npos) << error.what();
  }
}

TEST(GlobalGeneratorGuard, UndoesDrawsFromTheGlobalGenerator) {
  torch::manual_seed(11);
  const at::Tensor expected = at::rand({8});
  torch::manual_seed(11);
  {
    GlobalGeneratorGuard guard;
    at::rand({1000});
  }
  EXPECT_TRUE(at::equal(at::rand({8}), expected));
}

}  // namespace
}  // namespace trainyard
