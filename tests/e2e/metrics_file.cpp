#include "metrics_file.hpp"

#include <regex>

#include "test_support.hpp"

namespace trainyard::testing {

std::vector<MetricLine> read_metrics(const std::filesystem::path& file) {
  if (!std::filesystem::exists(file)) throw std::runtime_error("no metrics file " + file.string());
  static const std::regex field(R"re("([^"]+)":("([^"]*)"|[-+0-9.eE]+|null))re");
  std::vector<MetricLine> out;
  for (const auto& line : read_lines(file)) {
    MetricLine record;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), field);
         it != std::sregex_iterator(); ++it) {
      const std::string key = (*it)[1];
      const std::string value = (*it)[2];
      if (!value.empty() && value.front() == '"') {
        if (key == "phase") record.phase = (*it)[3];
      } else if (value != "null") {
        record.values[key] = std::stod(value);
        record.raw[key] = value;
      }
    }
    out.push_back(record);
  }
  return out;
}

std::vector<MetricLine> of_phase(const std::vector<MetricLine>& lines, const std::string& phase) {
  std::vector<MetricLine> out;
  for (const auto& line : lines) {
    if (line.phase == phase) out.push_back(line);
  }
  return out;
}

}  // namespace trainyard::testing
