#include "metrics_reporter.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/api/scheduler.hpp"
#include "trainyard/api/skipped_samples.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/runtime/dtype_name.hpp"
#include "trainyard/runtime/loader.hpp"

namespace trainyard {

MetricsReporter::MetricsReporter(const Recipe& recipe, const Registry& registry,
                                 const BuildContext& build, PhaseClock& phases, MeterSetup meter,
                                 double peak_tflops, ReportedRun run,
                                 std::function<void(const std::string&)> log)
    : run_(std::move(run)), log_(std::move(log)) {
  if (const Value* comm = recipe.root->find("comm"); comm && comm->type() == ValueType::kTable) {
    Table settings;
    settings.set("comm", *comm);
    comm_settings_ = to_toml(settings);
  }
  const Config sinks = recipe.section("sinks");
  for (const auto& [name, value] : sinks.table().entries()) {
    const Config section(value.table_ptr(), "sinks." + name);
    if (!section.get_bool("enabled")) continue;
    sinks_.push_back(registry.create<MetricsSink>(
        section.get_string("plugin"), plugin_options(section, sink_common_options()), build));
  }
  phases.keep_spans(std::any_of(sinks_.begin(), sinks_.end(),
                                [](const auto& sink) { return sink->wants_phase_spans(); }));
  if (peak_tflops > 0 || meter.flops_per_sample > 0) {
    peak_ = resolve_peak_flops(peak_tflops, *run_.placement.backend, run_.placement.index,
                               run_.precision->autocast_dtype(), peak_cache_folder(), log_);
    meter.peak_flops = peak_->flops_per_s;
  }
  meter_ = std::make_unique<TrainingMeter>(meter, phases);
}

namespace {

// Of what a caching allocator reserved from the device at its peak, the share it never handed out
// at once (its allocated peak below its reserved peak): blocks cached for sizes that did not
// come again, or split so that no request fit them. 0 where nothing is cached.
double fragmentation(const DeviceMemory& memory) {
  if (memory.peak_reserved_bytes <= 0) return 0;
  return std::clamp(1.0 - static_cast<double>(memory.peak_bytes) /
                              static_cast<double>(memory.peak_reserved_bytes),
                    0.0, 1.0);
}

// A TOML basic string.
std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

void MetricsReporter::write_run_info(const RunInfo& info) const {
  const std::filesystem::path file = per_rank_file(info, "run_info", ".toml");
  std::error_code error;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), error);
  std::ostringstream text;
  const DeviceBackend& backend = *run_.placement.backend;
  text << "# What this run's figures depend on, written at its start.\n[device]\nkind = "
       << toml_string(run_.placement.device.str())
       << "\nname = " << toml_string(backend.device_name(run_.placement.index)) << "\n";
  // The dtype the precision computes in ("float32" without autocast): what a comparison of two
  // runs' losses takes its tolerance from.
  const std::optional<c10::ScalarType> compute = run_.precision->autocast_dtype();
  text << "\n[precision]\ncompute_dtype = "
       << toml_string(dtype_name(compute.value_or(c10::ScalarType::Float))) << "\n";
  if (peak_) {
    text << "\n[peak_flops]\ntflops = " << std::setprecision(17) << peak_->flops_per_s / 1e12
         << "\nsource = " << toml_string(peak_source_name(peak_->source)) << "\n";
    if (peak_->source != PeakSource::Declared) {
      text << "dtype = " << toml_string(dtype_name(peak_->dtype))
           << "\ncache_file = " << toml_string(peak_->cache_file.string()) << "\n";
    }
  }
  // The communication settings the backend was given (they change speed, not results).
  if (!comm_settings_.empty()) text << "\n" << comm_settings_;
  std::ofstream out(file, std::ios::out | std::ios::trunc);
  out << text.str();
  if (!out) throw Error("cannot write " + file.string());
}

void MetricsReporter::begin(const RunInfo& info) {
  for (auto& sink : sinks_) sink->begin(info);
  // Said once training starts: a run that fails before (a checkpoint that does not load, a sink
  // that cannot open) says only why.
  if (peak_ && run_.rank == 0) log_("trainyard: peak " + describe_peak(*peak_) + " per rank");
  write_run_info(info);
  // The first train record's utilisation covers the run from here.
  run_.placement.backend->utilisation(run_.placement.index);
  process_cpu_.share_since_last();
}

void MetricsReporter::emit(const MetricRecord& record) {
  for (const auto& [name, value] : record.values) {
    if (name == "mfu") highest_mfu_ = std::max(highest_mfu_, value);
  }
  for (auto& sink : sinks_) sink->write(record);
}

void MetricsReporter::set_loader_choice(double prepare_ms, double prepare_share) {
  loader_choice_ = {{"loader_prepare_ms", prepare_ms}, {"loader_prepare_share", prepare_share}};
}

// The loader's workers and the compute threads in effect (the automatic loader changes them
// over the first steps).
void MetricsReporter::append_loader_figures(
    std::vector<std::pair<std::string, double>>& values) const {
  values.emplace_back("loader_workers", static_cast<double>(run_.loader->workers()));
  values.emplace_back("compute_threads", static_cast<double>(at::get_num_threads()));
}

// Memory as the device's allocator (or the process, on the host) sees it, and what the strategy
// holds in parameters, gradients and optimizer state.
void MetricsReporter::append_memory_figures(
    std::vector<std::pair<std::string, double>>& values) const {
  const DeviceMemory memory = run_.placement.backend->memory(run_.placement.index);
  values.emplace_back("memory_current_bytes", static_cast<double>(memory.current_bytes));
  values.emplace_back("memory_peak_bytes", static_cast<double>(memory.peak_bytes));
  if (memory.peak_reserved_bytes > 0) {
    values.emplace_back("memory_reserved_bytes", static_cast<double>(memory.reserved_bytes));
    values.emplace_back("memory_peak_reserved_bytes",
                        static_cast<double>(memory.peak_reserved_bytes));
    values.emplace_back("memory_fragmentation", fragmentation(memory));
  }
  const HeldBytes held = run_.strategy->held_bytes();
  values.emplace_back("held_parameter_bytes", static_cast<double>(held.parameters));
  values.emplace_back("held_gradient_bytes", static_cast<double>(held.gradients));
  values.emplace_back("held_optimizer_bytes", static_cast<double>(held.optimizer_state));
}

// How busy the device and this process's CPUs were since the previous train record (the device's
// figures only where its backend reports them).
void MetricsReporter::append_utilisation_figures(
    std::vector<std::pair<std::string, double>>& values) {
  const DeviceUtilisation device = run_.placement.backend->utilisation(run_.placement.index);
  if (device.compute_share) values.emplace_back("device_util", *device.compute_share);
  if (device.memory_used_bytes) {
    values.emplace_back("device_memory_used_bytes", static_cast<double>(*device.memory_used_bytes));
  }
  if (const auto cpu = process_cpu_.share_since_last()) values.emplace_back("cpu_util", *cpu);
}

void MetricsReporter::flush_train(std::int64_t step, std::int64_t epoch, double elapsed_s) {
  if (meter_->interval_empty()) return;
  IntervalFigures figures = meter_->close_interval();
  MetricRecord record;
  record.phase = "train";
  record.step = step;
  record.epoch = epoch;
  record.elapsed_s = elapsed_s;
  final_train_loss_ = figures.mean_loss;
  record.values = std::move(figures.values);
  record.values.emplace_back(
      "lr", run_.scheduler->learning_rate(step - 1, run_.total_steps, run_.base_lr));
  const Loader& loader = *run_.loader;
  record.values.emplace_back(
      "epoch_progress", static_cast<double>(epoch) + static_cast<double>(loader.position()) /
                                                         static_cast<double>(std::max<std::int64_t>(
                                                             1, loader.batches_per_epoch())));
  for (const auto& metric : run_.precision->metrics()) record.values.push_back(metric);
  append_loader_figures(record.values);
  append_memory_figures(record.values);
  append_utilisation_figures(record.values);
  if (!figures.spans.empty()) {
    for (auto& sink : sinks_) {
      if (sink->wants_phase_spans()) sink->write_phase_spans(figures.spans);
    }
  }
  emit(record);
  meter_->restart_clock();
}

void MetricsReporter::write_eval(std::int64_t step, std::int64_t epoch, double elapsed_s,
                                 std::vector<std::pair<std::string, double>> values) {
  MetricRecord record;
  record.phase = "eval";
  record.step = step;
  record.epoch = epoch;
  record.elapsed_s = elapsed_s;
  record.values = std::move(values);
  last_eval_.clear();
  for (const auto& [name, value] : record.values) last_eval_[name] = value;
  emit(record);
}

void MetricsReporter::write_event(const std::string& phase, std::int64_t step, std::int64_t epoch,
                                  double elapsed_s,
                                  std::vector<std::pair<std::string, double>> values) {
  MetricRecord record;
  record.phase = phase;
  record.step = step;
  record.epoch = epoch;
  record.elapsed_s = elapsed_s;
  record.values = std::move(values);
  emit(record);
}

// Per thread that prepared batches, where its time went; and advice when they held steps back.
void MetricsReporter::report_loader_threads(double wall_s) const {
  const std::vector<WorkerTimes> times = run_.loader->worker_times();
  for (const auto& line : describe_worker_times(times)) log_("trainyard: " + line);
  const auto advice = advise_loader_workers(times, run_.loader->workers(), wall_s,
                                            meter_->phase_share(StepPhase::DataWait));
  if (advice) log_("trainyard: " + *advice);
  const SkippedSamples skipped = skipped_samples();
  if (skipped.count > 0) {
    log_("trainyard: the dataset skipped " + std::to_string(skipped.count) + " unreadable sample" +
         (skipped.count == 1 ? "" : "s") + " (on_bad_sample = \"skip\"); the first: " +
         skipped.first_reason);
  }
}

// A model that computed faster than the cached peak (mfu above 1) shows the entry was measured
// while the machine was busy: rank 0 measures it again for later runs and says so.
void MetricsReporter::refresh_outrun_peak() {
  if (!peak_ || peak_->source != PeakSource::Cached || highest_mfu_ <= 1.0 || run_.rank != 0) {
    return;
  }
  const double fresh =
      remeasure_cached_peak(*run_.placement.backend, run_.placement.index, *peak_);
  char text[200];
  std::snprintf(text, sizeof text,
                "trainyard: warning: this run's model computed at %.2f times the cached peak "
                "FLOP/s, so the cache entry was measured on a busy machine; measured again: "
                "%.3f TFLOP/s (was %.3f), for later runs",
                highest_mfu_, fresh / 1e12, peak_->flops_per_s / 1e12);
  log_(text);
}

RunSummary MetricsReporter::finish(RunSummary summary, std::int64_t epoch, double elapsed_s) {
  summary.final_train_loss = final_train_loss_;
  if (run_.memory) {
    const StepMemory steps = run_.memory->figures();
    summary.memory = MeasuredMemory{steps.start_bytes, steps.activation_bytes, steps.peak_bytes,
                                    step_phase_name(steps.peak_phase),
                                    run_.strategy->held_bytes()};
    const DeviceMemory device = run_.placement.backend->memory(run_.placement.index);
    summary.memory->peak_reserved = device.peak_reserved_bytes;
    summary.memory->fragmentation = fragmentation(device);
  }
  summary.eval = last_eval_;
  MetricRecord record;
  record.phase = "summary";
  record.step = summary.steps;
  record.epoch = epoch;
  record.elapsed_s = elapsed_s;
  record.values = {{"steps", static_cast<double>(summary.steps)},
                   {"wall_s", summary.wall_s},
                   {"samples_per_s", summary.samples_per_s},
                   {"final_train_loss", summary.final_train_loss}};
  for (int index = 0; index < kStepPhaseCount; ++index) {
    const auto phase = static_cast<StepPhase>(index);
    record.values.emplace_back(std::string(step_phase_name(phase)) + "_share",
                               meter_->phase_share(phase));
  }
  append_loader_figures(record.values);
  for (const auto& figure : summed_worker_figures(run_.loader->worker_times())) {
    record.values.push_back(figure);
  }
  record.values.emplace_back("skipped_samples", static_cast<double>(skipped_samples().count));
  for (const auto& figure : loader_choice_) record.values.push_back(figure);
  append_memory_figures(record.values);
  if (run_.memory) {
    for (const auto& figure : run_.memory->values()) record.values.push_back(figure);
    if (run_.rank == 0) log_("trainyard: " + run_.memory->describe(run_.strategy->held_bytes()));
  }
  for (const auto& figure : meter_->traffic_per_step()) record.values.push_back(figure);
  if (peak_) record.values.emplace_back("peak_tflops", peak_->flops_per_s / 1e12);
  refresh_outrun_peak();
  if (run_.rank == 0) {
    const DeviceBackend& backend = *run_.placement.backend;
    const auto precision = faster_precision(backend.fast_compute_dtypes(run_.placement.index),
                                            run_.precision->autocast_dtype());
    for (const auto& line : meter_->bottleneck_report(precision)) log_("trainyard: " + line);
    report_loader_threads(summary.wall_s);
  }
  for (const auto& [name, value] : summary.eval) record.values.emplace_back("eval_" + name, value);
  emit(record);
  for (auto& sink : sinks_) sink->end();
  return summary;
}

}  // namespace trainyard
