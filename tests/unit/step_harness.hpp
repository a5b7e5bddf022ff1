#pragma once
// Builds a strategy the way the engine does (model, optimizer and precision plugins from the
// bundled registry, step options), for tests of the step's mechanics without a dataset.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <memory>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/device.hpp"
#include "trainyard/model.hpp"
#include "trainyard/optimizer.hpp"
#include "trainyard/precision.hpp"
#include "trainyard/recipe.hpp"
#include "trainyard/strategy.hpp"

namespace trainyard::testing {

// Every bundled plugin, loaded once and kept for the whole process.
inline Registry& bundled_registry() {
  static Registry* registry = [] {
    auto* instance = new Registry();
    load_bundled_plugins(*instance);
    return instance;
  }();
  return *registry;
}

inline Config options_section(const std::string& name, const std::string& toml) {
  return Config(parse_toml(toml, name), name);
}

struct HarnessOptions {
  std::string strategy = "single";
  std::string model = "mlp";
  std::string model_options = "hidden = [16, 12]";
  std::string optimizer = "sgd";
  std::string optimizer_options = "lr = 0.1";
  std::string precision = "fp32";
  std::string precision_options;
  StepOptions step;
  std::vector<std::int64_t> input_shape = {6};
  std::int64_t classes = 4;
  std::uint64_t seed = 5;
};

// A strategy set up on the CPU; parameters drawn from `seed`, so two harnesses with the same
// options start from the same parameters.
struct StepHarness {
  explicit StepHarness(const HarnessOptions& options) {
    Registry& registry = bundled_registry();
    BuildContext build;
    build.seed = options.seed;
    build.data.input_shape = options.input_shape;
    build.data.num_classes = options.classes;
    precision = registry.create<Precision>(
        options.precision, options_section("precision", options.precision_options), build);
    context.optimizer = registry.create<Optimizer>(
        options.optimizer, options_section("optimizer", options.optimizer_options), build);
    context.precision = precision;
    context.device_backend =
        registry.create<DeviceBackend>("cpu", options_section("device", ""), build);
    context.build = build;
    context.step = options.step;
    const Config model_section = options_section("model", options.model_options);
    const std::string model = options.model;
    context.make_model = [model, model_section](const BuildContext& context) {
      return bundled_registry().create<Model>(model, model_section, context);
    };
    strategy = registry.create<Strategy>(options.strategy, options_section("strategy", ""), build);
    at::manual_seed(static_cast<std::uint64_t>(options.seed));
    strategy->setup(context);
  }

  TensorMap parameters() const {
    TensorMap out;
    for (const auto& [name, tensor] : strategy->full_parameters()) out[name] = tensor.clone();
    return out;
  }

  StrategyContext context;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<Strategy> strategy;
};

// A batch of `size` random samples of `shape` with targets below `classes`.
inline Batch random_batch(std::int64_t size, const std::vector<std::int64_t>& shape,
                          std::int64_t classes, std::uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  std::vector<std::int64_t> sizes = {size};
  sizes.insert(sizes.end(), shape.begin(), shape.end());
  Batch batch;
  batch.size = size;
  batch.tensors["input"] = at::randn(sizes, generator);
  batch.tensors["target"] = at::randint(classes, {size}, generator, at::kLong);
  return batch;
}

// `batch` cut into `parts` consecutive micro-batches of equal size.
inline std::vector<Batch> split_batch(const Batch& batch, std::int64_t parts) {
  std::vector<Batch> out;
  const std::int64_t size = batch.size / parts;
  for (std::int64_t i = 0; i < parts; ++i) {
    Batch micro;
    micro.size = size;
    for (const auto& [name, tensor] : batch.tensors) {
      micro.tensors[name] = tensor.narrow(0, i * size, size).contiguous();
    }
    out.push_back(micro);
  }
  return out;
}

// Largest |a - b| over every entry of two maps with the same keys.
inline double max_difference(const TensorMap& a, const TensorMap& b) {
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    worst = std::max(worst, (tensor - b.at(name)).abs().max().item<double>());
  }
  return worst;
}

// PyTorch's float32 comparison (torch.testing: rtol 1.3e-6, atol 1e-5) over every entry.
inline ::testing::AssertionResult all_close_fp32(const TensorMap& actual, const TensorMap& expected) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "different keys";
  for (const auto& [name, tensor] : actual) {
    auto it = expected.find(name);
    if (it == expected.end()) return ::testing::AssertionFailure() << "missing " << name;
    if (!at::allclose(tensor, it->second, 1.3e-6, 1e-5)) {
      return ::testing::AssertionFailure()
             << name << " differs by " << (tensor - it->second).abs().max().item<double>();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace trainyard::testing
