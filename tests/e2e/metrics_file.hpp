#pragma once
// Reads the jsonl sink's files: flat JSON objects of strings and numbers, one per line.

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainyard::testing {

struct MetricLine {
  std::string phase;
  std::map<std::string, double> values;
  std::map<std::string, std::string> raw;  // numbers as written, for bitwise comparisons

  double at(const std::string& key) const {
    auto it = values.find(key);
    if (it == values.end()) throw std::out_of_range("no metric '" + key + "'");
    return it->second;
  }
  bool has(const std::string& key) const { return values.count(key) != 0; }
};

std::vector<MetricLine> read_metrics(const std::filesystem::path& file);
std::vector<MetricLine> of_phase(const std::vector<MetricLine>& lines, const std::string& phase);

}  // namespace trainyard::testing
