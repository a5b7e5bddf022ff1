// One JSON object per metric record, one record per line.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "trainyard/api/error.hpp"
#include "trainyard/support/json_quote.hpp"
#include "trainyard/support/strict_json.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out << std::setprecision(17) << value;
  return out.str();
}

// Whether a line of an earlier run's file stays when the run continues from `resumed_at_step`:
// a whole record of training or evaluation up to that step. Summaries, later records and a line
// cut short by the failure go.
bool kept_on_resume(const std::string& line, std::int64_t resumed_at_step) {
  try {
    const nlohmann::json record = parse_strict_json(line, "metrics line");
    const auto phase = record.find("phase");
    const auto step = record.find("step");
    if (phase == record.end() || step == record.end() || !phase->is_string() ||
        !step->is_number()) {
      return false;
    }
    return phase->get<std::string>() != "summary" &&
           step->get<double>() <= static_cast<double>(resumed_at_step);
  } catch (const Error&) {
    return false;
  }
}

// Rewrites `path` with the lines kept on resume, through a temporary file renamed into place, so
// a failure now loses nothing the earlier run wrote.
void keep_records_up_to(const fs::path& path, std::int64_t resumed_at_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (kept_on_resume(line, resumed_at_step)) kept += line + "\n";
  }
  in.close();
  const fs::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::out | std::ios::trunc);
    out << kept;
    if (!out.flush()) throw Error("cannot write metrics file " + partial.string());
  }
  fs::rename(partial, path);
}

class Jsonl final : public MetricsSink {
 public:
  explicit Jsonl(const Config& options)
      : path_(options.get_string("path").empty() ? fs::path() : options.get_path("path")) {}

  void begin(const RunInfo& run) override {
    fs::path path = path_;
    if (path.empty()) {
      path = per_rank_file(run, "metrics", ".jsonl");
    }
    if (path.has_parent_path()) fs::create_directories(path.parent_path());
    const bool continues = run.resumed_at_step > 0 && fs::exists(path);
    if (continues) keep_records_up_to(path, run.resumed_at_step);
    out_.open(path, std::ios::out | (continues ? std::ios::app : std::ios::trunc));
    if (!out_) throw Error("cannot write metrics file " + path.string());
    rank_ = run.rank;
  }

  void write(const MetricRecord& record) override {
    out_ << "{\"phase\":" << json_quote(record.phase) << ",\"step\":" << record.step
         << ",\"epoch\":" << record.epoch << ",\"rank\":" << rank_
         << ",\"elapsed_s\":" << json_number(record.elapsed_s);
    for (const auto& [name, value] : record.values) {
      out_ << "," << json_quote(name) << ":" << json_number(value);
    }
    out_ << "}\n";
    // Records arrive once per logging interval; flushing keeps the file useful after a crash.
    out_.flush();
  }

  void end() override { out_.close(); }

 private:
  fs::path path_;
  std::ofstream out_;
  int rank_ = 0;
};

void register_components(Registry& registry) {
  registry.add<MetricsSink>(
      "jsonl",
      {option("path", "", "output file (default: <output_dir>/metrics.jsonl, one per rank)")},
      "metric records as JSON lines",
      [](const Config& options, const BuildContext&) { return std::make_unique<Jsonl>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("jsonl", "1.0.0", trainyard::register_components)
