// One JSON object per metric record, one record per line.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "trainyard/error.hpp"
#include "trainyard/json_quote.hpp"
#include "trainyard/metrics.hpp"
#include "trainyard/plugin.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out << std::setprecision(17) << value;
  return out.str();
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
    out_.open(path, std::ios::out | std::ios::trunc);
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
