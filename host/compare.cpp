#include "compare.hpp"

#include <sys/wait.h>
#include <unistd.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "compare_baseline.hpp"
#include "compare_metrics.hpp"
#include "compare_report.hpp"
#include "compare_statistics.hpp"
#include "compare_variants.hpp"
#include "layout_plan.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/parallel/declared_schedule.hpp"
#include "trainyard/parallel/pipeline_timeline.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"
#include "trainyard/support/strict_json.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trainyard {
namespace {

const char* kUsage =
    R"(usage: trainyard compare RECIPE [RECIPE...] [--vary section.key=v1,v2,...]... [options]

Runs every variant (each recipe times the cartesian product of the --vary lists) one after
another with the same seed and data, then prints a side-by-side table (step time and its
phases, throughput, peak memory, final loss, eval metric, largest loss difference from the first
variant) and writes DIR/table.txt and DIR/report.html (loss curves, step time, throughput and
memory bars, pipeline schedules; self-contained). A variant that fails, or runs past --timeout,
is reported with its error; the others still run. Exit status 1 only when every variant failed.

--repeat K runs every variant K times, interleaved (A B C A B C ...), and gives each step time as
the median with its 95% interval, and each variant a verdict against the first ("1.08x faster
[1.05, 1.11]" or "no significant difference"). --vary 'parallel=dp_shard=4 | pp=2,tp=2' sweeps
whole layouts ('|' between layouts, ',' between a layout's keys; a key without a section is a
[parallel] key), each on the processes it needs. --save-baseline FILE keeps the results;
--against FILE exits 1 when a variant is significantly slower than there, or its losses differ.
)";

// Seconds a variant stopped at its --timeout gets between SIGTERM and SIGKILL: longer than the
// launcher's own grace period, so that it stops its ranks first.
constexpr int kStopGraceSeconds = 10;

// Whether the recipe (with the variant's overrides) already has an enabled sink of compare's
// metrics plugin (default_plugins::kMetricsSink) writing its default file into the run's folder:
// then compare reads that file rather than adding a second writer of it.
bool writes_default_metrics_file(const fs::path& recipe_path,
                                 const std::vector<std::string>& overrides) {
  try {
    Recipe recipe = load_recipe(recipe_path, overrides);
    const Value* sinks = recipe.root->find("sinks");
    if (!sinks || sinks->type() != ValueType::kTable) return false;
    for (const auto& [name, value] : sinks->as_table().entries()) {
      if (value.type() != ValueType::kTable) continue;
      const Table& sink = value.as_table();
      std::string plugin = name;
      if (const Value* p = sink.find("plugin"); p && p->type() == ValueType::kString) {
        plugin = p->as_string();
      }
      if (plugin != default_plugins::kMetricsSink) continue;
      if (const Value* e = sink.find("enabled");
          e && e->type() == ValueType::kBool && !e->as_bool()) {
        continue;
      }
      if (const Value* p = sink.find("path");
          p && !(p->type() == ValueType::kString && p->as_string().empty())) {
        continue;
      }
      return true;
    }
  } catch (const Error&) {
    // The child reports what is wrong with the recipe, as the variant's error.
  }
  return false;
}

struct ChildOutcome {
  int status = 0;  // as waitpid gives it
  double wall_s = 0;
  bool timed_out = false;
};

// Runs this binary with `args`, both output streams into `log`, and waits for it; after
// `timeout_s` seconds (0: no limit) it is stopped with SIGTERM, and SIGKILL if it lingers.
ChildOutcome run_child(const std::vector<std::string>& args, const fs::path& log,
                       std::int64_t timeout_s) {
  const auto started = std::chrono::steady_clock::now();
  std::cout.flush();
  std::cerr.flush();
  const pid_t pid = start_this_binary(args, log, "compare");
  ChildOutcome outcome;
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> stop_at, kill_at;
  if (timeout_s > 0) stop_at = started + std::chrono::seconds(timeout_s);
  for (;;) {
    const pid_t done = ::waitpid(pid, &outcome.status, stop_at ? WNOHANG : 0);
    if (done == pid) break;
    if (done < 0) {
      if (errno == EINTR) continue;
      throw Error(std::string("compare: waitpid failed: ") + std::strerror(errno));
    }
    const auto now = Clock::now();
    if (!outcome.timed_out && now >= *stop_at) {
      outcome.timed_out = true;
      ::kill(pid, SIGTERM);
      kill_at = now + std::chrono::seconds(kStopGraceSeconds);
    } else if (kill_at && now >= *kill_at) {
      ::kill(pid, SIGKILL);
      kill_at.reset();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  outcome.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return outcome;
}

std::vector<std::string> lines_of(const fs::path& file) {
  std::vector<std::string> lines;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The child's one-line error: its first "trainyard: error: ..." line (without a "[rank R] "
// prefix), else the launcher's account of the failed rank, else how it ended.
std::string error_of(const fs::path& log, int status) {
  const auto lines = lines_of(log);
  for (const char* marker :
       {"trainyard: error: ", "trainyard launch: failure: ", "trainyard launch: rank "}) {
    for (const auto& line : lines) {
      if (auto at = line.find(marker); at != std::string::npos) return line.substr(at);
    }
  }
  if (WIFSIGNALED(status)) {
    return std::string("trainyard: error: killed by signal ") + strsignal(WTERMSIG(status)) +
           " (see " + log.string() + ")";
  }
  return "trainyard: error: exited with status " +
         std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + " (see " + log.string() +
         ")";
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw Error("compare: cannot write " + path.string());
}

std::int64_t recipe_seed(const fs::path& recipe, const std::vector<std::string>& overrides) {
  Recipe loaded = load_recipe(recipe, overrides);
  const Value* run = loaded.root->find("run");
  if (!run || run->type() != ValueType::kTable) return 0;
  const Value* seed = run->as_table().find("seed");
  if (!seed || seed->type() != ValueType::kInteger) return 0;
  return seed->as_integer();
}

// What the command line asks for, checked, with the recipes loaded once so that a recipe that
// does not load fails before any variant runs.
struct CompareOptions {
  CommonOptions common;
  std::vector<fs::path> recipes;
  std::vector<VaryAxis> axes;
  std::vector<std::string> overrides;  // --set, applied to every variant
  std::int64_t steps = 0;              // 0: the recipes' own run.max_steps
  std::int64_t seed = 0;
  std::int64_t timeout_s = 0;  // 0: no limit
  int nproc = 1;
  bool nproc_given = false;
  int repeat = 1;  // runs of every variant, interleaved
  BootstrapSettings statistics;
  fs::path save_baseline;  // empty: none
  fs::path against;        // empty: none
  std::string title;       // the recipes' names, joined by "_vs_"
  fs::path report_dir;
};

// The options, checked; nullopt when --help was asked for (parse has printed the usage).
std::optional<CompareOptions> parse_compare_options(const std::vector<std::string>& args) {
  CompareOptions out;
  std::vector<std::string> recipe_names, varies;
  std::string output;
  po::options_description options("compare options");
  options.add_options()("recipe", po::value(&recipe_names)->multitoken(), "recipe files")(
      "vary", po::value(&varies)->composing(),
      "section.key=v1,v2,... : one axis of variants (repeatable; the variants are the cartesian "
      "product)")("set", po::value(&out.overrides)->composing(),
                  "override a recipe value in every variant: section.key=value")(
      "steps", po::value(&out.steps), "stop every variant after N optimizer steps (run.max_steps)")(
      "nproc", po::value(&out.nproc), "ranks per variant (> 1 runs 'trainyard launch')")(
      "seed", po::value(&out.seed), "seed of every variant (default: the first recipe's run.seed)")(
      "timeout", po::value(&out.timeout_s),
      "stop a variant still running after S seconds and report it as failed (default: none)")(
      "output", po::value(&output), "report folder (default: runs/compare/<recipe name>)")(
      "repeat", po::value(&out.repeat),
      "run every variant K times, interleaved; step times as medians with 95% intervals")(
      "noise-threshold", po::value(&out.statistics.noise_threshold),
      "a step-time difference under this share is never called one (default 0.02)")(
      "save-baseline", po::value(&out.save_baseline), "write the results to FILE (JSON)")(
      "against", po::value(&out.against),
      "check the results against a baseline FILE: exit 1 when a variant is significantly slower "
      "or its losses differ");
  add_common(options, out.common);
  po::positional_options_description positional;
  positional.add("recipe", -1);
  auto values = parse(args, options, positional, kUsage);
  if (!values) return std::nullopt;

  if (recipe_names.empty()) throw Error("compare: no recipe given (see --help)");
  if (values->count("steps") && out.steps < 1) throw Error("compare: --steps must be >= 1");
  if (out.nproc < 1) throw Error("compare: --nproc must be >= 1");
  out.nproc_given = values->count("nproc") != 0;
  if (out.repeat < 1) throw Error("compare: --repeat must be >= 1");
  if (!(out.statistics.noise_threshold >= 0 && out.statistics.noise_threshold < 1)) {
    throw Error("compare: --noise-threshold must be in [0, 1)");
  }
  if (out.timeout_s < 0) throw Error("compare: --timeout must be >= 0 seconds");
  for (const auto& text : varies) {
    VaryAxis axis = parse_vary(text);
    for (const auto& other : out.axes) {
      if (other.key == axis.key) throw Error("compare: --vary names '" + axis.key + "' twice");
    }
    out.axes.push_back(std::move(axis));
  }
  out.recipes.assign(recipe_names.begin(), recipe_names.end());
  // Every recipe must load with the shared overrides before anything runs.
  for (const auto& recipe : out.recipes) {
    Recipe loaded = load_recipe(recipe, out.overrides);
    out.title += (out.title.empty() ? "" : "_vs_") + loaded.name();
  }
  if (!values->count("seed")) out.seed = recipe_seed(out.recipes.front(), out.overrides);
  out.report_dir =
      fs::absolute(output.empty() ? fs::path("runs") / "compare" / out.title : fs::path(output));
  return out;
}

// The dtype the run computed in, as its run_info.toml says ("float32" when it does not).
std::string compute_dtype(const fs::path& dir, int nproc) {
  std::ifstream info(dir / (nproc > 1 ? "run_info.rank0.toml" : "run_info.toml"));
  const std::string key = "compute_dtype = \"";
  for (std::string line; std::getline(info, line);) {
    if (line.rfind(key, 0) == 0 && line.size() > key.size() && line.back() == '"') {
      return line.substr(key.size(), line.size() - key.size() - 1);
    }
  }
  return "float32";
}

// The --set values of a variant's run. Later ones win: the logging interval for --steps, the
// shared overrides, then the seed and steps every variant shares, then the variant's own
// choices, then where it writes.
std::vector<std::string> variant_sets(const CompareOptions& options, const Variant& variant,
                                      const fs::path& dir) {
  std::vector<std::string> sets;
  // A short comparison still draws curves: about 20 points unless --set says otherwise.
  if (options.steps > 0)
    sets.push_back("run.log_every=" +
                   std::to_string(std::max<std::int64_t>(1, options.steps / 20)));
  sets.insert(sets.end(), options.overrides.begin(), options.overrides.end());
  sets.push_back("run.seed=" + std::to_string(options.seed));
  // Every variant measures its memory by the allocator, beside its plan.
  sets.push_back("run.track_memory=true");
  if (options.steps > 0) sets.push_back("run.max_steps=" + std::to_string(options.steps));
  sets.insert(sets.end(), variant.assignments.begin(), variant.assignments.end());
  sets.push_back("run.output_dir=" + dir.string());
  if (!writes_default_metrics_file(variant.recipe, sets))
    sets.push_back(std::string("sinks.compare_metrics.plugin=") + default_plugins::kMetricsSink);
  return sets;
}

// The child's command line (after the binary): 'run', or 'launch' for several ranks, with the
// variant's --set values and the plugin options compare itself was given.
std::vector<std::string> child_args(const CompareOptions& options, const Variant& variant,
                                    const std::vector<std::string>& sets) {
  std::vector<std::string> child;
  if (variant.nproc > 1)
    child = {"launch", "--nproc-per-node", std::to_string(variant.nproc)};
  else
    child = {"run"};
  child.push_back(variant.recipe.string());
  for (const auto& set : sets) {
    child.push_back("--set");
    child.push_back(set);
  }
  for (const auto& path : options.common.plugin_paths) {
    child.push_back("--plugin-path");
    child.push_back(fs::absolute(path).string());
  }
  if (options.common.no_default_plugins) child.push_back("--no-default-plugins");
  return child;
}

// What the finished child left: success when it exited 0 and its metrics read. A failed run's
// error is its own one-line message, or the timeout that stopped it.
VariantResult collect_result(const Variant& variant, const ChildOutcome& outcome,
                             const fs::path& metrics, const fs::path& log, std::int64_t timeout_s) {
  VariantResult result;
  result.label = variant.label;
  result.folder = variant.folder;
  result.wall_s = outcome.wall_s;
  result.succeeded = WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0;
  if (result.succeeded) {
    try {
      summarize(read_records(metrics), result);
    } catch (const Error& error) {
      result.succeeded = false;
      result.error = std::string("trainyard: error: ") + error.what();
    }
  } else {
    result.error = outcome.timed_out
                       ? "trainyard: error: compare: stopped after the --timeout of " +
                             std::to_string(timeout_s) + " s (see " + log.string() + ")"
                       : error_of(log, outcome.status);
    // What a failed run logged before it stopped still draws its curve.
    try {
      if (fs::exists(metrics)) summarize(read_records(metrics), result);
    } catch (const Error&) {
    }
  }
  return result;
}

// Runs variant `index` (0-based, of `count`) for the `round`-th time (0-based) in its own folder
// and reads what it measured, reporting progress on stdout as it goes.
VariantResult run_variant(const CompareOptions& options, const Variant& variant, std::size_t index,
                          std::size_t count, int round) {
  const std::string folder =
      options.repeat > 1 ? variant.folder + "/run-" + std::to_string(round + 1) : variant.folder;
  const fs::path dir = options.report_dir / folder;
  fs::create_directories(dir);
  const fs::path metrics = dir / (variant.nproc > 1 ? "metrics.rank0.jsonl" : "metrics.jsonl");
  // A file from an earlier compare must not pass for this run's.
  std::error_code ignored;
  fs::remove(metrics, ignored);
  for (const auto& file : measured_timeline_files(dir)) fs::remove(file, ignored);
  fs::remove(declared_schedule_file(dir), ignored);

  const std::vector<std::string> child =
      child_args(options, variant, variant_sets(options, variant, dir));
  std::cout << "compare: [" << index + 1 << "/" << count << "] " << variant.label;
  if (options.repeat > 1) std::cout << " (run " << round + 1 << " of " << options.repeat << ")";
  if (variant.layout) std::cout << " on " << variant.nproc << " processes";
  std::cout << std::flush;
  const fs::path log = dir / "output.log";
  const ChildOutcome outcome = run_child(child, log, options.timeout_s);

  VariantResult result = collect_result(variant, outcome, metrics, log, options.timeout_s);
  result.folder = folder;
  result.compute_dtype = compute_dtype(dir, variant.nproc);
  result.pipeline = pipeline_variant(dir);
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", result.wall_s);
  std::cout << (result.succeeded ? ": ok" : ": FAILED") << " (" << seconds << " s)\n";
  if (!result.succeeded) std::cout << "  " << result.error << "\n  log: " << log.string() << "\n";
  std::cout << std::flush;
  return result;
}

// One variant's runs as one result: the first run's curves and folder, every run's interval
// step times, the median over the runs of each steady figure, and the first failure.
VariantResult merge_runs(std::vector<VariantResult> runs) {
  VariantResult merged = runs.front();
  merged.step_times.clear();
  std::map<std::string, std::vector<double>> figures;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const VariantResult& run = runs[k];
    merged.step_times.push_back(run.step_times.empty() ? std::vector<double>{}
                                                       : run.step_times.front());
    for (const auto& [key, value] : run.steady) figures[key].push_back(value);
    if (!run.succeeded && merged.succeeded) {
      merged.succeeded = false;
      merged.error =
          run.error + " (run " + std::to_string(k + 1) + " of " + std::to_string(runs.size()) + ")";
    }
  }
  if (runs.size() > 1) {
    for (const auto& [key, values] : figures) merged.steady[key] = median(values);
  }
  return merged;
}

// Every variant options.repeat times, in rounds (A B C, A B C, ...), so that a drift of the
// machine's speed falls on every variant alike.
std::vector<VariantResult> run_rounds(const CompareOptions& options,
                                      const std::vector<Variant>& variants) {
  std::vector<std::vector<VariantResult>> runs(variants.size());
  const std::size_t count = variants.size() * static_cast<std::size_t>(options.repeat);
  std::size_t started = 0;
  for (int round = 0; round < options.repeat; ++round) {
    for (std::size_t i = 0; i < variants.size(); ++i) {
      runs[i].push_back(run_variant(options, variants[i], started++, count, round));
    }
  }
  std::vector<VariantResult> results;
  for (auto& variant_runs : runs) results.push_back(merge_runs(std::move(variant_runs)));
  return results;
}

// Writes table.txt and report.html (and the baseline, when asked) into place and prints the
// table, the pipeline idle shares and where the files are.
void write_outputs(const CompareOptions& options, const std::vector<std::string>& args,
                   const std::vector<VariantResult>& results) {
  const std::string table = format_table(results);
  CompareReport report;
  report.title = options.title;
  report.command_line = {"trainyard", "compare"};
  report.command_line.insert(report.command_line.end(), args.begin(), args.end());
  report.variants = results;
  const fs::path& report_dir = options.report_dir;
  write_file(report_dir / "table.txt", table);
  write_file(report_dir / "report.html", render_html(report));
  std::cout << "\n"
            << table << format_pipeline_idle_shares(results)
            << "\ntable: " << (report_dir / "table.txt").string()
            << "\nreport: " << (report_dir / "report.html").string() << std::endl;
  if (!options.save_baseline.empty()) {
    save_baseline(options.save_baseline, report);
    std::cout << "baseline: " << options.save_baseline.string() << std::endl;
  }
}

}  // namespace

// Each variant's planned step peak on its first rank (memory_plan.hpp), or nothing where the
// planner cannot plan its layout.
std::vector<std::optional<double>> planned_peaks(const CompareOptions& options,
                                                 const std::vector<Variant>& variants,
                                                 Registry& registry) {
  PluginLoader loader(registry);
  std::vector<std::filesystem::path> extra;
  for (const auto& recipe : options.recipes) {
    for (const auto& path : recipe_plugin_paths(load_recipe(recipe, options.overrides))) {
      extra.push_back(path);
    }
  }
  load_plugins(loader, options.common, extra);
  std::vector<std::optional<double>> peaks;
  for (const Variant& variant : variants) {
    std::vector<std::string> sets = options.overrides;
    sets.insert(sets.end(), variant.assignments.begin(), variant.assignments.end());
    try {
      const LayoutPlan plan = plan_layout(variant.recipe, sets, variant.nproc, registry);
      const PlannedMemory& first =
          plan.pipeline_ranks.empty() ? plan.memory : plan.pipeline_ranks.front();
      peaks.emplace_back(static_cast<double>(first.peak.bytes));
    } catch (const std::exception&) {
      peaks.emplace_back();  // a layout the planner does not cover: measured only
    }
  }
  return peaks;
}

int command_compare(const std::vector<std::string>& args, Registry& registry) {
  const std::optional<CompareOptions> options = parse_compare_options(args);
  if (!options) return 0;
  fs::create_directories(options->report_dir);

  std::vector<Variant> variants = make_variants(options->recipes, options->axes);
  assign_process_counts(variants, options->overrides, {options->nproc, options->nproc_given});
  std::optional<Baseline> baseline;
  if (!options->against.empty()) {
    baseline = load_baseline(options->against);
    std::vector<std::string> labels;
    for (const auto& variant : variants) labels.push_back(variant.label);
    check_baseline_fits(*baseline, options->against, options->title, labels);
  }

  const std::vector<std::optional<double>> plans = planned_peaks(*options, variants, registry);
  // One variant at a time, so that their step times are not skewed by sharing the machine.
  std::vector<VariantResult> results = run_rounds(*options, variants);
  for (std::size_t i = 0; i < results.size(); ++i) results[i].planned_step_peak = plans[i];
  compute_divergences(results);
  compute_speeds(results, options->statistics);
  write_outputs(*options, args, results);

  const bool any_succeeded = std::any_of(results.begin(), results.end(),
                                         [](const VariantResult& v) { return v.succeeded; });
  if (baseline) {
    const BaselineCheck check = check_against_baseline(*baseline, results, options->statistics);
    std::cout << "against " << options->against.string() << ":\n" << check.text << std::flush;
    if (check.regressed) {
      std::cerr << "trainyard: error: compare: a variant regressed against "
                << options->against.string() << " (see above)" << std::endl;
      return 1;
    }
  }
  return any_succeeded ? 0 : 1;
}

}  // namespace trainyard
