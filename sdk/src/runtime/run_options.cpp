#include "run_options.hpp"

#include "stop_signals.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/loader.hpp"

namespace trainyard {

RunOptions RunOptions::read(const Recipe& recipe) {
  const Config run = recipe.section("run");
  RunOptions options;
  options.seed = static_cast<std::uint64_t>(run.get_int("seed"));
  options.epochs = run.get_int("epochs");
  options.max_steps = run.get_int("max_steps");
  options.device = run.get_string("device");
  options.threads = run.get_int("threads");
  options.cpu_binding = parse_cpu_binding(run.get_string("cpu_binding"), "run.cpu_binding");
  options.log_every = run.get_int("log_every");
  options.eval = run.get_bool("eval");
  options.eval_max_batches = run.get_int("eval_max_batches");
  options.grad_accumulation = run.get_int("grad_accumulation");
  options.max_grad_norm = run.get_float("max_grad_norm");
  options.grad_norm_blocks = run.get_bool("grad_norm_blocks");
  options.memory_limit_gib = run.get_float("memory_limit");
  options.track_memory = run.get_bool("track_memory") || options.memory_limit_gib > 0;
  options.on_nonfinite = run.get_string("on_nonfinite");
  options.max_nonfinite_in_a_row = run.get_int("max_nonfinite_in_a_row");
  const Config spike = run.get_table("spike");
  options.spike.factor = spike.get_float("factor");
  options.spike.window = spike.get_int("window");
  options.spike.rollback = spike.get_string("action") == "rollback";
  options.skip_batches = run.get_string_list("skip_batches");
  options.max_rollbacks = run.get_int("max_rollbacks");
  options.profile_steps = run.get_int_list("profile_steps");
  try {
    options.activation_checkpointing =
        ActivationCheckpointing::parse(run.get_string("activation_checkpointing"));
  } catch (const Error& error) {
    run.fail("activation_checkpointing", error.what());
  }
  options.output_dir = run.get_string("output_dir").empty()
                           ? std::filesystem::path("runs") / recipe.name()
                           : run.get_path("output_dir");
  if (!run.get_string("final_model_file").empty()) {
    options.final_model_file = run.get_path("final_model_file");
  }
  if (!run.get_string("initial_model_file").empty()) {
    options.initial_model_file = run.get_path("initial_model_file");
  }
  if (!run.get_string("step_record_file").empty()) {
    options.step_record_file = run.get_path("step_record_file");
  }
  options.peak_tflops = run.get_float("peak_tflops");
  for (const auto& name : run.get_string_list("stop_signals")) {
    try {
      options.stop_signals.push_back(stop_signal_number(name));
    } catch (const Error& error) {
      run.fail("stop_signals", error.what());
    }
  }
  options.section = run;
  return options;
}

LoaderSettings LoaderSettings::read(const Recipe& recipe) {
  const Config loader = recipe.section("loader");
  LoaderSettings settings;
  settings.batch_size = loader.get_int("batch_size");
  settings.eval_batch_size = loader.get_int("eval_batch_size");
  settings.workers = loader.get_int("workers");
  settings.eval_workers = loader.get_int("eval_workers");
  settings.prefetch = loader.get_int("prefetch");
  settings.shuffle = loader.get_bool("shuffle");
  settings.drop_last = loader.get_bool("drop_last");
  settings.train_split = loader.get_string("train_split");
  settings.eval_split = loader.get_string("eval_split");
  settings.section = loader;
  return settings;
}

int LoaderSettings::worker_count(unsigned cores, int local_ranks) const {
  if (workers == -1) return default_loader_workers(cores, local_ranks);
  return static_cast<int>(workers);
}

std::int64_t LoaderSettings::evaluation_batch_size() const {
  return eval_batch_size > 0 ? eval_batch_size : 4 * batch_size;
}

}  // namespace trainyard
