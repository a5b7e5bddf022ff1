#include "plan_command.hpp"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "layout_plan.hpp"
#include "layout_search.hpp"
#include "memory_advice.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/byte_size.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace po = boost::program_options;

namespace trainyard {

namespace {

std::string format_mib_column(std::int64_t bytes) { return format_mib(bytes, 10); }

std::string fixed_ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%10.2f ms", seconds * 1e3);
  return text;
}

nlohmann::json memory_json(const PlannedMemory& plan) {
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& phase : plan.phases) phases[phase.phase] = phase.bytes;
  return {{"parameters", plan.parameters},
          {"gradients", plan.gradients},
          {"optimizer_state", plan.optimizer_state},
          {"frozen", plan.frozen},
          {"held_parameters", plan.held_parameters()},
          {"activations", plan.activations},
          {"gathered_forward", plan.gathered_forward},
          {"received", plan.received},
          {"forward_held", plan.forward_held},
          {"step_start", plan.step_start},
          {"peak", plan.peak.bytes},
          {"peak_phase", plan.peak.phase},
          {"step_seconds", plan.step_seconds()},
          {"compute_seconds", plan.compute_seconds},
          {"optimizer_seconds", plan.optimizer_seconds},
          {"communication_bytes", plan.communication_bytes},
          {"communication_calls", plan.communication_calls},
          {"communication_seconds", plan.communication_seconds},
          {"message_bytes", plan.message_bytes},
          {"phases", phases}};
}

// The plan of every rank alike, or the highest pipeline rank's, and each pipeline rank's.
nlohmann::json plan_json(const LayoutPlan& plan, int ranks) {
  nlohmann::json out = memory_json(plan.memory);
  out["layout"] = plan.described;
  out["ranks"] = ranks;
  if (!plan.pipeline_ranks.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& rank : plan.pipeline_ranks) stages.push_back(memory_json(rank));
    out["pipeline_ranks"] = stages;
  }
  if (plan.link.ranks > 0) {
    out["link"] = {{"latency_seconds", plan.link.latency_seconds},
                   {"seconds_per_byte", plan.link.seconds_per_byte},
                   {"reduce_latency_seconds", plan.link.reduce_latency_seconds},
                   {"reduce_seconds_per_byte", plan.link.reduce_seconds_per_byte},
                   {"message_latency_seconds", plan.link.message_latency_seconds},
                   {"message_seconds_per_byte", plan.link.message_seconds_per_byte},
                   {"ranks", plan.link.ranks}};
  }
  return out;
}

void print_plan(const PlannedMemory& plan, const std::string& layout, const std::string& who) {
  std::cout << "plan: " << layout << "; " << who << "\n"
            << "  parameters        " << format_mib_column(plan.parameters) << "\n"
            << "  gradients         " << format_mib_column(plan.gradients) << "\n"
            << "  optimizer state   " << format_mib_column(plan.optimizer_state) << "\n"
            << "  frozen, buffers   " << format_mib_column(plan.frozen) << "\n"
            << "  activations       " << format_mib_column(plan.activations)
            << "  (kept for backward, at most at once)\n"
            << "  gathered, forward " << format_mib_column(plan.gathered_forward)
            << "  (whole parameters a forward leaves gathered)\n"
            << "  received inputs   " << format_mib_column(plan.received)
            << "  (a pipeline stage's, kept in flight)\n"
            << "  at a step's start " << format_mib_column(plan.step_start) << "\n"
            << "  peak              " << format_mib_column(plan.peak.bytes) << "  in the "
            << plan.peak.phase << " phase\n  by phase:";
  for (const auto& phase : plan.phases)
    std::cout << " " << phase.phase << " " << format_mib_column(phase.bytes);
  std::cout << "\n  step time         " << fixed_ms(plan.step_seconds()) << "  (compute "
            << fixed_ms(plan.compute_seconds) << ", optimizer " << fixed_ms(plan.optimizer_seconds)
            << ", communication " << fixed_ms(plan.communication_seconds)
            << ")\n  communication     " << format_mib_column(plan.communication_bytes)
            << "  (moved per rank per step, in " << static_cast<long long>(plan.communication_calls)
            << " calls)\n";
}

// Under --memory: whether the plan's peak fits the cap, and if not the changes the planner
// predicts would fit (memory_advice.hpp). 0 when it fits as it stands.
int report_fit(const LayoutPlan& plan, const std::string& recipe,
               const std::vector<std::string>& overrides, int nproc, double memory_gib,
               const Registry& registry) {
  const auto cap = static_cast<std::int64_t>(memory_gib * (1LL << 30));
  if (plan.memory.peak.bytes <= cap) {
    std::cout << "fits: the peak, " << format_mib(plan.memory.peak.bytes) << ", is within "
              << format_mib(cap) << " a rank\n";
    return 0;
  }
  std::cout << "does not fit: the peak, " << format_mib(plan.memory.peak.bytes) << " in the "
            << plan.memory.peak.phase << " phase, is over " << format_mib(cap) << " a rank\n";
  const MemoryAdvice advice = advise_memory(recipe, overrides, nproc, cap, registry);
  for (const auto& line : describe_changes(advice)) std::cout << line << "\n";
  return 1;
}

}  // namespace

int command_plan(const std::vector<std::string>& args, Registry& registry) {
  CommonOptions common;
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc = 0;
  double memory_gib = 0;
  bool json = false;
  bool fit = false;
  po::options_description options("plan options");
  options.add_options()("recipe", po::value(&recipe_path)->required(), "recipe file")(
      "set", po::value(&overrides)->composing(), "override a recipe value: section.key=value")(
      "nproc", po::value(&nproc),
      "the processes the run will have (default: the product of the [parallel] sizes)")(
      "memory", po::value(&memory_gib),
      "GiB a rank may hold: says whether the plan fits, and if not the changes that would (exit "
      "status 1 when nothing fits as it stands)")(
      "fit", po::bool_switch(&fit),
      "with --memory: search the layouts the loaded strategies offer on --nproc processes "
      "(recomputing or not, the micro-batch split and accumulated) and print the fastest that "
      "fits, as --set arguments, with the runners-up")("json", po::bool_switch(&json),
                                                       "print the plan as JSON");
  add_common(options, common);
  po::positional_options_description positional;
  positional.add("recipe", 1);
  auto values = parse(args, options, positional, "usage: trainyard plan RECIPE [options]");
  if (!values) return 0;
  if (values->count("nproc") && nproc < 1) {
    throw Error("plan: --nproc must be at least 1 (got " + std::to_string(nproc) + ")");
  }
  if (values->count("memory") && !(memory_gib > 0)) {
    throw Error("plan: --memory must be a positive number of GiB");
  }

  if (fit && !(memory_gib > 0)) throw Error("plan: --fit needs --memory GiB, the cap per rank");
  const Recipe recipe = load_recipe(recipe_path, overrides);
  PluginLoader loader(registry);
  load_plugins(loader, common, recipe_plugin_paths(recipe));
  if (fit) {
    const auto cap = static_cast<std::int64_t>(memory_gib * (1LL << 30));
    return report_search(search_layouts(recipe_path, overrides, std::max(nproc, 1), cap, registry),
                         cap);
  }
  LayoutPlan plan = plan_layout(recipe_path, overrides, nproc, registry);
  time_communication(plan, registry);
  if (json) {
    std::cout << plan_json(plan, std::max(nproc, 1)).dump(2) << "\n";
  } else if (plan.pipeline_ranks.empty()) {
    print_plan(plan.memory, plan.described, "each rank holds");
  } else {
    for (std::size_t rank = 0; rank < plan.pipeline_ranks.size(); ++rank) {
      print_plan(plan.pipeline_ranks[rank], plan.described,
                 "pipeline rank " + std::to_string(rank) + " holds");
    }
  }
  if (!json && plan.link.ranks > 0) {
    char line[320];
    std::snprintf(line, sizeof line,
                  "communication timed over %s (a link of %d ranks): %.0f us a call, %.2f GB/s "
                  "per rank; all-reduces %.0f us a call, %.2f GB/s per rank; messages %.0f us, "
                  "%.2f GB/s",
                  plan.layout.comm_plugin.c_str(), plan.link.ranks, plan.link.latency_seconds * 1e6,
                  1e-9 / plan.link.seconds_per_byte, plan.link.reduce_latency_seconds * 1e6,
                  1e-9 / plan.link.reduce_seconds_per_byte, plan.link.message_latency_seconds * 1e6,
                  1e-9 / plan.link.message_seconds_per_byte);
    std::cout << line << " (" << (plan.link.cached ? "cached" : "measured now")
              << (plan.link.cache_file.empty() ? "" : ", " + plan.link.cache_file.string())
              << ")\n";
  }
  if (memory_gib > 0) return report_fit(plan, recipe_path, overrides, nproc, memory_gib, registry);
  return 0;
}

}  // namespace trainyard
