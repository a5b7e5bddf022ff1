#include "skipped_batches.hpp"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

std::pair<std::int64_t, std::int64_t> parse_entry(const std::string& entry) {
  long long epoch = -1;
  long long batch = -1;
  char tail = 0;
  if (std::sscanf(entry.c_str(), "%lld:%lld%c", &epoch, &batch, &tail) != 2 || epoch < 0 ||
      batch < 0) {
    throw Error("'" + entry + "' is not EPOCH:BATCH (the loader's batch index within the epoch)");
  }
  return {epoch, batch};
}

}  // namespace

void SkippedBatches::add_entries(const std::vector<std::string>& entries) {
  for (const auto& entry : entries) batches_.insert(parse_entry(entry));
}

std::string SkippedBatches::save() const {
  std::ostringstream text;
  const char* separator = "";
  for (const auto& [epoch, batch] : batches_) {
    text << separator << epoch << ':' << batch;
    separator = ",";
  }
  return text.str();
}

void SkippedBatches::load(const std::string& text) {
  std::istringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    if (!entry.empty()) batches_.insert(parse_entry(entry));
  }
}

void test_corrupt_batch_hook(std::int64_t epoch, std::int64_t index, Batch& batch) {
  const char* plan = std::getenv("TRAINYARD_TEST_CORRUPT_BATCH");
  if (plan == nullptr) return;
  std::istringstream entries(plan);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    long long planned_epoch = -1;
    long long planned_batch = -1;
    char how[8] = "";
    if (std::sscanf(entry.c_str(), "%lld:%lld:%7s", &planned_epoch, &planned_batch, how) < 2 ||
        planned_epoch != epoch || planned_batch != index) {
      continue;
    }
    const bool nan = std::string(how) == "nan";
    for (auto& [name, tensor] : batch.tensors) {
      if (!at::isFloatingType(tensor.scalar_type())) continue;
      tensor = nan ? tensor * std::numeric_limits<double>::quiet_NaN() : tensor * 1000.0;
    }
  }
}

}  // namespace trainyard
