// Checkpoint cost, side by side in one run on the same file system:
// - save throughput of the checkpoint store (each backend: staging folder, every file written and
//   fsynced, manifest with checksums, fsynced, rename, folder fsynced) against a plain write of
//   the same bytes into one file followed by one fsync. Both are durable when they end, so the
//   ratio is what the checkpoint format and protocol cost over the disk itself;
// - the stall of a save in a training loop: the single strategy trains an MLP whose parameters
//   and AdamW moments make a checkpoint of the same size, and a window of steps is timed three
//   ways: without a save, after a synchronous save, and after an asynchronous one (its commit at
//   the window's end included). A save's stall is its window's time less the window without a
//   save, so an asynchronous save pays for everything it costs the loop: the copies made before
//   the next step, the wait at the optimizer step gate, the background write (from the live
//   parameters and moments) and checksum competing for the cores and memory, and a commit still
//   waiting for the disk. The window is long enough for a
//   synchronous save to end twice over.
// Each repetition runs the plain write, then each backend's save and its three windows (in an
// order that rotates), so drift on a shared machine spreads over all of them; stalls are the
// medians of each repetition's differences. With --check the run exits 1 unless
// store/plain >= 0.8 (safetensors) and >= 0.6 (torch), and async stall/sync stall <= 0.1.
// --threads N trains on N threads (default: LibTorch's, every core): with fewer threads than
// cores the save's background work has a core of its own, as when a GPU does the training. With
// every core training, the background checksum and write take their CPU time from the
// steps; the CPU seconds each save adds to its window are printed beside the stalls.
// Usage: checkpoint_bench [MEGABYTES=256] [FOLDER=/tmp] [REPETITIONS=3] [--threads N] [--check]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/api/build_context.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/support/files.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"
#include "trainyard/runtime/optimizer_step_gate.hpp"
#include "trainyard/runtime/optimizer_stepped_memory.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"
#include "trainyard/api/strategy.hpp"
#include "build_paths.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace trainyard;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU time of the whole process (every thread, user and system), for what a save costs the
// cores whatever thread spends it.
double process_cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// The wall-clock and process CPU seconds one piece of work took.
struct Spent {
  double wall = 0;
  double cpu = 0;
};

template <typename Work>
Spent spend(Work&& work) {
  const double cpu = process_cpu_seconds();
  const auto begin = Clock::now();
  work();
  return {seconds_since(begin), process_cpu_seconds() - cpu};
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

Config section(const std::string& name, const std::string& toml) {
  return Config(parse_toml(toml, name), name);
}

// The single strategy training an MLP (1024 inputs, two hidden layers of `width`, 10 classes)
// with AdamW on one batch of 32, drawn once: the loop whose stall a save is measured in.
class TrainingLoop {
 public:
  TrainingLoop(const Registry& registry, std::int64_t width) {
    BuildContext build;
    build.seed = 1;
    build.data.input_shape = {1024};
    build.data.num_classes = 10;
    StrategyContext context;
    context.precision = registry.create<Precision>("fp32", section("precision", ""), build);
    context.optimizer =
        registry.create<Optimizer>("adamw", section("optimizer", "lr = 0.0001"), build);
    context.device_backend = registry.create<DeviceBackend>("cpu", section("device", ""), build);
    context.build = build;
    context.optimizer_step_gate = &gate_;
    const Config model = section("model", "hidden = [" + std::to_string(width) + ", " +
                                              std::to_string(width) + "]");
    context.make_model = [&registry, model](const BuildContext& model_build) {
      return registry.create<Model>("mlp", model, model_build);
    };
    strategy_ = registry.create<Strategy>("single", section("strategy", ""), build);
    strategy_->setup(context);
    Batch batch;
    batch.size = 32;
    batch.tensors["input"] = at::randn({32, 1024});
    batch.tensors["target"] = at::randint(10, {32}, at::kLong);
    batch_.push_back(std::move(batch));
  }

  void step() { strategy_->train_step(batch_); }

  CheckpointState state() const {
    CheckpointState state;
    strategy_->save_state(state);
    return state;
  }

  void save_async(CheckpointStore& store, std::int64_t step) {
    store.save_async(step, state(), OptimizerSteppedMemory(strategy_->optimizer_stepped_tensors()),
                     &gate_);
  }

 private:
  OptimizerStepGate gate_;
  std::shared_ptr<Strategy> strategy_;
  std::vector<Batch> batch_;
};

// The width of two square-ish hidden layers whose parameters and two AdamW moments (12 bytes a
// parameter) come to about `megabytes` MiB.
std::int64_t width_for(std::int64_t megabytes) {
  const double parameters = static_cast<double>(megabytes) * (1 << 20) / 12.0;
  const double width = (-1034.0 + std::sqrt(1034.0 * 1034.0 + 4.0 * parameters)) / 2.0;
  return std::max<std::int64_t>(64, static_cast<std::int64_t>(width) / 64 * 64);
}

std::int64_t state_bytes(const CheckpointState& state) {
  std::int64_t bytes = 0;
  for (const auto* dict : {&state.shared, &state.local}) {
    for (const auto& [name, tensor] : dict->tensors) bytes += tensor.nbytes();
  }
  return bytes;
}

struct BackendFigures {
  std::string name;
  double store_floor;  // the least store/plain accepted by --check
  std::vector<double> plain, sync;
  std::vector<double> sync_stall, async_stall, async_call;
  std::vector<double> sync_cpu, async_cpu;  // the process's CPU seconds beyond the window's own
};

struct BenchOptions {
  bool check = false;
  int threads = 0;  // 0: LibTorch's default
  std::int64_t megabytes = 256;
  fs::path root;
  int repetitions = 3;
};

// nullopt: the arguments are wrong (the reason is printed; the bench exits 2).
std::optional<BenchOptions> parse_arguments(std::vector<std::string> args) {
  BenchOptions options;
  options.check = std::erase(args, "--check") > 0;
  if (auto flag = std::find(args.begin(), args.end(), "--threads"); flag != args.end()) {
    if (std::next(flag) == args.end() ||
        (options.threads = std::atoi(std::next(flag)->c_str())) < 1) {
      std::fprintf(stderr, "checkpoint_bench: --threads needs a count >= 1\n");
      return std::nullopt;
    }
    args.erase(flag, std::next(flag, 2));
    at::set_num_threads(options.threads);
  }
  options.megabytes = args.size() > 0 ? std::stoll(args[0]) : 256;
  options.root = fs::path(args.size() > 1 ? args[1] : "/tmp") / "trainyard-checkpoint-bench";
  options.repetitions = args.size() > 2 ? std::stoi(args[2]) : 3;
  if (options.megabytes < 4 || options.repetitions < 1) {
    std::fprintf(stderr, "checkpoint_bench: MEGABYTES must be >= 4 and REPETITIONS >= 1\n");
    return std::nullopt;
  }
  return options;
}

constexpr std::int64_t kFloatsPerTensor = 1 << 20;

// A model-sized state: 4 MiB tensors, like the weights and moments of a large layer stack.
CheckpointState model_sized_state(std::int64_t count) {
  CheckpointState state;
  for (std::int64_t i = 0; i < count; ++i) {
    state.shared.tensors["model.layer" + std::to_string(i) + ".weight"] =
        at::randn({kFloatsPerTensor});
  }
  state.local.tensors["rng"] = at::randint(0, 255, {5056}, at::kByte);
  return state;
}

std::vector<CheckpointStore> open_stores(const Registry& registry,
                                         const std::vector<BackendFigures>& backends,
                                         const fs::path& root) {
  std::vector<CheckpointStore> stores;
  for (const auto& figures : backends) {
    auto backend =
        registry.create<CheckpointBackend>(figures.name, Config({}, "checkpoint"), BuildContext{});
    // keep = 0: the bench deletes older checkpoints itself, between saves, as it deletes the
    // plain file after timing it; deleting is not writing.
    stores.emplace_back(backend, figures.name, root / figures.name, 0);
  }
  return stores;
}

void clear(CheckpointStore& store) {
  for (const auto& checkpoint : store.list()) remove_tree(checkpoint);
}

// The loop and the windows of steps its stalls are measured in.
struct StallBench {
  TrainingLoop& loop;
  double step_s = 0;          // the loop's median step time
  double training_bytes = 0;  // its checkpoint's size
  int window = 0;             // steps in a timed window
  std::int64_t step = 1;      // the step of the next save

  void steps() {
    for (int i = 0; i < window; ++i) loop.step();
  }
};

// The loop, its step time and a synchronous save's time decide the window: long enough for
// the save to end twice over, so that an asynchronous save's background work falls inside it.
StallBench calibrate(TrainingLoop& loop, CheckpointStore& store) {
  for (int i = 0; i < 3; ++i) loop.step();  // AdamW's moments exist after the first step
  std::vector<double> step_times;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    loop.step();
    step_times.push_back(seconds_since(start));
  }
  StallBench bench{loop};
  bench.step_s = median(step_times);
  const auto start = Clock::now();
  store.save(0, loop.state());
  const double save_s = seconds_since(start);
  bench.training_bytes = static_cast<double>(state_bytes(loop.state()));
  bench.window = static_cast<int>(std::clamp(std::ceil(2.0 * save_s / bench.step_s), 4.0, 400.0));
  return bench;
}

// The plain write and the store's save of the same state, one after the other, so that both
// meet the file system in the same state.
void measure_throughput(BackendFigures& figures, CheckpointStore& store,
                        const CheckpointState& state, const fs::path& root, StallBench& bench) {
  figures.plain.push_back(plain_write_seconds(state, root / "plain.bin"));
  const auto start = Clock::now();
  store.save(bench.step++, state);
  figures.sync.push_back(seconds_since(start));
  clear(store);
}

// The three windows, in an order rotated by `rotation` so that drift on a shared machine
// spreads over all of them.
void measure_stalls(BackendFigures& figures, CheckpointStore& store, StallBench& bench,
                    int rotation) {
  Spent none, sync, async;
  double call_s = 0;
  auto without_save = [&] { none = spend([&] { bench.steps(); }); };
  auto with_sync_save = [&] {
    sync = spend([&] {
      store.save(bench.step++, bench.loop.state());
      bench.steps();
    });
    clear(store);
  };
  auto with_async_save = [&] {
    async = spend([&] {
      const auto begin = Clock::now();
      bench.loop.save_async(store, bench.step++);
      call_s = seconds_since(begin);
      bench.steps();
      store.commit_pending();
    });
    clear(store);
  };
  std::vector<std::function<void()>> windows = {without_save, with_sync_save, with_async_save};
  std::rotate(windows.begin(), windows.begin() + (rotation % 3), windows.end());
  for (const auto& run : windows) run();
  figures.sync_stall.push_back(sync.wall - none.wall);
  figures.async_stall.push_back(async.wall - none.wall);
  figures.async_call.push_back(call_s);
  figures.sync_cpu.push_back(sync.cpu - none.cpu);
  figures.async_cpu.push_back(async.cpu - none.cpu);
}

void print_setup(const BenchOptions& options, double bytes, std::int64_t count, std::int64_t width,
                 const StallBench& bench) {
  std::printf("checkpoint of %.0f MiB in %lld tensors of 4 MiB, %d repetitions (medians), in %s\n",
              bytes / (1 << 20), static_cast<long long>(count), options.repetitions,
              options.root.c_str());
  std::printf("fsync included in both: plain = write() of the same bytes into one new file, then "
              "fsync;\n  store = the checkpoint store's save (files written and fsynced, "
              "manifest, rename, folder fsynced);\n  deleting files (the plain one, older "
              "checkpoints) is timed in neither\n");
  std::printf(
      "stall: single strategy, MLP 1024-%lld-%lld-10 with AdamW (checkpoint of %.0f MiB), "
      "batch 32, %d training threads, step %.3f s;\n  a save's stall = a window of %d "
      "steps after it (and its commit) less the same window without a save\n",
      static_cast<long long>(width), static_cast<long long>(width),
      bench.training_bytes / (1 << 20), at::get_num_threads(), bench.step_s, bench.window);
}

// Prints each backend's figures; true when every target is met.
bool print_figures(const std::vector<BackendFigures>& backends, double bytes) {
  std::printf("%-12s %11s %11s %11s %13s %14s %11s\n", "backend", "plain MB/s", "store MB/s",
              "store/plain", "sync stall s", "async stall s", "stall/sync");
  bool met = true;
  for (const auto& figures : backends) {
    const double plain_rate = bytes / median(figures.plain) / 1e6;
    const double store_rate = bytes / median(figures.sync) / 1e6;
    const double store_ratio = store_rate / plain_rate;
    const double sync_stall = median(figures.sync_stall);
    const double async_stall = median(figures.async_stall);
    const double stall_ratio = async_stall / sync_stall;
    std::printf("%-12s %11.1f %11.1f %11.3f %13.3f %14.4f %11.3f\n", figures.name.c_str(),
                plain_rate, store_rate, store_ratio, sync_stall, async_stall, stall_ratio);
    met = met && store_ratio >= figures.store_floor && stall_ratio <= 0.1;
  }
  for (const auto& figures : backends) {
    std::printf("%s: save_async returned to the loop in %.4f s (median); CPU seconds a save adds "
                "to its window: sync %.3f, async %.3f\n",
                figures.name.c_str(), median(figures.async_call), median(figures.sync_cpu),
                median(figures.async_cpu));
  }
  std::printf("targets: store/plain >= 0.6 (torch), >= 0.8 (safetensors); stall/sync <= 0.1: %s\n",
              met ? "met" : "missed");
  return met;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<BenchOptions> parsed =
      parse_arguments(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed) return 2;
  const BenchOptions& options = *parsed;
  remove_tree(options.root);
  fs::create_directories(options.root);

  const std::int64_t count = options.megabytes / 4;
  const CheckpointState state = model_sized_state(count);
  const double bytes = static_cast<double>(count * kFloatsPerTensor * 4);

  Registry registry;
  PluginLoader loader(registry);
  loader.load_folder(build_paths::plugin_dir());

  std::vector<BackendFigures> backends = {{"torch", 0.6, {}, {}, {}, {}, {}, {}, {}},
                                          {"safetensors", 0.8, {}, {}, {}, {}, {}, {}, {}}};
  std::vector<CheckpointStore> stores = open_stores(registry, backends, options.root);

  const std::int64_t width = width_for(options.megabytes);
  TrainingLoop loop(registry, width);
  StallBench bench = calibrate(loop, stores[0]);

  // Each repetition runs every backend, so drift on a shared machine spreads over all of them.
  for (int r = 0; r < options.repetitions; ++r) {
    for (std::size_t b = 0; b < backends.size(); ++b) {
      measure_throughput(backends[b], stores[b], state, options.root, bench);
      measure_stalls(backends[b], stores[b], bench, r);
    }
  }

  print_setup(options, bytes, count, width, bench);
  const bool met = print_figures(backends, bytes);
  stores.clear();
  remove_tree(options.root);
  return options.check && !met ? 1 : 0;
}
