#pragma once
// Builds a strategy the way the engine does (model, optimizer and precision plugins from the
// bundled registry, step options), for tests of the step's mechanics without a dataset; ranks of
// a multi-rank strategy run as threads of the test process over gloo.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/runtime/recipe.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard::testing {

inline Config options_section(const std::string& name, const std::string& toml) {
  return Config(parse_toml(toml, name), name);
}

struct HarnessOptions {
  std::string strategy = "single";
  std::string strategy_options;
  std::string model = "mlp";
  std::string model_options = "hidden = [16, 12]";
  std::string optimizer = "sgd";
  std::string optimizer_options = "lr = 0.1";
  std::string precision = "fp32";
  std::string precision_options;
  StepOptions step;
  std::vector<std::int64_t> input_shape = {6};
  std::int64_t classes = 4;
  // A language model's vocabulary (input_shape then holds the sequence length); 0: none.
  std::int64_t vocab_size = 0;
  std::uint64_t seed = 5;
  // Builds the model instead of the `model` plugin when set (a model made for one test).
  std::function<std::shared_ptr<Model>(const BuildContext&)> model_factory;
  // Several ranks: this one's place and the loopback port of rank 0's store.
  int rank = 0;
  int world_size = 1;
  int port = 0;
  // The device mesh the ranks form ([parallel]); unset: a data-parallel mesh over all of them,
  // as a strategy builds from the communicator alone.
  std::optional<MeshRequest> mesh;
  // The gate the strategy passes before each optimizer step, as the engine's (none when null).
  OptimizerStepGate* optimizer_step_gate = nullptr;
  // A gradient-compression plugin ([compression]) and its options; empty: none.
  std::string compression;
  std::string compression_options;

  // This options object for rank `rank_of_world` of `ranks` meeting at `store_port`.
  HarnessOptions& as_rank(int rank_of_world, int ranks, int store_port) {
    rank = rank_of_world;
    world_size = ranks;
    port = store_port;
    return *this;
  }
};

// A strategy set up on the CPU; parameters drawn from `seed`, so two harnesses with the same
// options start from the same parameters.
struct StepHarness {
  explicit StepHarness(const HarnessOptions& options) {
    Registry& registry = bundled_registry();
    BuildContext build;
    build.seed = options.seed;
    build.rank = options.rank;
    build.world_size = options.world_size;
    build.data.input_shape = options.input_shape;
    build.data.num_classes = options.classes;
    if (options.vocab_size > 0) {
      build.data.vocab_size = options.vocab_size;
      build.data.sequence_length = options.input_shape.at(0);
    }
    precision = registry.create<Precision>(
        options.precision, options_section("precision", options.precision_options), build);
    if (const auto compute = precision->autocast_dtype()) {
      build.extensions[kComputeDtypeExtension] = *compute;
    }
    context.optimizer = registry.create<Optimizer>(
        options.optimizer, options_section("optimizer", options.optimizer_options), build);
    context.precision = precision;
    context.device_backend =
        registry.create<DeviceBackend>("cpu", options_section("device", ""), build);
    context.step = options.step;
    context.optimizer_step_gate = options.optimizer_step_gate;
    if (!options.compression.empty()) {
      context.compression = registry.create<GradientCompression>(
          options.compression, options_section("compression", options.compression_options),
          build);
    }
    if (options.world_size > 1) {
      context.communicator =
          registry.create<Communicator>("gloo", options_section("comm", ""), build);
      Rendezvous meet;
      meet.rank = options.rank;
      meet.world_size = options.world_size;
      meet.local_rank = options.rank;
      meet.local_world_size = options.world_size;
      meet.master_port = options.port;
      meet.timeout = std::chrono::seconds(120);
      context.communicator->connect(meet, c10::Device(c10::kCPU));
      build.communicator = context.communicator;
      // Built collectively, as the engine builds the run's mesh before any strategy.
      if (options.mesh) {
        build.mesh = std::make_shared<ProcessMesh>(
            MeshLayout::resolve(*options.mesh, options.world_size), *context.communicator);
      }
    }
    context.build = build;
    const Config model_section = options_section("model", options.model_options);
    const std::string model = options.model;
    // The bundled models draw each parameter from its own stream, but a test's own model
    // (model_factory) draws from the global generator, and the bundled ones save and restore
    // it: ranks running as threads build one model at a time, each right after seeding it, so
    // every run starts from the same parameters and random streams whatever the threads'
    // interleaving.
    const auto seed = static_cast<std::uint64_t>(options.seed);
    context.make_model = [model, model_section, seed, factory = options.model_factory,
                          built = built_model_](const BuildContext& context) {
      static std::mutex drawing;
      std::lock_guard<std::mutex> lock(drawing);
      at::manual_seed(seed);
      *built = factory ? factory(context)
                       : bundled_registry().create<Model>(model, model_section, context);
      return *built;
    };
    strategy = registry.create<Strategy>(
        options.strategy, options_section("strategy", options.strategy_options), build);
    strategy->setup(context);
  }

  TensorMap parameters() const {
    TensorMap out;
    for (const auto& [name, tensor] : strategy->full_parameters()) out[name] = tensor.clone();
    return out;
  }

  // The gradients the strategy's model holds: after a train_step, what the optimizer stepped
  // on (a data-parallel strategy's averaged gradients).
  TensorMap gradients() const {
    TensorMap out;
    for (const auto& item : (*built_model_)->module().named_parameters(true)) {
      if (item.value().grad().defined()) out[item.key()] = item.value().grad().clone();
    }
    return out;
  }

  StrategyContext context;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<Strategy> strategy;

 private:
  std::shared_ptr<std::shared_ptr<Model>> built_model_ = std::make_shared<std::shared_ptr<Model>>();
};

// Runs `rank_body(rank, port)` for `world_size` ranks, each on its own thread, with a free
// loopback port for their rendezvous; the results in rank order.
template <class Result>
std::vector<Result> run_threaded_ranks(int world_size,
                                       const std::function<Result(int rank, int port)>& rank_body) {
  const int port = free_loopback_port();
  std::vector<std::future<Result>> ranks;
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(
        std::async(std::launch::async, [r, port, &rank_body] { return rank_body(r, port); }));
  }
  std::vector<Result> out;
  for (auto& rank : ranks) out.push_back(rank.get());
  return out;
}

// Runs `body` on the ranks of `request` as threads, each given `base` with the mesh they form
// (and its gloo communicator, with `comm_options`); the results in rank order.
template <class Result>
std::vector<Result> on_mesh_ranks(const MeshRequest& request, int world_size,
                                  const BuildContext& base,
                                  const std::function<Result(const BuildContext&)>& body,
                                  const std::string& comm_options = "") {
  return run_threaded_ranks<Result>(world_size, [&](int rank, int port) {
    BuildContext context = base;
    context.rank = rank;
    context.world_size = world_size;
    auto communicator = bundled_registry().create<Communicator>(
        "gloo", options_section("comm", comm_options), context);
    Rendezvous meet;
    meet.rank = rank;
    meet.world_size = world_size;
    meet.local_rank = rank;
    meet.local_world_size = world_size;
    meet.master_port = port;
    meet.timeout = std::chrono::seconds(120);
    communicator->connect(meet, c10::Device(c10::kCPU));
    context.communicator = communicator;
    context.mesh =
        std::make_shared<ProcessMesh>(MeshLayout::resolve(request, world_size), *communicator);
    Result result = body(context);
    communicator->barrier();
    return result;
  });
}

// on_mesh_ranks over a tp group of `tp` ranks.
template <class Result>
std::vector<Result> on_tp_ranks(int tp, const BuildContext& base,
                                const std::function<Result(const BuildContext&)>& body) {
  return on_mesh_ranks<Result>(MeshRequest{.pp = 1, .dp_replicate = 1, .dp_shard = 1, .tp = tp},
                               tp, base, body);
}

// on_mesh_ranks over a data-parallel group of `ranks` ranks.
template <class Result>
std::vector<Result> on_data_parallel_ranks(int ranks, const BuildContext& base,
                                           const std::function<Result(const BuildContext&)>& body,
                                           const std::string& comm_options = "") {
  return on_mesh_ranks<Result>(MeshRequest{.pp = 1, .dp_replicate = 1, .dp_shard = ranks, .tp = 1},
                               ranks, base, body, comm_options);
}

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
inline ::testing::AssertionResult all_close_fp32(const TensorMap& actual,
                                                 const TensorMap& expected) {
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
