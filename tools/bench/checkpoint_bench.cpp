// Checkpoint cost, side by side in one run on the same file system:
// - save throughput of the checkpoint store (each backend: staging folder, every file written and
//   fsynced, manifest with checksums, fsynced, rename, folder fsynced) against a plain write of
//   the same bytes into one file followed by one fsync. Both are durable when they end, so the
//   ratio is what the checkpoint format and protocol cost over the disk itself;
// - the step stall of an asynchronous save (the time until save_async returns to the training
//   loop) against a synchronous save.
// Each repetition runs the plain write, then each backend's saves, so drift on a shared machine
// spreads over all of them; the table shows medians. With --check the run exits 1 unless
// store/plain >= 0.8 (safetensors) and >= 0.6 (torch), and async stall/sync save <= 0.1.
// Usage: checkpoint_bench [MEGABYTES=256] [FOLDER=/tmp] [REPETITIONS=3] [--check]

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

// The baseline: the same bytes, one new file, one write() per tensor, one fsync.
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

struct BackendFigures {
  std::string name;
  double store_floor;  // the least store/plain accepted by --check
  std::vector<double> plain, sync, async_stall;
};

// The least an asynchronous save can stall: one copy of the state into buffers already touched.
double snapshot_seconds(const CheckpointState& state, CheckpointState& buffers) {
  const auto start = Clock::now();
  buffers = snapshot_to_host(state, &buffers);
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool check = std::erase(args, "--check") > 0;
  const std::int64_t megabytes = args.size() > 0 ? std::stoll(args[0]) : 256;
  const fs::path root = fs::path(args.size() > 1 ? args[1] : "/tmp") / "trainyard-checkpoint-bench";
  const int repetitions = args.size() > 2 ? std::stoi(args[2]) : 3;
  if (megabytes < 4 || repetitions < 1) {
    std::fprintf(stderr, "checkpoint_bench: MEGABYTES must be >= 4 and REPETITIONS >= 1\n");
    return 2;
  }
  remove_tree(root);
  fs::create_directories(root);

  // A model-sized state: 4 MiB tensors, like the weights and moments of a large layer stack.
  CheckpointState state;
  const std::int64_t per_tensor = 1 << 20;  // floats
  const std::int64_t count = megabytes / 4;
  for (std::int64_t i = 0; i < count; ++i) {
    state.shared.tensors["model.layer" + std::to_string(i) + ".weight"] = at::randn({per_tensor});
  }
  state.local.tensors["rng"] = at::randint(0, 255, {5056}, at::kByte);
  const double bytes = static_cast<double>(count * per_tensor * 4);

  Registry registry;
  PluginLoader loader(registry);
  loader.load_folder(TRAINYARD_PLUGIN_DIR);

  std::vector<BackendFigures> backends = {{"torch", 0.6, {}, {}, {}},
                                          {"safetensors", 0.8, {}, {}, {}}};
  std::vector<CheckpointStore> stores;
  for (const auto& figures : backends) {
    auto backend =
        registry.create<CheckpointBackend>(figures.name, Config({}, "checkpoint"), BuildContext{});
    // keep = 0: the bench deletes older checkpoints itself, between saves, as it deletes the
    // plain file after timing it; deleting is not writing.
    stores.emplace_back(backend, figures.name, root / figures.name, 0);
  }
  CheckpointState buffers = snapshot_to_host(state);
  std::vector<double> snapshot;
  for (int r = 0; r < repetitions; ++r) {
    snapshot.push_back(snapshot_seconds(state, buffers));
    for (std::size_t b = 0; b < backends.size(); ++b) {
      BackendFigures& figures = backends[b];
      figures.plain.push_back(plain_write_seconds(state, root / "plain.bin"));
      auto start = Clock::now();
      stores[b].save(2 * r, state);
      figures.sync.push_back(seconds_since(start));
      start = Clock::now();
      stores[b].save_async(2 * r + 1, state);
      figures.async_stall.push_back(seconds_since(start));
      stores[b].commit_pending();
      for (const auto& checkpoint : stores[b].list()) remove_tree(checkpoint);
    }
  }

  std::printf("checkpoint of %.0f MiB in %lld tensors of 4 MiB, %d repetitions (medians), in %s\n",
              bytes / (1 << 20), static_cast<long long>(count), repetitions, root.c_str());
  std::printf("fsync included in both: plain = write() of the same bytes into one new file, then "
              "fsync;\n  store = the checkpoint store's save (files written and fsynced, "
              "manifest, rename, folder fsynced);\n  deleting files (the plain one, older "
              "checkpoints) is timed in neither\n");
  std::printf("%-12s %11s %11s %11s %12s %14s %11s\n", "backend", "plain MB/s", "store MB/s",
              "store/plain", "sync save s", "async stall s", "stall/sync");
  bool met = true;
  for (const auto& figures : backends) {
    const double plain_rate = bytes / median(figures.plain) / 1e6;
    const double store_rate = bytes / median(figures.sync) / 1e6;
    const double store_ratio = store_rate / plain_rate;
    const double stall_ratio = median(figures.async_stall) / median(figures.sync);
    std::printf("%-12s %11.1f %11.1f %11.3f %12.3f %14.4f %11.3f\n", figures.name.c_str(),
                plain_rate, store_rate, store_ratio, median(figures.sync),
                median(figures.async_stall), stall_ratio);
    met = met && store_ratio >= figures.store_floor && stall_ratio <= 0.1;
  }
  std::printf("one copy of the state into reused buffers (the floor of an async stall): %.4f s\n",
              median(snapshot));
  std::printf("targets: store/plain >= 0.6 (torch), >= 0.8 (safetensors); stall/sync <= 0.1: %s\n",
              met ? "met" : "missed");
  stores.clear();
  remove_tree(root);
  return check && !met ? 1 : 0;
}
