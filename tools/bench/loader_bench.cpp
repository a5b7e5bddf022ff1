// Loader throughput: samples per second through trainyard's Loader over Fashion-MNIST's training
// split (read by the fashion_mnist plugin, normalized once into memory, as the Python side holds
// it), shuffled batches with the given batch size and worker count, two ways:
//   batched     get_batch: one index_select per tensor and batch, what in-memory plugins do;
//   per_sample  get(i) per sample and collate(), the shape of a Python per-item Dataset.
//
//   build/bin/loader_bench [workers=1] [batch_size=64] [epochs=3] [samples=all]
// (`samples`: the first N samples of the split only, for a short run)
// prints "<way> <samples/s>" per line (the best epoch of each). tools/bench/loader_bench.py does
// the same with PyTorch's DataLoader; tools/bench/run prints both side by side.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trainyard/api/config.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "build_paths.hpp"

namespace {

using namespace trainyard;

// The split's tensors in memory. Without `batched` only get() is defined, and the loader's
// default get_batch collates sample by sample.
class InMemory final : public MapSource {
 public:
  InMemory(TensorMap tensors, bool batched) : tensors_(std::move(tensors)), batched_(batched) {}
  std::int64_t size() const override { return tensors_.begin()->second.size(0); }
  TensorMap get(std::int64_t index) const override {
    TensorMap sample;
    for (const auto& [name, tensor] : tensors_) sample.emplace(name, tensor[index]);
    return sample;
  }
  Batch get_batch(std::span<const std::int64_t> indices) const override {
    if (!batched_) return MapSource::get_batch(indices);
    at::Tensor index = at::from_blob(const_cast<std::int64_t*>(indices.data()),
                                     {static_cast<std::int64_t>(indices.size())}, at::kLong);
    Batch batch;
    batch.size = static_cast<std::int64_t>(indices.size());
    for (const auto& [name, tensor] : tensors_) batch.tensors.emplace(name, tensor.index_select(0, index));
    return batch;
  }

 private:
  TensorMap tensors_;
  bool batched_;
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
  const std::int64_t samples = argc > 4 ? std::stoll(argv[4]) : -1;
  if (workers < 0 || batch_size < 1 || epochs < 1 || (argc > 4 && samples < batch_size)) {
    std::fprintf(stderr,
                 "loader_bench: workers must be >= 0, batch_size and epochs >= 1, samples >= "
                 "batch_size\n");
    return 2;
  }
  // Like the Python side: one intra-op thread, the cores are the workers'.
  at::set_num_threads(1);

  auto* registry = new Registry();  // plugins stay loaded for the whole process
  PluginLoader(*registry).load_folder(build_paths::plugin_dir());
  BuildContext context;
  auto dataset = registry->create<Dataset>(
      "fashion_mnist", Config(std::make_shared<Table>(), "dataset"), context);
  auto split = dataset->map_split("train");
  const std::int64_t size = samples > 0 ? std::min(samples, split->size()) : split->size();
  std::vector<std::int64_t> all(static_cast<std::size_t>(size));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  TensorMap tensors = split->get_batch(all).tensors;

  LoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = true;
  options.drop_last = true;
  options.workers = workers;
  options.prefetch = 2;
  std::printf("batched %.1f\n",
              best_samples_per_s(std::make_shared<InMemory>(tensors, true), options, epochs));
  std::printf("per_sample %.1f\n",
              best_samples_per_s(std::make_shared<InMemory>(tensors, false), options, epochs));
  return 0;
}
