// Loader throughput: samples per second through trainyard's Loader over Fashion-MNIST's training
// split, shuffled batches with the given batch size and worker count, two ways:
//   batched     the dataset's get_batch (one index_select per batch), what the engine uses;
//   per_sample  get(i) per sample and collate(), the shape of a Python per-item Dataset.
//
//   build/bin/loader_bench [workers=1] [batch_size=64] [epochs=3]
// prints "<way> <samples/s>" per line (the best epoch of each). tools/bench/loader_bench.py does
// the same with PyTorch's DataLoader; tools/bench/run prints both side by side.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "trainyard/config.hpp"
#include "trainyard/dataset.hpp"
#include "trainyard/loader.hpp"
#include "trainyard/plugin_loader.hpp"
#include "trainyard/registry.hpp"

namespace {

using namespace trainyard;

// The same split, but only through get(): the loader's default get_batch collates sample by
// sample.
class PerSample final : public MapSource {
 public:
  explicit PerSample(std::shared_ptr<const MapSource> inner) : inner_(std::move(inner)) {}
  std::int64_t size() const override { return inner_->size(); }
  TensorMap get(std::int64_t index) const override { return inner_->get(index); }

 private:
  std::shared_ptr<const MapSource> inner_;
};

double best_samples_per_s(std::shared_ptr<const MapSource> source, const LoaderOptions& options,
                          int epochs) {
  Loader loader(std::move(source), options);
  double best = 0;
  // Epoch 0 warms up (threads, allocator); the best of the rest is reported.
  for (int epoch = 0; epoch <= epochs; ++epoch) {
    loader.start_epoch(epoch);
    const auto start = std::chrono::steady_clock::now();
    std::int64_t samples = 0;
    while (auto batch = loader.next()) samples += batch->size;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (epoch > 0) best = std::max(best, static_cast<double>(samples) / seconds);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int workers = argc > 1 ? std::stoi(argv[1]) : 1;
  const std::int64_t batch_size = argc > 2 ? std::stoll(argv[2]) : 64;
  const int epochs = argc > 3 ? std::stoi(argv[3]) : 3;
  // Like the Python side: one intra-op thread, the cores are the workers'.
  at::set_num_threads(1);

  auto* registry = new Registry();  // plugins stay loaded for the whole process
  PluginLoader(*registry).load_folder(TRAINYARD_PLUGIN_DIR);
  BuildContext context;
  auto dataset = registry->create<Dataset>(
      "fashion_mnist", Config(std::make_shared<Table>(), "dataset"), context);
  auto train = dataset->map_split("train");

  LoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = true;
  options.drop_last = true;
  options.workers = workers;
  options.prefetch = 2;
  std::printf("batched %.1f\n", best_samples_per_s(train, options, epochs));
  std::printf("per_sample %.1f\n",
              best_samples_per_s(std::make_shared<PerSample>(train), options, epochs));
  return 0;
}
