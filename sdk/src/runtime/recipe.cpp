#include "trainyard/runtime/recipe.hpp"

#include "skipped_batches.hpp"

#include <algorithm>
#include <set>

#include "stop_signals.hpp"
#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/default_plugins.hpp"

namespace trainyard {

namespace fs = std::filesystem;

namespace {

const std::set<std::string>& top_level_keys() {
  static const std::set<std::string> keys = {"name", "plugin_paths"};
  return keys;
}

Config require_table(const Table& root, const std::string& name) {
  const Value* value = root.find(name);
  if (!value) {
    auto empty = std::make_shared<Table>();
    empty->where = root.where;
    return Config(empty, name);
  }
  if (value->type() != ValueType::kTable) {
    throw Error(value->where().str() + ": " + name + " must be a table ([" + name + "])");
  }
  return Config(value->table_ptr(), name);
}

// Validates a plugin section against the runtime's keys for it plus the plugin's options.
// True for a value given on the command line (--set) rather than written in a recipe file.
bool from_command_line(const SourceLocation& where) { return where.line <= 0; }

// A --set X.plugin=... that switches plugins leaves the file's options of the old plugin behind;
// those the new plugin does not declare are dropped, with a note. Options given with --set stay,
// so a mistyped one is still an error.
Config drop_options_of_replaced_plugin(const Config& section, const std::string& plugin,
                                       const OptionSpecs& specs, std::vector<std::string>& notes) {
  const Value* written = section.table().find("plugin");
  if (!written || !from_command_line(written->where())) return section;
  auto kept = std::make_shared<Table>(section.table());
  for (const auto& [key, value] : section.table().entries()) {
    bool declared = key == "plugin" || std::any_of(specs.begin(), specs.end(), [&](const auto& s) {
                      return s.name == key;
                    });
    if (declared || from_command_line(value.where())) continue;
    kept->erase(key);
    notes.push_back(section.table().key_where(key).str() + ": " + section.qualified(key) +
                    " dropped: " + written->where().file + " names a " + plugin +
                    " without that option");
  }
  return Config(kept, section.name());
}

Config resolve_plugin_section(const Config& section, const std::string& kind,
                              const std::string& default_plugin, const OptionSpecs& runtime_specs,
                              const Registry& registry, std::vector<std::string>& notes) {
  std::string plugin = default_plugin;
  if (section.has("plugin")) {
    const Value& value = section.value("plugin");
    if (value.type() != ValueType::kString) {
      section.fail("plugin", "must be a string (a plugin name)");
    }
    plugin = value.as_string();
  }
  if (plugin.empty()) {
    throw Error(section.table().where.str() + ": [" + section.name() +
                "] needs plugin = \"...\" (known: " +
                [&] {
                  std::string known;
                  for (const auto& n : registry.names(kind))
                    known += (known.empty() ? "" : ", ") + n;
                  return known.empty() ? std::string("none loaded") : known;
                }() +
                ")");
  }
  if (!registry.contains(kind, plugin)) {
    try {
      registry.info(kind, plugin);
    } catch (const Error& error) {
      const Value* value = section.table().find("plugin");
      throw Error((value ? value->where() : section.table().where).str() + ": " + error.what());
    }
  }
  OptionSpecs specs = runtime_specs;
  for (const auto& spec : registry.info(kind, plugin).options) {
    bool clash = std::any_of(specs.begin(), specs.end(),
                             [&](const OptionSpec& s) { return s.name == spec.name; });
    if (!clash) specs.push_back(spec);
  }
  Config resolved =
      validate_section(drop_options_of_replaced_plugin(section, plugin, specs, notes), specs);
  auto table = std::make_shared<Table>();
  table->where = resolved.table().where;
  const Value* written = section.table().find("plugin");
  table->set("plugin", written ? *written : Value(plugin));
  for (const auto& [key, value] : resolved.table().entries()) {
    if (key != "plugin") table->set(key, value);
  }
  return Config(table, section.name());
}

}  // namespace

Config Recipe::section(const std::string& name) const { return require_table(*root, name); }

bool Recipe::has_section(const std::string& name) const { return root->contains(name); }

std::string Recipe::name() const {
  if (const Value* value = root->find("name"); value && value->type() == ValueType::kString) {
    return value->as_string();
  }
  return path.stem().string();
}


const OptionSpecs& run_options() {
  static const OptionSpecs specs = {
      option("seed", 0, "seed of every random stream (parameters, shuffling, dropout)"),
      option("epochs", 1, "passes over the training split").at_least(1),
      option("max_steps", 0, "stop after this many optimizer steps (0: run every epoch)"),
      option("device", default_plugins::kDevice,
             "a device plugin's name, with :N for its N-th device (cpu, an accelerator), or auto "
             "(the available device its plugin ranks highest)"),
      option("threads", 0, "intra-op threads (0: the cores divided among local ranks)").at_least(0),
      option("cpu_binding", "auto",
             "bind each local rank to its own CPUs, threads wide: auto (when the machine's ranks "
             "fill its CPUs exactly), cores (always) or none")
          .one_of({"auto", "cores", "none"}),
      option("log_every", 50, "optimizer steps between metric records").at_least(1),
      option("eval", true, "evaluate on the test split after each epoch"),
      option("eval_max_batches", 0, "evaluate on at most this many batches (0: all)"),
      option("grad_accumulation", 1, "micro-batches per optimizer step").at_least(1),
      option("max_grad_norm", 0.0, "clip gradients to this global norm (0: no clipping)")
          .at_least(0),
      option("grad_norm_blocks", false,
             "also log each block's gradient norm (before clipping) every record: grad_norm/<block>, "
             "the same on every strategy as in one process"),
      option("track_memory", false,
             "count every allocation (the allocator's, not estimates): the summary gives the "
             "steps' peak and its phase, the bytes at a step's start and the activations, the "
             "figures `trainyard plan` predicts"),
      option("memory_limit", 0.0,
             "GiB of host memory the run's model, gradients, optimizer state and steps may "
             "hold (counted as track_memory counts, 0: no limit): an allocation past it stops "
             "the run with a report of what was held and the changes `trainyard plan` computes "
             "would fit, as a device that runs out of memory does")
          .at_least(0),
      option("on_nonfinite", "stop",
             "a step whose gradients hold inf or nan never steps the optimizer; then: stop "
             "(exit naming the step, the parameter and the batch), skip (count it and train on) "
             "or rollback (reload the last checkpoint, never to train on the step's batches). "
             "fp16 skips by its loss scale instead")
          .one_of({"stop", "skip", "rollback"}),
      option("max_nonfinite_in_a_row", 5,
             "with on_nonfinite = skip, stop after this many non-finite steps in a row")
          .at_least(1),
      table_option("spike",
                   "loss spike guard: {factor, window, action}; a step's loss above factor x the "
                   "median of the last window steps stops the run or rolls it back (spike_options)"),
      option("max_rollbacks", 3,
             "rollbacks (run.spike, on_nonfinite) to one checkpoint before the run stops: the "
             "trouble is then not in single batches")
          .at_least(1),
      option("profile_steps", std::vector<std::int64_t>{},
             "[FIRST, LAST]: record every op of steps FIRST..LAST (counted from 1) with the Kineto "
             "profiler into <output_dir>/profile.rank<R>.json, a Chrome trace ([]: none)"),
      option("skip_batches", std::vector<std::string>{},
             "loader batches never trained on, as EPOCH:BATCH (the batch's index within its "
             "epoch), as a spike rollback reports them"),
      option("activation_checkpointing", "none",
             "blocks recomputed in backward: none, all, every:K, blocks:NAME,NAME..."),
      option("output_dir", "", "where the run writes (default: runs/<recipe name>)"),
      option("peak_tflops", 0.0,
             "the device's peak TFLOP/s per rank for model FLOPs utilisation (0: measured by a "
             "short matmul probe at start, when the model reports its FLOPs)")
          .at_least(0),
      option("stop_signals", std::vector<std::string>{"SIGTERM", "SIGUSR1"},
             "signals that stop the run at the next step boundary with a checkpoint (the ranks "
             "agree on the step), ending it with status 128 + the signal"),
      option("final_model_file", "",
             "rank 0 writes the model's parameters and buffers here at the end (a pickled dict)"),
      option("initial_model_file", "",
             "rank 0 writes the model's parameters and buffers here before the first step (a "
             "pickled dict, as final_model_file)"),
      option("step_record_file", "",
             "rank 0 writes one JSON line per optimizer step here: its learning rate, loss and "
             "the sample indices of each micro-batch (tools/parity/replay.py replays them)"),
  };
  return specs;
}

const OptionSpecs& spike_options() {
  static const OptionSpecs specs = {
      option("factor", 0.0, "a loss above factor x the window's median is a spike (0: off)")
          .at_least(0),
      option("window", 50, "steps whose losses' median is the yardstick").at_least(1),
      option("action", "rollback",
             "rollback (reload the last checkpoint and never train on the spike's batches "
             "again) or stop")
          .one_of({"rollback", "stop"}),
  };
  return specs;
}

const OptionSpecs& loader_options() {
  static const OptionSpecs specs = {
      option("batch_size", 64, "samples per micro-batch on each rank").at_least(1),
      option("eval_batch_size", 0, "samples per evaluation batch (0: 4 x batch_size)"),
      option("workers", -1,
             "loader threads (-1: chosen from the preparation and step times of the first steps)")
          .at_least(0)
          .or_exactly(-1, "for automatic"),
      option("eval_workers", -1,
             "evaluation loader threads (-1: as many as the training loader uses then)")
          .at_least(0)
          .or_exactly(-1, "for the training loader's"),
      option("prefetch", 2, "batches each worker prepares ahead").at_least(1),
      option("shuffle", true, "reshuffle the training split every epoch"),
      option("drop_last", true, "drop the last incomplete training batch"),
      option("train_split", "train", "the split trained on"),
      option("eval_split", "test", "the split evaluated on"),
  };
  return specs;
}

const OptionSpecs& checkpoint_policy_options() {
  static const OptionSpecs specs = {
      option("every_steps", 0, "save every this many optimizer steps (0: only at the end)")
          .at_least(0),
      option("every_seconds", 0.0,
             "also save when this many seconds have passed since the last save (0: never), "
             "checked every log_every steps")
          .at_least(0),
      option("async", false,
             "copy the state to host memory and write it on a background thread; the step "
             "waits only for the copy"),
      option("at_end", true, "save when the run ends"),
      option("keep", 3, "checkpoints kept (older ones are deleted; 0 keeps all)").at_least(0),
      option("dir", "", "checkpoint folder (default: <output_dir>/checkpoints)"),
  };
  return specs;
}

const OptionSpecs& comm_options() {
  static const OptionSpecs specs = {
      option("timeout_s", 300,
             "seconds a collective or the rendezvous may take before the job "
             "fails, naming the rank that stopped")
          .at_least(1),
      option("emulated_bandwidth_mb_s", 0.0,
             "for benchmarks and tests: every collective of the run takes at least the time its "
             "bytes would take over a link of this many MB/s per rank (0: the machine's speed)")
          .at_least(0),
      option("flight_recorder", 2000,
             "collectives each rank keeps in its flight recorder, written to "
             "<output_dir>/flight/ on a hang, a failure or SIGUSR2 for `trainyard diagnose` "
             "(0: none)")
          .at_least(0),
      option("debug", "off",
             "\"detail\": before each collective its group's ranks check that they run the same "
             "operation on the same dtype and shapes, and refuse it naming each rank's")
          .one_of({"off", "detail"}),
  };
  return specs;
}

const OptionSpecs& parallel_options() {
  // A mesh dimension: a size, or -1 to take what the others leave of the world.
  auto dimension = [](const char* name, int default_size, const char* help) {
    return option(name, default_size, help)
        .at_least(1)
        .at_most(1 << 20)
        .or_exactly(-1, "to fill the world");
  };
  static const OptionSpecs specs = {
      dimension("pp", 1, "pipeline-parallel stages (outermost dimension of the mesh)"),
      dimension("dp_replicate", 1, "data-parallel replicas (ddp; with fsdp, replicas of shards)"),
      dimension("dp_shard", -1, "data-parallel ranks sharding state (-1: what the others leave)"),
      dimension("tp", 1, "tensor-parallel ranks (innermost dimension: neighbouring ranks)"),
  };
  return specs;
}

MeshRequest mesh_request(const Config& section) {
  const Config parallel = validate_section(section, parallel_options(), {});
  auto size = [&](const char* key) { return static_cast<int>(parallel.get_int(key)); };
  // dp_shard fills the world by default; a dimension written as -1 takes that role instead.
  auto written = [&](const char* key) { return parallel.value(key).where().line > 0; };
  const char* filled = nullptr;
  for (const char* key : {"pp", "dp_replicate", "tp", "dp_shard"}) {
    if (size(key) != -1) continue;
    if (filled && std::string(key) == "dp_shard" && !written(key)) continue;
    if (filled) {
      parallel.fail(key, std::string("is -1, but so is parallel.") + filled +
                             "; only one dimension may fill the world");
    }
    filled = key;
  }
  MeshRequest request;
  request.pp = size("pp");
  request.dp_replicate = size("dp_replicate");
  request.tp = size("tp");
  request.dp_shard = size("dp_shard");
  if (request.dp_shard == -1 && filled && std::string(filled) != "dp_shard") request.dp_shard = 1;
  return request;
}

Config plugin_options(const Config& section, const OptionSpecs& runtime) {
  auto table = std::make_shared<Table>(section.table());
  for (const auto& spec : runtime) table->erase(spec.name);
  return Config(table, section.name());
}

const OptionSpecs& sink_common_options() {
  static const OptionSpecs specs = {
      option("enabled", true, "write to this sink"),
  };
  return specs;
}

const std::vector<PluginSection>& plugin_sections() {
  static const std::vector<PluginSection> sections = {
      {"dataset", "dataset", "", false},
      {"model", "model", "", false},
      {"optimizer", "optimizer", "", false},
      {"scheduler", "scheduler", default_plugins::kScheduler, true},
      {"precision", "precision", default_plugins::kPrecision, true},
      {"strategy", "strategy", default_plugins::kStrategy, true},
      {"checkpoint", "checkpoint", default_plugins::kCheckpoint, true},
      {"comm", "comm", "", true},
      {"compression", "compression", "", true},
  };
  return sections;
}

namespace {

// A recipe key that names nothing is an error rather than ignored: a mistyped section would
// otherwise leave the run on defaults without a word.
void check_top_level_keys(const Table& root) {
  std::set<std::string> known = top_level_keys();
  known.insert({"run", "loader", "parallel", "sinks"});
  for (const auto& section : plugin_sections()) known.insert(section.section);
  for (const auto& [key, value] : root.entries()) {
    if (!known.count(key)) {
      std::string names;
      for (const auto& name : known) names += (names.empty() ? "" : ", ") + name;
      throw Error(root.key_where(key).str() + ": unknown recipe section '" + key +
                  "' (known: " + names + ")");
    }
  }
}

// The values at the top of the recipe that are not sections, checked for their type.
void copy_top_level_values(const Table& root, Table& out) {
  if (const Value* name = root.find("name")) {
    if (name->type() != ValueType::kString)
      throw Error(name->where().str() + ": name must be a string");
    out.set("name", *name);
  }
  if (const Value* paths = root.find("plugin_paths")) {
    if (!value_matches(*paths, OptionType::kStringList)) {
      throw Error(paths->where().str() + ": plugin_paths must be an array of strings");
    }
    out.set("plugin_paths", *paths);
  }
}

void put_section(Table& out, const std::string& name, const Config& config) {
  out.set(name, Value(config.table_ptr(), config.table().where));
}

// Parses the run options whose values are small languages of their own, so that a mistake in one
// fails here, at its place in the recipe, rather than once the run has started.
Config resolve_run_section(const Table& root) {
  Config run = validate_section(require_table(root, "run"), run_options(), {});
  // The spike guard's table, checked and completed in place.
  auto completed = std::make_shared<Table>(run.table());
  const Config spike = validate_section(run.get_table("spike"), spike_options(), {});
  completed->set("spike", Value(spike.table_ptr(), run.table().at("spike").where()));
  run = Config(completed, run.name());
  try {
    ActivationCheckpointing::parse(run.get_string("activation_checkpointing"));
  } catch (const Error& error) {
    run.fail("activation_checkpointing", error.what());
  }
  try {
    SkippedBatches().add_entries(run.get_string_list("skip_batches"));
  } catch (const Error& error) {
    run.fail("skip_batches", error.what());
  }
  if (const auto steps = run.get_int_list("profile_steps");
      !steps.empty() && (steps.size() != 2 || steps[0] < 1 || steps[1] < steps[0])) {
    run.fail("profile_steps", "must be [FIRST, LAST] with 1 <= FIRST <= LAST");
  }
  for (const auto& name : run.get_string_list("stop_signals")) {
    try {
      stop_signal_number(name);
    } catch (const Error& error) {
      run.fail("stop_signals", error.what());
    }
  }
  return run;
}

Config resolve_parallel_section(const Table& root) {
  Config parallel = validate_section(require_table(root, "parallel"), parallel_options(), {});
  mesh_request(parallel);  // every check but the world size's, which the run makes
  return parallel;
}

std::string known_plugins(const Registry& registry, const std::string& kind) {
  std::string list;
  for (const auto& n : registry.names(kind)) {
    list += (list.empty() ? "" : ", ") + n;
  }
  return list.empty() ? std::string("none loaded") : list;
}

// A section the recipe leaves out takes its default plugin, except [checkpoint]: without it the
// run saves nothing.
void resolve_missing_plugin_section(const Recipe& recipe, const PluginSection& section,
                                    const Registry& registry, Table& out,
                                    std::vector<std::string>& notes) {
  if (!section.default_plugin.empty() && section.section != "checkpoint") {
    auto empty = std::make_shared<Table>();
    empty->where = recipe.root->where;
    put_section(out, section.section,
                resolve_plugin_section(Config(empty, section.section), section.kind,
                                       section.default_plugin, {}, registry, notes));
  } else if (!section.optional) {
    throw Error(recipe.path.string() + ": missing section [" + section.section +
                "] (plugin = one of: " + known_plugins(registry, section.kind) + ")");
  }
}

void resolve_plugin_sections(const Recipe& recipe, const Registry& registry, Table& out,
                             std::vector<std::string>& notes) {
  const Table& root = *recipe.root;
  for (const auto& section : plugin_sections()) {
    if (!root.contains(section.section)) {
      resolve_missing_plugin_section(recipe, section, registry, out, notes);
      continue;
    }
    if (section.section == "comm" && !require_table(root, "comm").has("plugin")) {
      // No plugin named: the engine takes the device backend's default communicator.
      put_section(out, "comm", validate_section(require_table(root, "comm"), comm_options(), {}));
      continue;
    }
    const OptionSpecs& runtime = section.section == "checkpoint" ? checkpoint_policy_options()
                                 : section.section == "comm"     ? comm_options()
                                                                 : OptionSpecs{};
    put_section(out, section.section,
                resolve_plugin_section(require_table(root, section.section), section.kind,
                                       section.default_plugin, runtime, registry, notes));
  }
}

// Sinks: [sinks.<name>], each naming its plugin (default: its own name). Console by default.
Value resolve_sinks(const Table& root, const Registry& registry, std::vector<std::string>& notes) {
  auto sinks = std::make_shared<Table>();
  Config sink_tables = require_table(root, "sinks");
  sinks->where = sink_tables.table().where;
  if (!root.contains("sinks")) {
    auto console = std::make_shared<Table>();
    console->where = root.where;
    sinks->set(default_plugins::kSink, Value(std::shared_ptr<const Table>(console)));
  } else {
    for (const auto& [key, value] : sink_tables.table().entries()) {
      if (value.type() != ValueType::kTable) {
        throw Error(value.where().str() + ": sinks." + key + " must be a table ([sinks." + key +
                    "])");
      }
    }
  }
  for (const auto& [key, value] :
       (root.contains("sinks") ? sink_tables.table() : *sinks).entries()) {
    Config section(value.table_ptr(), "sinks." + key);
    Config resolved =
        resolve_plugin_section(section, "sink", key, sink_common_options(), registry, notes);
    sinks->set(key, Value(resolved.table_ptr(), value.where()));
  }
  return Value(std::shared_ptr<const Table>(sinks), sinks->where);
}

}  // namespace

Recipe resolve_recipe(const Recipe& recipe, const Registry& registry) {
  const Table& root = *recipe.root;
  auto out = std::make_shared<Table>();
  out->where = root.where;
  std::vector<std::string> notes;
  check_top_level_keys(root);
  copy_top_level_values(root, *out);
  put_section(*out, "run", resolve_run_section(root));
  put_section(*out, "loader",
              validate_section(require_table(root, "loader"), loader_options(), {}));
  put_section(*out, "parallel", resolve_parallel_section(root));
  resolve_plugin_sections(recipe, registry, *out, notes);
  out->set("sinks", resolve_sinks(root, registry, notes));
  return Recipe{out, recipe.path, std::move(notes)};
}

std::vector<fs::path> recipe_plugin_paths(const Recipe& recipe) {
  std::vector<fs::path> out;
  const Value* paths = recipe.root->find("plugin_paths");
  if (!paths) return out;
  if (!value_matches(*paths, OptionType::kStringList)) {
    throw Error(paths->where().str() + ": plugin_paths must be an array of strings");
  }
  for (const auto& item : paths->as_array()) {
    fs::path path = item.as_string();
    if (path.is_relative()) {
      fs::path base =
          item.where().line > 0 ? fs::path(item.where().file).parent_path() : fs::current_path();
      path = base / path;
    }
    out.push_back(fs::absolute(path));
  }
  return out;
}

}  // namespace trainyard
