// The trainyard binary: parses the command line, loads plugins from explicit places, resolves
// the recipe and hands over to the engine.

#include <malloc.h>

#include <boost/program_options.hpp>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_command.hpp"
#include "cli.hpp"
#include "compare.hpp"
#include "diagnose_command.hpp"
#include "doctor.hpp"
#include "launch.hpp"
#include "link_probe.hpp"
#include "memory_advice.hpp"
#include "plan_check.hpp"
#include "plan_command.hpp"
#include "schedule_command.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/api/version.hpp"
#include "trainyard/runtime/crash_report.hpp"
#include "trainyard/runtime/engine.hpp"
#include "trainyard/runtime/memory_exhausted.hpp"
#include "trainyard/runtime/model_check.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trainyard {
namespace {

const char* kTopUsage = R"(usage: trainyard <command> [options]

commands:
  run RECIPE        train from a recipe
  launch RECIPE     train with several processes (see trainyard launch --help)
  compare RECIPE... --vary section.key=v1,v2
                    run variants side by side: a table and an HTML report
  validate RECIPE   check a recipe, its mesh for --nproc N processes and its model built on the
                    meta device as a rank of that mesh would build it; silent on success
  plugins [KIND]    list the loaded plugins, their options and defaults
  doctor [RECIPE]   check LibTorch, threads, plugins, devices (and what RECIPE needs)
  checkpoint inspect PATH
                    a checkpoint's contents, step, sizes and checksum status
  checkpoint export PATH --format safetensors --out FILE
                    the model's weights as one file other tools read
  plan RECIPE [--nproc N]
                    each rank's memory before the run: parameters, gradients, optimizer
                    state, activations and the step's peak with its phase
  schedule NAME --stages P --micro-batches M [--virtual-stages V]
                    a pipeline schedule's timeline per rank and its idle share
                    (gpipe, 1f1b, interleaved_1f1b, zero_bubble, zero_bubble_v)
  diagnose DIR      which rank and collective a hung or failed multi-process run stopped at,
                    from the flight records its ranks wrote

Run 'trainyard <command> --help' for a command's options.
Plugins are loaded from the install's plugin folder, TRAINYARD_PLUGIN_PATH (colon-separated),
--plugin-path and the recipe's plugin_paths, never from the current directory.
)";

std::string first_line(const std::string& text);

// A run that ran out of memory: the error, what was held, and the changes the planner predicts
// would fit under the limit (or under what the device held when it ran out).
void report_shortage(const MemoryExhausted& exhausted, const std::string& recipe_path,
                     const std::vector<std::string>& overrides, const Registry& registry) {
  std::cerr << "trainyard: error: " << exhausted.what() << std::endl;
  const MemoryShortage& shortage = exhausted.shortage();
  const int nproc = launched_world_size();
  const std::int64_t cap = shortage.limit_bytes > 0 ? shortage.limit_bytes : shortage.live_bytes;
  try {
    const MemoryAdvice advice = advise_memory(recipe_path, overrides, nproc, cap, registry);
    for (const auto& line : describe_shortage(shortage, advice)) {
      std::cerr << "trainyard: " << line << std::endl;
    }
  } catch (const std::exception& error) {
    std::cerr << "trainyard: the planner cannot suggest a change: " << first_line(error.what())
              << std::endl;
  }
}

int command_run(const std::vector<std::string>& args, bool validate_only, Registry& registry) {
  CommonOptions common;
  std::string recipe_path;
  std::vector<std::string> overrides;
  std::optional<std::string> resume;
  bool print_config = false;
  int nproc = 0;
  po::options_description options(validate_only ? "validate options" : "run options");
  options.add_options()("recipe", po::value(&recipe_path)->required(), "recipe file")(
      "set", po::value(&overrides)->composing(),
      "override a recipe value: section.key=value (section.key=! removes the key)")(
      "print-config", po::bool_switch(&print_config),
      "print the resolved recipe with every default filled in");
  if (!validate_only) {
    options.add_options()("resume", po::value<std::string>(),
                          "resume from a checkpoint folder, or 'auto' for the newest valid one");
  } else {
    options.add_options()("nproc", po::value(&nproc),
                          "the processes the run will have (default: the product of the "
                          "[parallel] sizes): the mesh is resolved and the model built for it");
  }
  add_common(options, common);
  po::positional_options_description positional;
  positional.add("recipe", 1);
  auto values = parse(args, options, positional,
                      validate_only ? "usage: trainyard validate RECIPE [options]"
                                    : "usage: trainyard run RECIPE [options]");
  if (!values) return 0;
  if (values->count("resume")) resume = (*values)["resume"].as<std::string>();

  Recipe recipe = load_recipe(recipe_path, overrides);
  PluginLoader loader(registry);
  load_plugins(loader, common, recipe_plugin_paths(recipe));
  Recipe resolved = resolve_recipe(recipe, registry);
  for (const auto& note : resolved.notes) std::cerr << "trainyard: note: " << note << "\n";
  if (print_config) {
    std::cout << to_toml(*resolved.root);
    return 0;
  }
  if (validate_only) {
    check_layout_builds(resolved, registry, nproc);
    return 0;
  }
  RunControls controls;
  controls.resume = resume;
  // A run that measures its memory checks it against the plan.
  std::optional<PlannedMemory> plan;
  if (resolved.section("run").get_bool("track_memory") ||
      resolved.section("run").get_float("memory_limit") > 0) {
    plan = plan_this_rank(recipe_path, overrides, registry,
                          [](const std::string& line) { std::cerr << line << std::endl; });
  }
  RunSummary summary;
  try {
    Engine engine(resolved, registry, controls);
    summary = engine.run();
  } catch (const MemoryExhausted& exhausted) {
    // The engine is gone, and with it the memory limit: the planner may allocate.
    report_shortage(exhausted, recipe_path, overrides, registry);
    return 1;
  }
  if (plan && summary.memory) {
    for (const auto& line : compare_plan(*plan, *summary.memory)) {
      std::cerr << "trainyard: " << line << std::endl;
    }
  }
  // The shell's convention for a process ended by a signal, which schedulers (Slurm's requeue)
  // and `trainyard launch` read as "stopped, not failed".
  if (summary.stopped_by_signal != 0) return 128 + summary.stopped_by_signal;
  return 0;
}

int command_plugins(const std::vector<std::string>& args, Registry& registry) {
  CommonOptions common;
  std::string kind;
  po::options_description options("plugins options");
  options.add_options()("kind", po::value(&kind), "only this kind (dataset, model, ...)");
  add_common(options, common);
  po::positional_options_description positional;
  positional.add("kind", 1);
  auto values = parse(args, options, positional, "usage: trainyard plugins [KIND] [options]");
  if (!values) return 0;

  PluginLoader loader(registry);
  load_plugins(loader, common, {});
  auto components = registry.list(kind);
  if (components.empty()) {
    throw Error(kind.empty() ? "no plugins loaded" : "no " + kind + " plugins loaded");
  }
  for (const auto& info : components) {
    std::cout << info.kind << " " << info.name << "  (" << info.plugin << " " << info.plugin_version
              << ", " << (info.library_path.empty() ? "built in" : info.library_path) << ")\n";
    if (!info.help.empty()) std::cout << "    " << info.help << "\n";
    for (const auto& option : info.options) {
      std::cout << "    " << option.name << " : " << to_string(option.type) << " = "
                << (option.default_value ? option.default_value->to_toml() : "(required)")
                << "    " << option.help;
      if (const std::string rule = option.rule(); !rule.empty()) {
        std::cout << " [" << rule << "]";
      }
      std::cout << "\n";
    }
  }
  return 0;
}

int dispatch(int argc, char** argv, Registry& registry) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kTopUsage;
    return args.empty() ? kUsageError : 0;
  }
  if (args[0] == "--version") {
    std::cout << "trainyard " << kFrameworkVersion << " (" << kBuildTag << ", plugin ABI "
              << kAbiVersion << ")\n";
    return 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "run") return command_run(args, false, registry);
  if (command == "validate") return command_run(args, true, registry);
  if (command == "plugins") return command_plugins(args, registry);
  if (command == "checkpoint") return command_checkpoint(args, registry);
  if (command == "doctor") return command_doctor(args, registry);
  if (command == "launch") return command_launch(args);
  if (command == "compare") return command_compare(args, registry);
  if (command == "schedule") return command_schedule(args);
  if (command == "plan") return command_plan(args, registry);
  if (command == "diagnose") return command_diagnose(args);
  if (command == "link-probe") return command_link_probe(args, registry);  // started by plan
  std::cerr << "trainyard: unknown command '" << command << "'\n" << kTopUsage;
  return kUsageError;
}

// For a host built without tcmalloc (TRAINYARD_TCMALLOC=OFF), or glibc's malloc preloaded: a
// training step allocates and frees the same few-megabyte activations every time. glibc serves
// blocks above its mmap threshold (128 KiB, raised only after a large block is freed) with a
// fresh mmap each time, so every step pays page faults for them: a CPU run measured 20% slower
// than the same run after a large allocation had happened to raise the threshold. Fixed
// thresholds keep those blocks in the heap for reuse. tcmalloc ignores mallopt. An explicit
// MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is left alone.
void keep_step_allocations_in_the_heap() {
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 64 << 20);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

// c10 errors carry a C++ backtrace after the first line; the user needs the first line.
std::string first_line(const std::string& text) {
  auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  using namespace trainyard;
  keep_step_allocations_in_the_heap();
  // A rank started by a launcher says which one it is when it crashes.
  const char* rank = std::getenv("RANK");
  install_crash_report(rank ? ("trainyard rank " + std::string(rank)).c_str() : "trainyard");
  // The registry holds the plugin libraries; it outlives the handlers below, so an exception
  // thrown by plugin code is reported while that code is still loaded.
  Registry registry;
  try {
    return dispatch(argc, argv, registry);
  } catch (const po::error& error) {
    std::cerr << "trainyard: " << error.what() << " (see --help)" << std::endl;
    return kUsageError;
  } catch (const Error& error) {
    std::cerr << "trainyard: error: " << first_line(error.what()) << std::endl;
    return 1;
  } catch (const c10::Error& error) {
    std::cerr << "trainyard: error: " << first_line(error.what_without_backtrace()) << std::endl;
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "trainyard: error: " << first_line(error.what()) << std::endl;
    return 1;
  }
}
