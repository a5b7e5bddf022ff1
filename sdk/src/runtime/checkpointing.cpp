#include "checkpointing.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/api/version.hpp"

namespace trainyard {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRngKey = "engine.rng.cpu";
constexpr const char* kLayoutKey = "engine.layout";
constexpr const char* kAccumulationKey = "engine.accumulation";
constexpr const char* kMeshKey = "engine.mesh";
// The data-parallel size (shared) and each rank's place in it (its own file): which saved rank's
// data positions a rank of another layout with the same data-parallel size continues from.
constexpr const char* kDataParallelSizeKey = "engine.data_parallel_size";
constexpr const char* kDataParallelRankKey = "engine.data_parallel_rank";

// The local entries of the saved rank that read what this rank reads (the same place in a
// data-parallel group of the same size) in a state loaded from every saved rank's files, under
// their own names; nullopt when the checkpoint does not record its places or none matches.
std::optional<StateDict> entries_of_same_data_place(const CheckpointState& state,
                                                    const DataParallelPlace& place) {
  const auto size = state.shared.metadata.find(kDataParallelSizeKey);
  if (size == state.shared.metadata.end() || std::stoll(size->second) != place.size) {
    return std::nullopt;
  }
  for (int rank = 0;; ++rank) {
    const auto saved_place = state.local.metadata.find(saved_rank_key(rank, kDataParallelRankKey));
    if (saved_place == state.local.metadata.end()) break;  // past the last saved rank
    if (std::stoll(saved_place->second) != place.rank) continue;
    const std::string prefix = saved_rank_key(rank, "");
    StateDict own;
    for (const auto& [key, tensor] : state.local.tensors) {
      if (key.rfind(prefix, 0) == 0) own.tensors[key.substr(prefix.size())] = tensor;
    }
    for (const auto& [key, text] : state.local.metadata) {
      if (key.rfind(prefix, 0) == 0) own.metadata[key.substr(prefix.size())] = text;
    }
    return own;
  }
  return std::nullopt;
}

// Refuses a state written by another number of ranks unless this run reads the same samples at
// every step: the data order follows from the seed and the global batch.
// `same_places`: every rank finds the reader positions of its own data-parallel place (the same
// ranks on the same mesh, or the same data-parallel size under another model split).
void check_resharding(const CheckpointState& state, const fs::path& checkpoint,
                      const CheckpointedRun& run, bool same_places) {
  const auto& meta = state.shared.metadata;
  auto saved_world = meta.find(kSavedWorldSizeKey);
  const std::string saved =
      saved_world != meta.end() ? saved_world->second + " ranks" : "another layout";
  auto refuse = [&](const std::string& why) {
    throw Error("cannot resume " + checkpoint.string() + " (written by " + saved + ") on " +
                std::to_string(run.world_size) + " ranks with " + run.layout + ": " + why);
  };
  if (run.loader->streaming() && !same_places) {
    auto size = state.shared.metadata.find(kDataParallelSizeKey);
    refuse("a streaming dataset's reader positions are per data-parallel rank, and it had " +
           (size != state.shared.metadata.end() ? size->second : std::string("unrecorded")) +
           " data-parallel ranks, this run has " +
           std::to_string(run.strategy->data_parallel_place().size));
  }
  auto recorded = [&](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string("unrecorded") : it->second;
  };
  const std::string global_batch = std::to_string(run.global_batch);
  const std::string steps_per_epoch = std::to_string(run.steps_per_epoch);
  if (recorded("engine.global_batch") != global_batch) {
    refuse("its global batch (data-parallel ranks x batch_size x grad_accumulation) was " +
           recorded("engine.global_batch") + ", this run's is " + global_batch +
           "; set loader.batch_size so they match");
  }
  if (recorded("engine.steps_per_epoch") != steps_per_epoch) {
    refuse("its epochs had " + recorded("engine.steps_per_epoch") + " steps, this run's have " +
           steps_per_epoch);
  }
}

}  // namespace

CheckpointPolicy CheckpointPolicy::read(const Config& section, const fs::path& output_dir) {
  CheckpointPolicy policy;
  policy.backend = section.get_string("plugin");
  policy.folder =
      section.get_string("dir").empty() ? output_dir / "checkpoints" : section.get_path("dir");
  policy.every_steps = section.get_int("every_steps");
  policy.every_seconds = section.get_float("every_seconds");
  policy.async = section.get_bool("async");
  policy.at_end = section.get_bool("at_end");
  policy.keep = static_cast<int>(section.get_int("keep"));
  return policy;
}

Checkpointing::Checkpointing(const Recipe& recipe, const Registry& registry,
                             const BuildContext& build, const fs::path& output_dir,
                             CheckpointedRun run, std::function<bool(bool)> agreement)
    : run_(std::move(run)), agreement_(std::move(agreement)) {
  const Config section = recipe.section("checkpoint");
  policy_ = CheckpointPolicy::read(section, output_dir);
  auto backend = registry.create<CheckpointBackend>(
      policy_.backend, plugin_options(section, checkpoint_policy_options()), build);
  CheckpointPeers peers{build.rank, build.world_size, agreement_};
  store_ = std::make_unique<CheckpointStore>(backend, policy_.backend, policy_.folder, policy_.keep,
                                             peers);
}

std::optional<TrainingPosition> Checkpointing::resume(
    const std::string& which, const std::function<void(const std::string&)>& log) {
  std::optional<fs::path> checkpoint;
  if (which == "auto") {
    checkpoint = store_->latest_valid(log);
    if (!checkpoint) {
      log("no valid checkpoint in " + store_->folder().string() + "; starting from scratch");
      return std::nullopt;
    }
  } else {
    checkpoint = fs::path(which);
  }
  CheckpointState state = store_->load(*checkpoint);
  // Copied: reloading every rank's files below replaces `state`.
  const auto layout_entry = state.shared.metadata.find(kLayoutKey);
  const std::string saved_layout =
      layout_entry != state.shared.metadata.end() ? layout_entry->second : std::string();
  const bool other_layout = !saved_layout.empty() && saved_layout != run_.layout;
  const bool other_world = state.shared.metadata.count(kSavedWorldSizeKey) != 0;
  // The same ranks under another layout: every saved rank's pieces, for re-slicing.
  if (other_layout && !other_world) state = store_->load(*checkpoint, /*every_rank=*/true);
  auto number = [&](const char* key) -> std::int64_t {
    auto it = state.shared.metadata.find(key);
    if (it == state.shared.metadata.end()) {
      throw Error("checkpoint " + checkpoint->string() + " lacks '" + key + "'");
    }
    return std::stoll(it->second);
  };
  // Written by another number of ranks or another layout: the strategy reshards.
  const bool resharding = other_world || other_layout;
  auto saved_mesh = state.shared.metadata.find(kMeshKey);
  // The loader positions of this rank's data-parallel place, when they carry over.
  std::optional<StateDict> data_place;
  if (resharding) {
    if (other_layout && !other_world && saved_mesh != state.shared.metadata.end() &&
        saved_mesh->second == run_.mesh) {
      data_place = state.local;  // the same ranks on the same mesh: this rank's own file
    } else {
      data_place = entries_of_same_data_place(state, run_.strategy->data_parallel_place());
    }
  }
  if (resharding) check_resharding(state, *checkpoint, run_, data_place.has_value());
  run_.strategy->load_state(state);
  run_.precision->load_state(state.shared);
  TrainingPosition position;
  position.step = number("engine.step");
  position.epoch = number("engine.epoch");
  position.batch_in_epoch = number("engine.batch_in_epoch");
  const std::string state_prefix = "engine.state.";
  for (const auto& [key, text] : state.shared.metadata) {
    if (key.rfind(state_prefix, 0) == 0) position.engine_state[key.substr(state_prefix.size())] = text;
  }
  // The position counts this rank's micro-batches: steps taken times the accumulation then.
  if (auto saved = state.shared.metadata.find(kAccumulationKey);
      saved != state.shared.metadata.end() && std::stoll(saved->second) != run_.accumulation) {
    position.batch_in_epoch =
        position.batch_in_epoch / std::stoll(saved->second) * run_.accumulation;
  }
  if (resharding) {
    // Per-rank random streams do not map across layouts: they restart from the seed.
    log("resharded " + checkpoint->string() + " from " +
        (other_world ? state.shared.metadata.at(kSavedWorldSizeKey) + " ranks"
                     : std::string("'") + saved_layout + "'") +
        " to " + std::to_string(run_.world_size) + " ranks with " + run_.layout +
        "; per-rank random streams restart from the seed");
    // A streaming reader continues where the saved rank at this data-parallel place stopped.
    if (data_place && run_.loader->streaming()) run_.loader->load_state(*data_place);
  } else {
    if (auto rng = state.local.tensors.find(kRngKey); rng != state.local.tensors.end()) {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng->second);
    }
    run_.device->load_rng_state(state.local);
    run_.loader->load_state(state.local);
  }
  log("resumed from " + checkpoint->string() + " at step " + std::to_string(position.step));
  return position;
}

void Checkpointing::start_clock() { last_save_ = Clock::now(); }

bool Checkpointing::after_step(const TrainingPosition& position, std::int64_t total_steps,
                               bool log_boundary) {
  // A background save is committed as soon as it is written, and at the latest at the next
  // logging boundary, so a crash loses at most one interval of saved work. Ranks commit
  // together, so with several only at the boundary every rank reaches.
  if (store_->has_pending() &&
      (log_boundary || (run_.world_size == 1 && store_->pending_written()))) {
    commit_pending();
  }
  const bool by_time = policy_.every_seconds > 0 && log_boundary;
  bool time_is_up = by_time && std::chrono::duration<double>(Clock::now() - last_save_).count() >=
                                   policy_.every_seconds;
  // Clocks differ between ranks: they save when every one of them finds the time up.
  if (by_time && agreement_) time_is_up = agreement_(time_is_up);
  const bool by_steps = policy_.every_steps > 0 && position.step % policy_.every_steps == 0;
  if (!(by_steps || time_is_up) || position.step >= total_steps) return false;
  save(position);
  return true;
}

void Checkpointing::at_end(const TrainingPosition& position) {
  if (policy_.at_end) save(position);
}

void Checkpointing::save(const TrainingPosition& position) {
  last_saved_step_ = position.step;
  CheckpointState state;
  run_.strategy->save_state(state);
  run_.precision->save_state(state.shared);
  auto& meta = state.shared.metadata;
  meta["engine.step"] = std::to_string(position.step);
  meta["engine.epoch"] = std::to_string(position.epoch);
  meta["engine.batch_in_epoch"] = std::to_string(position.batch_in_epoch);
  for (const auto& [name, text] : position.engine_state) meta["engine.state." + name] = text;
  meta["engine.global_batch"] = std::to_string(run_.global_batch);
  meta["engine.steps_per_epoch"] = std::to_string(run_.steps_per_epoch);
  meta[kAccumulationKey] = std::to_string(run_.accumulation);
  meta[kLayoutKey] = run_.layout;
  meta[kMeshKey] = run_.mesh;
  const DataParallelPlace place = run_.strategy->data_parallel_place();
  meta[kDataParallelSizeKey] = std::to_string(place.size);
  state.local.metadata[kDataParallelRankKey] = std::to_string(place.rank);
  meta["engine.recipe"] = run_.recipe_toml;
  meta["engine.framework_version"] = kFrameworkVersion;
  if (run_.export_files) {
    for (const auto& [file, text] : *run_.export_files) meta[kExportFilePrefix + file] = text;
  }
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    state.local.tensors[kRngKey] = generator.get_state();
  }
  run_.device->save_rng_state(state.local);
  run_.loader->save_state(state.local);
  if (policy_.async) {
    // Parameters and optimizer state are copied during the next step's forward and backward;
    // the rest (buffers that forward updates, positions, random states) before it starts.
    store_->save_async(position.step, state,
                       OptimizerSteppedMemory(run_.strategy->optimizer_stepped_tensors()),
                       run_.optimizer_step_gate);
  } else {
    last_checkpoint_ = store_->save(position.step, state);
  }
  last_save_ = Clock::now();
}

void Checkpointing::commit_pending() {
  if (store_->has_pending()) last_checkpoint_ = store_->commit_pending();
}

}  // namespace trainyard
