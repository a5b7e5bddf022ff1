// Checkpoint cost, side by side in one run on the same disk:
// - save throughput of the checkpoint store (each backend: staging folder, fsync of every file,
//   manifest with checksums, rename) against plain sequential writes of the same bytes to one
//   file followed by one fsync;
// - the step stall of a synchronous save against an asynchronous one (the time until
//   save/save_async returns to the training loop).
// Usage: checkpoint_bench [MEGABYTES=256] [FOLDER=/tmp] [REPETITIONS=3]

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "trainyard/build_context.hpp"
#include "trainyard/checkpoint.hpp"
#include "trainyard/checkpoint_store.hpp"
#include "trainyard/files.hpp"
#include "trainyard/plugin_loader.hpp"
#include "trainyard/registry.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace trainyard;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The baseline: the same bytes, one file, sequential write() calls, one fsync.
double plain_write_seconds(const CheckpointState& state, const fs::path& file) {
  const auto start = Clock::now();
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + file.string());
  for (const auto* dict : {&state.shared, &state.local}) {
    for (const auto& [name, tensor] : dict->tensors) {
      const char* data = static_cast<const char*>(tensor.const_data_ptr());
      std::size_t left = tensor.nbytes();
      while (left > 0) {
        ssize_t wrote = ::write(fd, data, left);
        if (wrote <= 0) throw std::runtime_error("write failed");
        data += wrote;
        left -= static_cast<std::size_t>(wrote);
      }
    }
  }
  ::fsync(fd);
  ::close(fd);
  const double seconds = seconds_since(start);
  fs::remove(file);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t megabytes = argc > 1 ? std::stoll(argv[1]) : 256;
  const fs::path root = fs::path(argc > 2 ? argv[2] : "/tmp") / "trainyard-checkpoint-bench";
  const int repetitions = argc > 3 ? std::stoi(argv[3]) : 3;
  remove_tree(root);
  fs::create_directories(root);

  // A model-sized state: 4 MiB tensors, like the weights and moments of a large layer stack.
  CheckpointState state;
  const std::int64_t per_tensor = 1 << 20;  // floats
  const std::int64_t count = std::max<std::int64_t>(1, megabytes / 4);
  for (std::int64_t i = 0; i < count; ++i) {
    state.shared.tensors["model.layer" + std::to_string(i) + ".weight"] = at::randn({per_tensor});
  }
  state.local.tensors["rng"] = at::randint(0, 255, {5056}, at::kByte);
  const double bytes = static_cast<double>(count * per_tensor * 4);

  Registry registry;
  PluginLoader loader(registry);
  loader.load_folder(TRAINYARD_PLUGIN_DIR);

  std::printf("checkpoint of %.0f MiB in %lld tensors, %d repetitions (medians), folder %s\n",
              bytes / (1 << 20), static_cast<long long>(count), repetitions, root.c_str());
  std::printf("%-12s %12s %12s %10s %14s %14s %12s %12s\n", "backend", "store MB/s",
              "plain MB/s", "ratio", "sync stall s", "async stall s", "stall ratio", "copy s");
  for (const std::string name : {"torch", "safetensors"}) {
    auto backend = registry.create<CheckpointBackend>(name, Config({}, "checkpoint"), BuildContext{});
    CheckpointStore store(backend, name, root / name, 1);
    std::vector<double> plain, sync, async_stall, snapshot;
    for (int r = 0; r < repetitions; ++r) {
      plain.push_back(plain_write_seconds(state, root / "plain.bin"));
      auto start = Clock::now();
      store.save(2 * r, state);
      sync.push_back(seconds_since(start));
      start = Clock::now();
      store.save_async(2 * r + 1, state);
      async_stall.push_back(seconds_since(start));
      store.commit_pending();
      start = Clock::now();
      CheckpointState copy = snapshot_to_host(state);
      snapshot.push_back(seconds_since(start));
    }
    const double store_rate = bytes / median(sync) / 1e6;
    const double plain_rate = bytes / median(plain) / 1e6;
    std::printf("%-12s %12.1f %12.1f %10.3f %14.3f %14.3f %12.3f %12.3f\n", name.c_str(),
                store_rate, plain_rate, store_rate / plain_rate, median(sync), median(async_stall),
                median(async_stall) / median(sync), median(snapshot));
  }
  remove_tree(root);
  return 0;
}
