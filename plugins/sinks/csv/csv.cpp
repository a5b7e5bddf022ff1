// Metric records as CSV tables, one file per record phase (train, eval, summary), for
// spreadsheets and dataframes.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "trainyard/api/error.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

std::string csv_number(double value) {
  if (!std::isfinite(value)) return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", value);
  return text;
}

// One phase's table. Columns are the names seen so far, in order of first appearance; a record
// that brings a new name (skipped_steps appears with the first skipped step) rewrites the file
// with the wider header, so every row always lines up with the header.
class CsvTable {
 public:
  explicit CsvTable(fs::path path) : path_(std::move(path)) {}

  // Continues the table an earlier run wrote: its rows up to `resumed_at_step` stay (later ones
  // were lost with the failure and are written again), under the same header.
  void continue_from(std::int64_t resumed_at_step) {
    std::ifstream in(path_);
    std::string header;
    if (!in || !std::getline(in, header)) return;
    columns_ = split(header);
    const auto step_column = std::find(columns_.begin(), columns_.end(), "step");
    if (step_column == columns_.end()) {
      columns_.clear();
      return;
    }
    const auto step_index = static_cast<std::size_t>(step_column - columns_.begin());
    std::string line;
    while (std::getline(in, line)) {
      std::vector<std::string> cells = split(line);
      // A row cut short by the failure has fewer cells than the header.
      if (cells.size() != columns_.size()) continue;
      char* end = nullptr;
      const long long step = std::strtoll(cells[step_index].c_str(), &end, 10);
      if (*end != '\0' || step > resumed_at_step) continue;
      std::map<std::string, std::string> row;
      for (std::size_t i = 0; i < cells.size(); ++i) {
        if (!cells[i].empty()) row.emplace(columns_[i], cells[i]);
      }
      rows_.push_back(std::move(row));
    }
    in.close();
    rewrite();
  }

  void add(const MetricRecord& record) {
    std::map<std::string, std::string> row = {{"step", std::to_string(record.step)},
                                              {"epoch", std::to_string(record.epoch)},
                                              {"elapsed_s", csv_number(record.elapsed_s)}};
    bool widened = columns_.empty();
    if (columns_.empty()) columns_ = {"step", "epoch", "elapsed_s"};
    for (const auto& [name, value] : record.values) {
      if (!row.emplace(name, csv_number(value)).second) continue;
      if (std::find(columns_.begin(), columns_.end(), name) == columns_.end()) {
        columns_.push_back(name);
        widened = true;
      }
    }
    rows_.push_back(std::move(row));
    if (widened) {
      rewrite();
    } else {
      append(rows_.back());
    }
  }

 private:
  static std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> cells;
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = line.find(',', start);
      cells.push_back(line.substr(start, comma - start));
      if (comma == std::string::npos) return cells;
      start = comma + 1;
    }
  }

  void write_row(std::ofstream& out, const std::map<std::string, std::string>& row) const {
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      auto it = row.find(columns_[i]);
      out << (i ? "," : "") << (it == row.end() ? "" : it->second);
    }
    out << "\n";
  }

  void rewrite() {
    std::ofstream out(path_, std::ios::out | std::ios::trunc);
    if (!out) throw Error("cannot write metrics file " + path_.string());
    for (std::size_t i = 0; i < columns_.size(); ++i) out << (i ? "," : "") << columns_[i];
    out << "\n";
    for (const auto& row : rows_) write_row(out, row);
  }

  void append(const std::map<std::string, std::string>& row) {
    std::ofstream out(path_, std::ios::out | std::ios::app);
    if (!out) throw Error("cannot write metrics file " + path_.string());
    write_row(out, row);
  }

  fs::path path_;
  std::vector<std::string> columns_;
  std::vector<std::map<std::string, std::string>> rows_;
};

class Csv final : public MetricsSink {
 public:
  explicit Csv(const Config& options)
      : folder_(options.get_string("dir").empty() ? fs::path() : options.get_path("dir")) {}

  void begin(const RunInfo& run) override {
    run_ = run;
    if (!folder_.empty()) run_.output_dir = folder_.string();
    fs::create_directories(run_.output_dir);
    if (run_.resumed_at_step > 0) {
      for (const char* phase : {"train", "eval"}) {
        const fs::path path = per_rank_file(run_, std::string("metrics.") + phase, ".csv");
        if (!fs::exists(path)) continue;
        tables_.emplace(phase, CsvTable(path)).first->second.continue_from(run_.resumed_at_step);
      }
    }
  }

  void write(const MetricRecord& record) override {
    auto it = tables_.find(record.phase);
    if (it == tables_.end()) {
      it = tables_
               .emplace(record.phase,
                        CsvTable(per_rank_file(run_, "metrics." + record.phase, ".csv")))
               .first;
    }
    it->second.add(record);
  }

 private:
  fs::path folder_;
  RunInfo run_;  // output_dir: the tables' folder
  std::map<std::string, CsvTable> tables_;
};

void register_components(Registry& registry) {
  registry.add<MetricsSink>(
      "csv",
      {option("dir", "",
              "folder of the tables metrics.<phase>.csv (default: the run's output folder; "
              "one set per rank)")},
      "metric records as CSV tables, one per record phase (train, eval, summary)",
      [](const Config& options, const BuildContext&) { return std::make_unique<Csv>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("csv", "1.0.0", trainyard::register_components)
