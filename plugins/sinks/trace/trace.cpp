// Step phases as a Chrome/Perfetto trace (JSON array format): one timeline per rank, one
// slice per phase per step. Open in ui.perfetto.dev or chrome://tracing.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "trainyard/api/error.hpp"
#include "trainyard/support/json_quote.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class Trace final : public MetricsSink {
 public:
  explicit Trace(const Config& options)
      : path_(options.get_string("path").empty() ? fs::path() : options.get_path("path")),
        max_steps_(options.get_int("max_steps")) {}

  void begin(const RunInfo& run) override {
    fs::path path = path_;
    if (path.empty()) {
      path = per_rank_file(run, "trace", ".json");
    }
    if (path.has_parent_path()) fs::create_directories(path.parent_path());
    out_.open(path, std::ios::out | std::ios::trunc);
    if (!out_) throw Error("cannot write trace file " + path.string());
    rank_ = run.rank;
    // The array format tolerates a missing closing bracket, so a run that dies mid-way still
    // leaves a readable trace.
    out_ << "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank_
         << ",\"tid\":0,\"args\":{\"name\":" << json_quote("rank " + std::to_string(rank_)) << "}}";
    out_.flush();
  }

  bool wants_phase_spans() const override { return true; }

  void write_phase_spans(const std::vector<PhaseSpan>& spans) override {
    char buffer[96];
    for (const PhaseSpan& span : spans) {
      if (max_steps_ > 0 && span.step >= first_step(span.step) + max_steps_) break;
      out_ << ",\n{\"name\":\"" << step_phase_name(span.phase)
           << "\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":" << rank_ << ",\"tid\":0";
      std::snprintf(buffer, sizeof buffer, ",\"ts\":%.3f,\"dur\":%.3f", span.start_us,
                    span.duration_us);
      out_ << buffer << ",\"args\":{\"step\":" << span.step << "}}";
    }
    out_.flush();
  }

  void write(const MetricRecord&) override {}

  void end() override {
    out_ << "\n]\n";
    out_.close();
  }

 private:
  std::int64_t first_step(std::int64_t step) {
    if (first_step_ < 0) first_step_ = step;
    return first_step_;
  }

  fs::path path_;
  std::int64_t max_steps_;
  std::int64_t first_step_ = -1;
  std::ofstream out_;
  int rank_ = 0;
};

void register_components(Registry& registry) {
  registry.add<MetricsSink>(
      "trace",
      {option("path", "",
              "output file (default: <output_dir>/trace.json, trace.rank<R>.json with "
              "several ranks)"),
       option("max_steps", 1000, "trace at most this many steps (0: all)").at_least(0)},
      "step phases (data wait, copy, forward, backward, comm wait, optimizer) as a "
      "Chrome/Perfetto trace",
      [](const Config& options, const BuildContext&) { return std::make_unique<Trace>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("trace", "1.0.0", trainyard::register_components)
