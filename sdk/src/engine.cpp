#include "trainyard/engine.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>

#include "training_meter.hpp"
#include "trainyard/checkpoint.hpp"
#include "trainyard/checkpoint_store.hpp"
#include "trainyard/communicator.hpp"
#include "trainyard/cpu_binding.hpp"
#include "trainyard/dataset.hpp"
#include "trainyard/device.hpp"
#include "trainyard/distributed.hpp"
#include "trainyard/error.hpp"
#include "trainyard/loader.hpp"
#include "trainyard/metrics.hpp"
#include "trainyard/model.hpp"
#include "trainyard/optimizer.hpp"
#include "trainyard/precision.hpp"
#include "trainyard/scheduler.hpp"
#include "trainyard/step_phases.hpp"
#include "trainyard/version.hpp"

namespace trainyard {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct DeviceChoice {
  std::string backend;  // device plugin name ("cpu", "cuda")
  int index = 0;
};

DeviceChoice parse_device(const Config& run, const Registry& registry) {
  std::string text = run.get_string("device");
  if (text == "auto") {
    if (registry.contains("device", "cuda")) {
      BuildContext probe;
      auto cuda = registry.create<DeviceBackend>("cuda", Config({}, "device"), probe);
      if (cuda->available()) return {"cuda", 0};
    }
    return {"cpu", 0};
  }
  DeviceChoice choice;
  auto colon = text.find(':');
  choice.backend = text.substr(0, colon);
  if (colon != std::string::npos) {
    try {
      choice.index = std::stoi(text.substr(colon + 1));
    } catch (const std::exception&) {
      run.fail("device", "has a bad device index: '" + text + "'");
    }
  }
  if (!registry.contains("device", choice.backend)) {
    std::string known;
    for (const auto& name : registry.names("device")) known += (known.empty() ? "" : ", ") + name;
    run.fail("device", "names an unknown device '" + choice.backend + "' (known: " + known + ")");
  }
  return choice;
}

// A loader over `split`, map-style or streaming, or null when the dataset has no such split.
// `equal_lengths` gives every rank of a stream the same batch count (training needs it).
std::unique_ptr<Loader> open_split(const Dataset& dataset, const std::string& split,
                                   const LoaderOptions& options, bool equal_lengths) {
  if (auto map = dataset.map_split(split)) return std::make_unique<Loader>(map, options);
  if (auto stream = dataset.stream_split(split)) {
    return std::make_unique<Loader>(stream, options, equal_lengths);
  }
  return nullptr;
}

// The section without the keys the runtime owns, which the plugin does not declare.
Config without_runtime_keys(const Config& section, const OptionSpecs& runtime) {
  auto table = std::make_shared<Table>(section.table());
  for (const auto& spec : runtime) table->erase(spec.name);
  return Config(table, section.name());
}

}  // namespace

struct Engine::State {
  Recipe recipe;
  const Registry& registry;
  RunControls controls;

  Config run_options;
  Config loader_options;
  std::shared_ptr<DeviceBackend> device_backend;
  DeviceChoice device_choice;
  torch::Device device = torch::kCPU;
  std::shared_ptr<Dataset> dataset;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<LrScheduler> scheduler;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<Strategy> strategy;
  std::shared_ptr<CheckpointBackend> checkpoint_backend;
  std::unique_ptr<CheckpointStore> checkpoints;
  // The ranks' agreement on checkpoint decisions (null in a single process).
  std::function<bool(bool)> checkpoint_agree;
  std::vector<std::shared_ptr<MetricsSink>> sinks;
  std::unique_ptr<Loader> train_loader;
  std::string eval_split;  // empty: no evaluation
  StrategyContext context;

  // Multi-process runs only (WORLD_SIZE > 1).
  std::optional<Rendezvous> rendezvous;
  std::shared_ptr<Communicator> communicator;
  std::unique_ptr<FailureMonitor> monitor;
  int rank = 0;
  int world_size = 1;

  std::int64_t accumulation = 1;
  std::int64_t epochs = 1;
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;
  std::int64_t log_every = 50;
  std::int64_t step = 0;
  double base_lr = 0;
  fs::path output_dir;

  // The step phases the strategy marks, and the logging interval's figures (made once the
  // sinks and the model's FLOPs are known).
  std::unique_ptr<PhaseClock> phases;
  std::unique_ptr<TrainingMeter> meter;
  double flops_per_sample = 0;  // reported by the first model built
  Clock::time_point run_start;

  State(Recipe r, const Registry& reg, RunControls c)
      : recipe(std::move(r)), registry(reg), controls(std::move(c)) {}

  void log(const std::string& message) const {
    if (controls.log) {
      controls.log(message);
    } else {
      std::cerr << message << std::endl;
    }
  }

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - run_start).count(); }

  void emit(const MetricRecord& record) {
    for (auto& sink : sinks) sink->write(record);
  }
};

namespace {

// Memory as the device's allocator (or the process, on the host) sees it, and what the strategy
// holds in parameters, gradients and optimizer state.
void append_memory_figures(const DeviceBackend& backend, int index, const Strategy& strategy,
                           std::vector<std::pair<std::string, double>>& values) {
  const DeviceMemory memory = backend.memory(index);
  values.emplace_back("memory_current_bytes", static_cast<double>(memory.current_bytes));
  values.emplace_back("memory_peak_bytes", static_cast<double>(memory.peak_bytes));
  const HeldBytes held = strategy.held_bytes();
  values.emplace_back("held_parameter_bytes", static_cast<double>(held.parameters));
  values.emplace_back("held_gradient_bytes", static_cast<double>(held.gradients));
  values.emplace_back("held_optimizer_bytes", static_cast<double>(held.optimizer_state));
}

}  // namespace

Engine::Engine(Recipe recipe, const Registry& registry, RunControls controls)
    : state_(std::make_unique<State>(std::move(recipe), registry, std::move(controls))) {
  State& s = *state_;
  s.run_start = Clock::now();
  s.run_options = s.recipe.section("run");
  s.loader_options = s.recipe.section("loader");
  const Config& run = s.run_options;

  s.rendezvous = rendezvous_from_environment();
  if (s.rendezvous && s.rendezvous->world_size > 1) {
    s.rank = s.rendezvous->rank;
    s.world_size = s.rendezvous->world_size;
  } else {
    s.rendezvous.reset();
  }

  std::int64_t threads = run.get_int("threads");
  if (threads < 0) run.fail("threads", "must be >= 0, got " + std::to_string(threads));
  const std::vector<int> allowed = allowed_cpus();
  const int local_ranks = s.rendezvous ? s.rendezvous->local_world_size : 1;
  if (threads == 0 && local_ranks > 1) {
    // Ranks on one machine share its cores.
    const auto cores = static_cast<int>(std::max<std::size_t>(1, allowed.size()));
    threads = std::max(1, cores / local_ranks);
  }
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));
  // Before the communicator and the loader start their threads, which inherit the binding.
  const std::vector<int> bound_cpus =
      cpus_for_rank(parse_cpu_binding(run.get_string("cpu_binding"), "run.cpu_binding"), allowed,
                    s.rendezvous ? s.rendezvous->local_rank : 0, local_ranks,
                    threads > 0 ? static_cast<int>(threads) : static_cast<int>(allowed.size()));
  bind_process_to_cpus(bound_cpus);

  const auto seed = static_cast<std::uint64_t>(run.get_int("seed"));
  s.accumulation = run.get_int("grad_accumulation");
  if (s.accumulation < 1) run.fail("grad_accumulation", "must be >= 1");
  s.epochs = run.get_int("epochs");
  if (s.epochs < 1) run.fail("epochs", "must be >= 1, got " + std::to_string(s.epochs));
  s.log_every = run.get_int("log_every");
  if (s.log_every < 1) run.fail("log_every", "must be >= 1");
  double max_grad_norm = run.get_float("max_grad_norm");
  if (max_grad_norm < 0) run.fail("max_grad_norm", "must be >= 0");
  std::string output = run.get_string("output_dir");
  s.output_dir = output.empty() ? fs::path("runs") / s.recipe.name() : run.get_path("output_dir");

  s.device_choice = parse_device(run, registry);
  // Each rank of a machine drives its own GPU.
  if (s.rendezvous && s.device_choice.backend == "cuda")
    s.device_choice.index = s.rendezvous->local_rank;
  BuildContext build;
  build.seed = seed;
  build.recipe_dir = s.recipe.path.parent_path();
  s.device_backend =
      registry.create<DeviceBackend>(s.device_choice.backend, Config({}, "device"), build);
  if (!s.device_backend->available()) {
    run.fail("device",
             "names '" + run.get_string("device") + "', which is not available on this machine");
  }
  if (s.device_choice.index >= s.device_backend->device_count()) {
    run.fail("device", "names device index " + std::to_string(s.device_choice.index) +
                           " but only " + std::to_string(s.device_backend->device_count()) +
                           " are present");
  }
  s.device = s.device_backend->device(s.device_choice.index);
  build.device = s.device;

  if (s.rendezvous) {
    Config strategy_section = s.recipe.section("strategy");
    if (strategy_section.get_string("plugin") == "single") {
      throw Error("strategy 'single' runs one process, but this is rank " + std::to_string(s.rank) +
                  " of " + std::to_string(s.world_size) +
                  " (WORLD_SIZE); use [strategy] plugin = \"ddp\", or start one process");
    }
    Config comm = s.recipe.section("comm");
    const std::int64_t timeout_s = comm.has("timeout_s") ? comm.get_int("timeout_s") : 300;
    if (timeout_s < 1) comm.fail("timeout_s", "must be >= 1");
    s.rendezvous->timeout = std::chrono::seconds(timeout_s);
    const std::string plugin = comm.has("plugin")   ? comm.get_string("plugin")
                               : s.device.is_cuda() ? "nccl"
                                                    : "gloo";
    s.communicator =
        registry.create<Communicator>(plugin, without_runtime_keys(comm, comm_options()), build);
    s.communicator->connect(*s.rendezvous, s.device);
    const Rendezvous& meet = *s.rendezvous;
    s.log("trainyard: rank " + std::to_string(meet.rank) + " of " +
          std::to_string(meet.world_size) + " (local " + std::to_string(meet.local_rank) + " of " +
          std::to_string(meet.local_world_size) + "), store " + meet.master_addr + ":" +
          std::to_string(meet.master_port) + ", comm " + plugin + ", " +
          std::to_string(at::get_num_threads()) + " threads on " + s.device.str() +
          (bound_cpus.empty() ? "" : ", bound to cpus " + describe_cpus(allowed_cpus())));
    const char* agent = std::getenv(kAgentStoreVariable);
    const bool hosts_store = s.rank == 0 && !(agent && std::string(agent) == "True");
    s.monitor = std::make_unique<FailureMonitor>(s.communicator->store(), s.rank, s.world_size,
                                                 s.rendezvous->timeout, hosts_store);
    build.rank = s.rank;
    build.world_size = s.world_size;
    build.communicator = s.communicator;
  }

  // Every random stream starts from the recipe's seed, before anything draws from it.
  at::manual_seed(seed);
  s.device_backend->manual_seed(seed);

  auto plugin_of = [&](const Config& section) { return section.get_string("plugin"); };
  Config dataset_section = s.recipe.section("dataset");
  s.dataset = registry.create<Dataset>(plugin_of(dataset_section), dataset_section, build);
  build.data = s.dataset->info();

  Config precision_section = s.recipe.section("precision");
  s.precision = registry.create<Precision>(plugin_of(precision_section), precision_section, build);
  s.precision->check_device(s.device);
  Config optimizer_section = s.recipe.section("optimizer");
  s.optimizer = registry.create<Optimizer>(plugin_of(optimizer_section), optimizer_section, build);
  s.base_lr = s.optimizer->learning_rate();
  Config scheduler_section = s.recipe.section("scheduler");
  s.scheduler =
      registry.create<LrScheduler>(plugin_of(scheduler_section), scheduler_section, build);
  Config strategy_section = s.recipe.section("strategy");
  s.strategy = registry.create<Strategy>(plugin_of(strategy_section), strategy_section, build);

  Config model_section = s.recipe.section("model");
  const Registry* registry_ptr = &registry;
  State* state = &s;
  s.context.make_model = [registry_ptr, model_section, state](const BuildContext& context) {
    auto model =
        registry_ptr->create<Model>(model_section.get_string("plugin"), model_section, context);
    if (state->flops_per_sample == 0) state->flops_per_sample = model->flops_per_sample();
    return model;
  };
  s.context.optimizer = s.optimizer;
  s.context.precision = s.precision;
  s.context.device_backend = s.device_backend;
  s.context.communicator = s.communicator;
  s.context.build = build;
  s.context.step.accumulation = s.accumulation;
  s.phases = std::make_unique<PhaseClock>(s.device_backend.get(), s.device_choice.index, false);
  s.context.phases = s.phases.get();
  s.context.step.max_grad_norm = max_grad_norm;
  try {
    s.context.step.activation_checkpointing =
        ActivationCheckpointing::parse(run.get_string("activation_checkpointing"));
  } catch (const Error& error) {
    run.fail("activation_checkpointing", error.what());
  }
  if (s.monitor) {
    try {
      s.strategy->setup(s.context);
    } catch (...) {
      rethrow_naming_failed_rank(*s.monitor, s.rank);
    }
  } else {
    s.strategy->setup(s.context);
  }

  const Config& loader = s.loader_options;
  const std::string train_split = loader.get_string("train_split");
  LoaderOptions train;
  train.batch_size = loader.get_int("batch_size");
  if (train.batch_size < 1) loader.fail("batch_size", "must be >= 1");
  train.shuffle = loader.get_bool("shuffle");
  train.drop_last = loader.get_bool("drop_last");
  std::int64_t workers = loader.get_int("workers");
  if (workers < -1) loader.fail("workers", "must be >= 0, or -1 for automatic");
  if (workers == -1) {
    workers = default_loader_workers(
        static_cast<unsigned>(std::max<std::size_t>(1, allowed.size())), local_ranks);
  }
  train.workers = static_cast<int>(workers);
  train.prefetch = static_cast<int>(loader.get_int("prefetch"));
  if (train.prefetch < 1) loader.fail("prefetch", "must be >= 1");
  train.seed = seed;
  train.place = s.strategy->data_parallel_place();
  if (s.device.type() != torch::kCPU) {
    // Workers finish batches in page-locked memory and start their copies to the device, so
    // the training thread only orders its stream after them (stage()).
    std::shared_ptr<DeviceBackend> backend = s.device_backend;
    const int index = s.device_choice.index;
    train.finish_batch = [backend, index](Batch batch) {
      for (auto& [name, tensor] : batch.tensors) tensor = backend->pin(tensor);
      return backend->prefetch(batch, index);
    };
  }
  s.train_loader = open_split(*s.dataset, train_split, train, /*equal_lengths=*/true);
  if (!s.train_loader) {
    loader.fail("train_split", "names a split the dataset does not have: '" + train_split + "'");
  }
  if (s.train_loader->batches_per_epoch() < 0) {
    throw Error("dataset '" + plugin_of(dataset_section) + "' streams its '" + train_split +
                "' split without knowing its size; the engine needs the samples per epoch to "
                "schedule the run");
  }

  s.steps_per_epoch = s.train_loader->batches_per_epoch() / s.accumulation;
  if (s.steps_per_epoch < 1) {
    throw Error("the '" + train_split + "' split yields " +
                std::to_string(s.train_loader->batches_per_epoch()) +
                " batches per epoch, fewer than one optimizer step of " +
                std::to_string(s.accumulation) + " micro-batches");
  }
  s.total_steps = s.epochs * s.steps_per_epoch;
  if (std::int64_t max_steps = run.get_int("max_steps"); max_steps > 0) {
    s.total_steps = std::min(s.total_steps, max_steps);
  }
  if (run.get_bool("eval")) {
    const std::string eval_split = loader.get_string("eval_split");
    if (!s.dataset->map_split(eval_split) && !s.dataset->stream_split(eval_split)) {
      loader.fail("eval_split", "names a split the dataset does not have: '" + eval_split + "'");
    }
    s.eval_split = eval_split;
  }

  if (s.recipe.has_section("checkpoint")) {
    Config section = s.recipe.section("checkpoint");
    s.checkpoint_backend = registry.create<CheckpointBackend>(
        plugin_of(section), without_runtime_keys(section, checkpoint_policy_options()), build);
    std::string dir = section.get_string("dir");
    fs::path folder = dir.empty() ? s.output_dir / "checkpoints" : section.get_path("dir");
    std::int64_t keep = section.get_int("keep");
    if (keep < 0) section.fail("keep", "must be >= 0");
    if (section.get_int("every_steps") < 0) section.fail("every_steps", "must be >= 0");
    if (section.get_float("every_seconds") < 0) section.fail("every_seconds", "must be >= 0");
    CheckpointPeers peers{s.rank, s.world_size, {}};
    if (s.communicator) {
      // The ranks agree through a MIN all-reduce of a flag on the world group.
      auto communicator = s.communicator;
      const torch::Device device = s.device;
      peers.all_ok = [communicator, device](bool ok) {
        std::vector<at::Tensor> flag{
            at::full({1}, ok ? 1 : 0, at::TensorOptions(at::kInt)).to(device)};
        c10d::AllreduceOptions options;
        options.reduceOp = c10d::ReduceOp::MIN;
        CollectiveWait wait;
        communicator->world()->allreduce(flag, options)->wait();
        return flag[0].item<int>() == 1;
      };
    }
    s.checkpoint_agree = peers.all_ok;
    s.checkpoints = std::make_unique<CheckpointStore>(s.checkpoint_backend, plugin_of(section),
                                                      folder, static_cast<int>(keep), peers);
  }

  Config sinks = s.recipe.section("sinks");
  for (const auto& [name, value] : sinks.table().entries()) {
    Config section(value.table_ptr(), "sinks." + name);
    if (!section.get_bool("enabled")) continue;
    s.sinks.push_back(registry.create<MetricsSink>(
        plugin_of(section), without_runtime_keys(section, sink_common_options()), build));
  }

  s.phases->keep_spans(std::any_of(s.sinks.begin(), s.sinks.end(),
                                   [](const auto& sink) { return sink->wants_phase_spans(); }));
  MeterSetup meter;
  meter.tokens_per_sample = build.data.sequence_length;
  meter.flops_per_sample = s.flops_per_sample;
  const double peak_tflops = run.get_float("peak_tflops");
  if (peak_tflops < 0) run.fail("peak_tflops", "must be >= 0");
  if (peak_tflops > 0) {
    meter.peak_flops = peak_tflops * 1e12;
  } else if (s.flops_per_sample > 0) {
    meter.peak_flops = measure_peak_flops(*s.device_backend, s.device_choice.index,
                                          s.precision->autocast_dtype().has_value());
  }
  s.meter = std::make_unique<TrainingMeter>(meter, *s.phases);
}

Engine::~Engine() = default;

Strategy& Engine::strategy() { return *state_->strategy; }
Loader& Engine::train_loader() { return *state_->train_loader; }
const torch::Device& Engine::device() const { return state_->device; }
std::int64_t Engine::step() const { return state_->step; }

std::vector<Batch> Engine::next_micro_batches() {
  State& s = *state_;
  PhaseClock& phases = s.meter->phases();
  phases.begin_step(s.step);
  std::vector<Batch> host;
  host.reserve(static_cast<std::size_t>(s.accumulation));
  for (std::int64_t i = 0; i < s.accumulation; ++i) {
    std::optional<Batch> batch = s.train_loader->next();
    if (!batch) {
      phases.cancel_step();
      return {};
    }
    host.push_back(std::move(*batch));
  }
  phases.end_data_wait();
  std::vector<Batch> micro;
  micro.reserve(host.size());
  for (const Batch& batch : host)
    micro.push_back(s.device_backend->stage(batch, s.device_choice.index));
  phases.mark(StepPhase::HostToDevice);
  // Host copies are released after the mark: freeing pinned memory is not copying.
  return micro;
}

StepResult Engine::train_one_step(std::span<const Batch> micro_batches) {
  State& s = *state_;
  s.strategy->set_learning_rate(s.scheduler->learning_rate(s.step, s.total_steps, s.base_lr));
  StepResult result = s.strategy->train_step(micro_batches);
  s.meter->phases().end_step();
  ++s.step;
  s.meter->add_step(result);
  return result;
}

RunSummary Engine::run() {
  State& s = *state_;
  if (!s.monitor) return run_steps();
  try {
    RunSummary summary = run_steps();
    // Rank 0 may host the store: every rank leaves together, after the others stop watching it.
    s.monitor->finish();
    s.communicator->barrier();
    return summary;
  } catch (...) {
    rethrow_naming_failed_rank(*s.monitor, s.rank);
  }
}

RunSummary Engine::run_steps() {
  State& s = *state_;
  // Samples per optimizer step over every data-parallel rank.
  const std::int64_t global_batch =
      static_cast<std::int64_t>(s.strategy->data_parallel_place().size) * s.accumulation *
      s.loader_options.get_int("batch_size");
  RunSummary summary;
  std::int64_t epoch = 0;
  std::int64_t first_batch = 0;

  if (s.controls.resume) {
    if (!s.checkpoints) throw Error("--resume needs a [checkpoint] section in the recipe");
    std::optional<fs::path> checkpoint;
    if (*s.controls.resume == "auto") {
      checkpoint = s.checkpoints->latest_valid([&](const std::string& m) { s.log(m); });
      if (!checkpoint)
        s.log("no valid checkpoint in " + s.checkpoints->folder().string() +
              "; starting from scratch");
    } else {
      checkpoint = fs::path(*s.controls.resume);
    }
    if (checkpoint) {
      CheckpointState state = s.checkpoints->load(*checkpoint);
      auto number = [&](const char* key) -> std::int64_t {
        auto it = state.shared.metadata.find(key);
        if (it == state.shared.metadata.end()) {
          throw Error("checkpoint " + checkpoint->string() + " lacks '" + key + "'");
        }
        return std::stoll(it->second);
      };
      // Written by another number of ranks: the strategy reshards; the data order follows from
      // the seed and the global batch, so the position carries over only when both the global
      // batch and the steps per epoch are the same.
      const bool resharding = state.shared.metadata.count(kSavedWorldSizeKey) != 0;
      if (resharding) {
        const std::string saved = state.shared.metadata.at(kSavedWorldSizeKey);
        auto refuse = [&](const std::string& why) {
          throw Error("cannot resume " + checkpoint->string() + " (written by " + saved +
                      " ranks) on " + std::to_string(s.world_size) + ": " + why);
        };
        if (s.train_loader->streaming()) {
          refuse("a streaming dataset's reader positions are per rank");
        }
        const auto& meta = state.shared.metadata;
        const std::string global_batch_text = std::to_string(global_batch);
        const std::string steps_per_epoch = std::to_string(s.steps_per_epoch);
        if (!meta.count("engine.global_batch") ||
            meta.at("engine.global_batch") != global_batch_text) {
          refuse(
              "its global batch (data-parallel ranks x batch_size x grad_accumulation) was " +
              (meta.count("engine.global_batch") ? meta.at("engine.global_batch") : "unrecorded") +
              ", this run's is " + global_batch_text + "; set loader.batch_size so they match");
        }
        if (!meta.count("engine.steps_per_epoch") ||
            meta.at("engine.steps_per_epoch") != steps_per_epoch) {
          refuse("its epochs had " +
                 (meta.count("engine.steps_per_epoch") ? meta.at("engine.steps_per_epoch")
                                                       : "unrecorded") +
                 " steps, this run's have " + steps_per_epoch);
        }
      }
      s.strategy->load_state(state);
      s.precision->load_state(state.shared);
      s.step = number("engine.step");
      epoch = number("engine.epoch");
      first_batch = number("engine.batch_in_epoch");
      if (resharding) {
        // Per-rank random streams do not map across rank counts: they restart from the seed.
        s.log("resharded " + checkpoint->string() + " from " +
              state.shared.metadata.at(kSavedWorldSizeKey) + " ranks to " +
              std::to_string(s.world_size) + "; per-rank random streams restart from the seed");
      }
      auto rng =
          resharding ? state.local.tensors.end() : state.local.tensors.find("engine.rng.cpu");
      if (rng != state.local.tensors.end()) {
        auto generator = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(generator.mutex());
        generator.set_state(rng->second);
      }
      if (!resharding) {
        s.device_backend->load_rng_state(state.local);
        s.train_loader->load_state(state.local);
      }
      s.log("resumed from " + checkpoint->string() + " at step " + std::to_string(s.step));
    }
  }

  RunInfo info;
  info.name = s.recipe.name();
  info.total_steps = s.total_steps;
  info.steps_per_epoch = s.steps_per_epoch;
  info.epochs = s.epochs;
  info.output_dir = s.output_dir.string();
  info.rank = s.rank;
  info.world_size = s.world_size;
  for (auto& sink : s.sinks) sink->begin(info);

  const bool checkpoint_async = s.checkpoints && s.recipe.section("checkpoint").get_bool("async");
  const double every_seconds =
      s.checkpoints ? s.recipe.section("checkpoint").get_float("every_seconds") : 0.0;
  Clock::time_point last_save = Clock::now();
  auto save = [&](std::int64_t at_epoch, std::int64_t batch_in_epoch) {
    CheckpointState state;
    s.strategy->save_state(state);
    s.precision->save_state(state.shared);
    auto& meta = state.shared.metadata;
    meta["engine.step"] = std::to_string(s.step);
    meta["engine.epoch"] = std::to_string(at_epoch);
    meta["engine.batch_in_epoch"] = std::to_string(batch_in_epoch);
    meta["engine.global_batch"] = std::to_string(global_batch);
    meta["engine.steps_per_epoch"] = std::to_string(s.steps_per_epoch);
    meta["engine.recipe"] = to_toml(*s.recipe.root);
    meta["engine.framework_version"] = kFrameworkVersion;
    {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      state.local.tensors["engine.rng.cpu"] = generator.get_state();
    }
    s.device_backend->save_rng_state(state.local);
    s.train_loader->save_state(state.local);
    if (checkpoint_async) {
      s.checkpoints->save_async(s.step, state);
    } else {
      summary.last_checkpoint = s.checkpoints->save(s.step, state);
    }
    last_save = Clock::now();
  };
  auto commit_pending_save = [&] {
    if (s.checkpoints && s.checkpoints->has_pending()) {
      summary.last_checkpoint = s.checkpoints->commit_pending();
    }
  };

  auto flush_train_metrics = [&](std::int64_t at_epoch) {
    if (s.meter->interval_empty()) return;
    IntervalFigures figures = s.meter->close_interval();
    MetricRecord record;
    record.phase = "train";
    record.step = s.step;
    record.epoch = at_epoch;
    record.elapsed_s = s.elapsed();
    summary.final_train_loss = figures.mean_loss;
    record.values = std::move(figures.values);
    record.values.emplace_back("lr",
                               s.scheduler->learning_rate(s.step - 1, s.total_steps, s.base_lr));
    record.values.emplace_back(
        "epoch_progress",
        static_cast<double>(at_epoch) + static_cast<double>(s.train_loader->position()) /
                                            static_cast<double>(std::max<std::int64_t>(
                                                1, s.train_loader->batches_per_epoch())));
    for (const auto& metric : s.precision->metrics()) record.values.push_back(metric);
    append_memory_figures(*s.device_backend, s.device_choice.index, *s.strategy, record.values);
    if (!figures.spans.empty()) {
      for (auto& sink : s.sinks) {
        if (sink->wants_phase_spans()) sink->write_phase_spans(figures.spans);
      }
    }
    s.emit(record);
    s.meter->restart_clock();
  };

  auto evaluate = [&](std::int64_t at_epoch) {
    LoaderOptions options;
    std::int64_t eval_batch = s.loader_options.get_int("eval_batch_size");
    options.batch_size = eval_batch > 0 ? eval_batch : 4 * s.loader_options.get_int("batch_size");
    options.shuffle = false;
    options.drop_last = false;
    options.pad = false;
    options.place = s.strategy->data_parallel_place();
    std::unique_ptr<Loader> loader = open_split(*s.dataset, s.eval_split, options, false);
    const std::int64_t max_batches = s.run_options.get_int("eval_max_batches");
    torch::Tensor loss_sum;
    TensorMap sums;
    std::int64_t samples = 0;
    std::int64_t batches = 0;
    // Sharded strategies evaluate collectively (fsdp gathers each unit), so every rank runs as
    // many evaluation steps as the rank with the most batches; the others repeat their last
    // batch and discard the result.
    std::int64_t steps_everywhere = 0;
    if (s.communicator && loader->batches_per_epoch() >= 0) {
      std::int64_t own = loader->batches_per_epoch();
      if (max_batches > 0) own = std::min(own, max_batches);
      std::vector<at::Tensor> count{at::tensor({own}, at::TensorOptions(at::kLong)).to(s.device)};
      c10d::AllreduceOptions most;
      most.reduceOp = c10d::ReduceOp::MAX;
      CollectiveWait wait;
      s.communicator->world()->allreduce(count, most)->wait();
      steps_everywhere = count[0].cpu().item<std::int64_t>();
    }
    std::optional<Batch> last;
    while (auto batch = loader->next()) {
      if (max_batches > 0 && batches >= max_batches) break;
      last = batch->to(s.device);
      EvalResult result = s.strategy->eval_step(*last);
      loss_sum = loss_sum.defined() ? loss_sum + result.loss_sum : result.loss_sum;
      for (const auto& [name, value] : result.sums) {
        auto it = sums.find(name);
        if (it == sums.end()) {
          sums.emplace(name, value.to(at::kDouble));
        } else {
          it->second = it->second + value.to(at::kDouble);
        }
      }
      samples += result.samples;
      ++batches;
    }
    for (std::int64_t extra = batches; last && extra < steps_everywhere; ++extra) {
      s.strategy->eval_step(*last);
    }
    // Every rank reports the metric of the whole split: the sums are added up across ranks, and
    // divided by how many ranks read each data-parallel slice.
    std::vector<double> totals;
    totals.push_back(loss_sum.defined() ? loss_sum.item<double>() : 0.0);
    for (const auto& [name, value] : sums) totals.push_back(value.item<double>());
    totals.push_back(static_cast<double>(samples));
    if (s.communicator) {
      std::vector<at::Tensor> buffer{
          at::tensor(totals, at::TensorOptions(at::kDouble)).to(s.device)};
      {
        CollectiveWait wait;
        s.communicator->world()->allreduce(buffer)->wait();
      }
      const double copies = static_cast<double>(s.world_size) /
                            static_cast<double>(s.strategy->data_parallel_place().size);
      at::Tensor reduced = (buffer[0] / copies).cpu();
      for (std::size_t i = 0; i < totals.size(); ++i) {
        totals[i] = reduced[static_cast<std::int64_t>(i)].item<double>();
      }
    }
    MetricRecord record;
    record.phase = "eval";
    record.step = s.step;
    record.epoch = at_epoch;
    record.elapsed_s = s.elapsed();
    const double global_samples = totals.back();
    const double count = std::max(global_samples, 1.0);
    if (loss_sum.defined() || s.communicator) record.values.emplace_back("loss", totals[0] / count);
    std::size_t index = 1;
    for (const auto& [name, value] : sums)
      record.values.emplace_back(name, totals[index++] / count);
    record.values.emplace_back("samples", global_samples);
    summary.eval.clear();
    for (const auto& [name, value] : record.values) summary.eval[name] = value;
    s.emit(record);
  };

  const std::int64_t every_steps =
      s.checkpoints ? s.recipe.section("checkpoint").get_int("every_steps") : 0;
  const auto run_started = Clock::now();
  const std::int64_t first_step = s.step;
  s.meter->restart_clock();
  bool finished = s.step >= s.total_steps;
  for (; epoch < s.epochs && !finished; ++epoch, first_batch = 0) {
    s.train_loader->start_epoch(epoch, first_batch);
    while (s.step < s.total_steps) {
      std::vector<Batch> micro = next_micro_batches();
      if (micro.empty()) break;
      if (s.monitor) {
        test_failure_hook(s.rank, s.step);
        s.monitor->set_step(s.step);
      }
      train_one_step(micro);
      const bool log_boundary = s.step % s.log_every == 0;
      if (log_boundary) flush_train_metrics(epoch);
      // A background save is committed as soon as it is written, and at the latest at the next
      // logging boundary, so a crash loses at most one interval of saved work.
      // Ranks commit together, so with several only at the boundary every rank reaches.
      if (s.checkpoints && s.checkpoints->has_pending() &&
          (log_boundary || (s.world_size == 1 && s.checkpoints->pending_written()))) {
        commit_pending_save();
      }
      bool time_is_up =
          every_seconds > 0 && log_boundary &&
          std::chrono::duration<double>(Clock::now() - last_save).count() >= every_seconds;
      // Clocks differ between ranks: they save when every one of them finds the time up.
      if (every_seconds > 0 && log_boundary && s.checkpoint_agree) {
        time_is_up = s.checkpoint_agree(time_is_up);
      }
      if (((every_steps > 0 && s.step % every_steps == 0) || time_is_up) &&
          s.step < s.total_steps) {
        save(epoch, s.train_loader->position());
        // Throughput and step time measure training, not saving.
        s.meter->restart_clock();
      }
    }
    finished = s.step >= s.total_steps;
    flush_train_metrics(epoch);
    const bool epoch_complete =
        s.train_loader->batches_per_epoch() - s.train_loader->position() < s.accumulation;
    if (!s.eval_split.empty() && (epoch_complete || finished)) {
      evaluate(epoch);
      s.meter->restart_clock();
    }
    if (finished && s.checkpoints && s.recipe.section("checkpoint").get_bool("at_end")) {
      // A completed epoch resumes at the start of the next one.
      if (epoch_complete) {
        save(epoch + 1, 0);
      } else {
        save(epoch, s.train_loader->position());
      }
    }
  }

  commit_pending_save();
  if (std::string file = s.run_options.get_string("final_model_file"); !file.empty()) {
    // Sharded strategies gather their parameters collectively: every rank takes part, rank 0
    // writes. Buffers (and, for replicated strategies, the parameters too) come from the
    // strategy's saved state.
    TensorMap parameters = s.strategy->full_parameters();
    CheckpointState state;
    s.strategy->save_state(state);  // may gather too (a consolidated save): every rank calls it
    if (s.rank == 0) {
      TensorMap model;
      const std::string prefix = "model.";
      for (const auto& [name, tensor] : state.shared.tensors) {
        if (name.rfind(prefix, 0) == 0) model[name.substr(prefix.size())] = tensor;
      }
      for (auto& [name, tensor] : parameters) model[name] = tensor;
      write_tensor_file(s.run_options.get_path("final_model_file"), model);
    }
  }

  summary.steps = s.step;
  summary.wall_s = std::chrono::duration<double>(Clock::now() - run_started).count();
  const std::int64_t steps_run = s.step - first_step;
  summary.samples = steps_run * s.accumulation * s.loader_options.get_int("batch_size");
  summary.samples_per_s =
      summary.wall_s > 0 ? static_cast<double>(summary.samples) / summary.wall_s : 0;

  MetricRecord record;
  record.phase = "summary";
  record.step = s.step;
  record.epoch = epoch;
  record.elapsed_s = s.elapsed();
  record.values = {{"steps", static_cast<double>(summary.steps)},
                   {"wall_s", summary.wall_s},
                   {"samples_per_s", summary.samples_per_s},
                   {"final_train_loss", summary.final_train_loss}};
  for (int index = 0; index < kStepPhaseCount; ++index) {
    const auto phase = static_cast<StepPhase>(index);
    record.values.emplace_back(std::string(step_phase_name(phase)) + "_share",
                               s.meter->phase_share(phase));
  }
  append_memory_figures(*s.device_backend, s.device_choice.index, *s.strategy, record.values);
  if (s.rank == 0) {
    for (const auto& line : s.meter->bottleneck_report()) s.log("trainyard: " + line);
  }
  for (const auto& [name, value] : summary.eval) record.values.emplace_back("eval_" + name, value);
  s.emit(record);
  for (auto& sink : s.sinks) sink->end();
  return summary;
}

}  // namespace trainyard
