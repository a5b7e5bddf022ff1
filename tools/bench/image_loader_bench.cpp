// Image loader throughput: samples per second through trainyard's Loader over a folder of JPEG
// files (data/fashion-mnist-jpeg224 by default: 2,000 RGB images of 224x224), each decoded
// (TurboJPEG), random-resized-cropped to 224x224, flipped at random and normalized in the
// loader's workers: the image_folder plugin with the transforms a user writes in a recipe.
//
//   build/bin/image_loader_bench FOLDER [workers=1] [batch_size=64] [epochs=3]
// prints "trainyard <samples/s>" (the best epoch after a warm-up one) and one line per loader
// thread of where its time went. tools/bench/image_loader_bench.py does the same with PyTorch's
// DataLoader and torchvision's transforms; tools/bench/run image sets them side by side.

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "build_paths.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace {

using namespace trainyard;

// The dataset section a recipe would hold: ImageNet's normalization, torchvision's defaults.
std::shared_ptr<const Table> dataset_section(const std::string& folder) {
  const std::string text = "[dataset]\ntrain = \"" + folder +
                           "\"\n[dataset.transforms]\n"
                           "random_resized_crop = [224, 224]\n"
                           "horizontal_flip = 0.5\n"
                           "mean = [0.485, 0.456, 0.406]\n"
                           "std = [0.229, 0.224, 0.225]\n";
  return parse_toml(text, "image_loader_bench")->at("dataset").table_ptr();
}

double best_samples_per_s(Loader& loader, int epochs) {
  double best = 0;
  // Epoch 0 warms up (threads, allocator, the page cache); the best of the rest is reported.
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
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: image_loader_bench FOLDER [workers=1] [batch_size=64] [epochs=3]\n");
    return 2;
  }
  const std::string folder = argv[1];
  const int workers = argc > 2 ? std::stoi(argv[2]) : 1;
  const std::int64_t batch_size = argc > 3 ? std::stoll(argv[3]) : 64;
  const int epochs = argc > 4 ? std::stoi(argv[4]) : 3;
  // Like the Python side: one intra-op thread, the cores are the workers'.
  at::set_num_threads(1);
  try {
    auto* registry = new Registry();  // plugins stay loaded for the whole process
    PluginLoader(*registry).load_folder(build_paths::plugin_dir());
    auto dataset = registry->create<Dataset>(
        "image_folder", Config(dataset_section(folder), "dataset"), BuildContext{});
    LoaderOptions options;
    options.batch_size = batch_size;
    options.workers = workers;
    Loader loader(dataset->map_source("train"), options);
    std::printf("trainyard %.1f\n", best_samples_per_s(loader, epochs));
    for (const auto& line : describe_worker_times(loader.worker_times())) {
      std::printf("# %s\n", line.c_str());
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "image_loader_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
