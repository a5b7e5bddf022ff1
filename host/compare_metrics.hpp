#pragma once
// Reading the metrics file a compare variant's run wrote (one JSON record per line) into the
// curves and figures of its VariantResult.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "compare_report.hpp"

namespace trainyard {

struct MetricsRecord {
  std::string phase;
  std::int64_t step = 0;
  std::map<std::string, double> values;  // null (a non-finite value) reads as NaN
};

// The records of `file`, in file order; throws Error when it is missing or a line does not read.
std::vector<MetricsRecord> read_records(const std::filesystem::path& file);

// Fills the curves and figures of `v` from its records.
void summarize(const std::vector<MetricsRecord>& records, VariantResult& v);

}  // namespace trainyard
