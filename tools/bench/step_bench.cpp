// Step time of the cnn and mlp recipes through trainyard (engine + strategy + plugins) against a
// bare hand-written LibTorch loop over the same architecture, optimizer and batches.
//
//   build/bin/step_bench --benchmark_repetitions=5
// tools/bench/run adds Python PyTorch from the same venv and prints the ratios. With --smoke each
// benchmark takes 3 timed steps, a check that every one still runs (the test suite's run).

#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/runtime/engine.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"
#include "build_paths.hpp"

namespace {

using namespace trainyard;
constexpr int kBatches = 16;

// The recipe as the benchmark runs it: no evaluation, no sinks, no checkpoints, so only steps
// are timed.
std::unique_ptr<Engine> make_engine(Registry& registry, const std::string& recipe_name) {
  static bool loaded = false;
  if (!loaded) {
    PluginLoader(registry).load_folder(build_paths::plugin_dir());
    loaded = true;
  }
  Recipe recipe = load_recipe(std::string(build_paths::source_dir()) + "/recipes/" + recipe_name,
                              {"run.eval=false", "sinks.console.enabled=false",
                               "sinks.jsonl.enabled=false", "loader.workers=0"});
  auto root = std::make_shared<Table>(*recipe.root);
  root->erase("checkpoint");
  recipe.root = root;
  return std::make_unique<Engine>(resolve_recipe(recipe, registry), registry);
}

// The first kBatches batches, each trained on as it is taken (every step the engine begins ends
// before the next): they warm the caches and allocator up, and the timed steps reuse them.
std::vector<Batch> take_batches(Engine& engine) {
  std::vector<Batch> batches;
  for (int i = 0; i < kBatches; ++i) {
    std::vector<Batch> micro = engine.next_micro_batches();
    engine.train_one_step(micro);
    batches.push_back(micro.front());
  }
  return batches;
}

Registry& registry() {
  static auto* instance = new Registry();  // plugins stay loaded for the whole process
  return *instance;
}

void run_trainyard(benchmark::State& state, const std::string& recipe) {
  auto engine = make_engine(registry(), recipe);
  auto batches = take_batches(*engine);
  std::size_t i = 0;
  for (auto _ : state) {
    StepResult result = engine->train_one_step(std::span<const Batch>(&batches[i++ % kBatches], 1));
    benchmark::DoNotOptimize(result.loss);
  }
  state.SetItemsProcessed(state.iterations() * batches.front().size);
}

torch::nn::Sequential bare_cnn() {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(1, 32, 3).padding(1).bias(false)), BatchNorm2d(32), ReLU(),
                    MaxPool2d(2), Conv2d(Conv2dOptions(32, 64, 3).padding(1).bias(false)),
                    BatchNorm2d(64), ReLU(), MaxPool2d(2), Flatten(), Linear(64 * 7 * 7, 128),
                    ReLU(), Linear(128, 10));
}

torch::nn::Sequential bare_mlp() {
  using namespace torch::nn;
  return Sequential(Flatten(), Linear(784, 256), ReLU(), Linear(256, 128), ReLU(), Linear(128, 10));
}

// The loop a LibTorch user writes by hand: same batches, same optimizer settings.
void run_bare(benchmark::State& state, const std::string& recipe, torch::nn::Sequential model) {
  std::vector<Batch> batches;
  {
    auto engine = make_engine(registry(), recipe);
    batches = take_batches(*engine);
  }
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(1e-3).weight_decay(1e-4));
  model->train();
  std::size_t i = 0;
  for (auto _ : state) {
    const Batch& batch = batches[i++ % kBatches];
    optimizer.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(batch.at("input")),
                                                              batch.at("target"));
    loss.backward();
    optimizer.step();
    benchmark::DoNotOptimize(loss);
  }
  state.SetItemsProcessed(state.iterations() * batches.front().size);
}

void BM_Trainyard_Cnn(benchmark::State& state) { run_trainyard(state, "fashion_mnist_cnn.toml"); }
void BM_BareLibTorch_Cnn(benchmark::State& state) {
  run_bare(state, "fashion_mnist_cnn.toml", bare_cnn());
}
void BM_Trainyard_Mlp(benchmark::State& state) { run_trainyard(state, "fashion_mnist_mlp.toml"); }
void BM_BareLibTorch_Mlp(benchmark::State& state) {
  run_bare(state, "fashion_mnist_mlp.toml", bare_mlp());
}

struct BenchmarkCase {
  const char* name;
  void (*run)(benchmark::State&);
  double min_seconds;
};

constexpr BenchmarkCase kCases[] = {
    {"BM_Trainyard_Cnn", BM_Trainyard_Cnn, 3.0},
    {"BM_BareLibTorch_Cnn", BM_BareLibTorch_Cnn, 3.0},
    {"BM_Trainyard_Mlp", BM_Trainyard_Mlp, 2.0},
    {"BM_BareLibTorch_Mlp", BM_BareLibTorch_Mlp, 2.0},
};

}  // namespace

int main(int argc, char** argv) {
  bool smoke = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--smoke") {
      smoke = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  for (const BenchmarkCase& bench : kCases) {
    auto* registered = benchmark::RegisterBenchmark(bench.name, bench.run);
    registered->Unit(benchmark::kMillisecond);
    if (smoke) {
      registered->Iterations(3);
    } else {
      registered->MinTime(bench.min_seconds);
    }
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
