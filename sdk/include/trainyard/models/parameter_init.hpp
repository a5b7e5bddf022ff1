#pragma once
// Deterministic per-parameter initialization: every parameter draws from its own random stream,
// seeded by the run's seed and the parameter's full name in the whole model, so its initial
// values do not depend on what else was built or in which order. A pipeline stage or a
// tensor-parallel shard built alone then holds what the same parameters of the whole model hold.

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace trainyard {

// The seed of a parameter's stream: 64-bit FNV-1a over the run seed's eight bytes
// (little-endian) and then the name, folded to the 32 bits LibTorch's CPU generator (mt19937)
// takes from its seed. Stable across processes, builds and platforms, unlike std::hash.
std::uint64_t parameter_seed(std::uint64_t run_seed, std::string_view name);

// Fills tensors from the stream of the name they are given. Values are drawn in float32 on the
// CPU from a generator of their own and copied into the tensor wherever it lives, so a build on
// the host and one on an accelerator hold the same values; the process's global generator is never drawn from.
class ParameterInit {
 public:
  explicit ParameterInit(std::uint64_t run_seed) : run_seed_(run_seed) {}

  std::uint64_t run_seed() const { return run_seed_; }

  void normal(const torch::Tensor& tensor, std::string_view name, double mean, double std) const;
  void uniform(const torch::Tensor& tensor, std::string_view name, double low, double high) const;
  // torch.nn.init.kaiming_uniform_ in fan_in mode for leaky_relu with negative slope `a`:
  // U(-b, b) with b = sqrt(6 / ((1 + a^2) fan_in)).
  void kaiming_uniform(const torch::Tensor& tensor, std::string_view name, double a) const;
  // Draws nothing; here so that a model initialises every parameter through one object.
  void fill(const torch::Tensor& tensor, double value) const;

  // Gives every parameter and buffer of `module`, whose name in the whole model is `prefix`,
  // LibTorch's default initialization for its module type, each parameter from its own stream:
  // Linear, Conv and ConvTranspose 1-3d (kaiming_uniform_ with a = sqrt(5) for the weight,
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias), Embedding (N(0, 1), the padding row zero),
  // LayerNorm, GroupNorm and BatchNorm 1-3d (ones and zeros, fresh running statistics). A module
  // of another type holding parameters is an Error: none may keep values drawn from the
  // global generator.
  void initialize_defaults(torch::nn::Module& module, const std::string& prefix) const;

 private:
  std::uint64_t run_seed_;
};

// Puts the process's CPU generator back as it was when the guard ends. torch::nn modules draw
// their default initialization from it as they are constructed; a model that initialises its
// parameters per name builds its modules under this guard, so building the whole model or any
// stage leaves the run's other draws (dropout) where they were. Not for use while other threads
// draw from the global generator.
class GlobalGeneratorGuard {
 public:
  GlobalGeneratorGuard();
  ~GlobalGeneratorGuard();
  GlobalGeneratorGuard(const GlobalGeneratorGuard&) = delete;
  GlobalGeneratorGuard& operator=(const GlobalGeneratorGuard&) = delete;

 private:
  torch::Tensor saved_state_;
};

}  // namespace trainyard
