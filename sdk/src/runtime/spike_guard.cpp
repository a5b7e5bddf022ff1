#include "spike_guard.hpp"

#include <cstdio>
#include <sstream>
#include <utility>
#include <vector>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/median.hpp"

namespace trainyard {

std::optional<std::string> SpikeGuard::check(std::int64_t step, double loss) {
  if (!enabled()) return std::nullopt;
  if (static_cast<std::int64_t>(losses_.size()) >= settings_.window) {
    const double yardstick = median();
    // A nan loss compares false everywhere: it is the non-finite guard's to catch.
    if (loss > settings_.factor * yardstick) {
      std::ostringstream out;
      out << "step " << step << ": loss " << loss << " is above " << settings_.factor
          << " x the median " << yardstick << " of the last " << settings_.window << " steps";
      return out.str();
    }
  }
  losses_[step] = loss;
  while (static_cast<std::int64_t>(losses_.size()) > settings_.window)
    losses_.erase(losses_.begin());
  return std::nullopt;
}

void SpikeGuard::rewind(std::int64_t step) {
  losses_.erase(losses_.upper_bound(step), losses_.end());
}

double SpikeGuard::median() const {
  std::vector<double> values;
  values.reserve(losses_.size());
  for (const auto& [step, loss] : losses_) values.push_back(loss);
  return trainyard::median(std::move(values));
}

std::string SpikeGuard::save() const {
  std::ostringstream text;
  text.precision(17);
  const char* separator = "";
  for (const auto& [step, loss] : losses_) {
    text << separator << step << ':' << loss;
    separator = ",";
  }
  return text.str();
}

void SpikeGuard::load(const std::string& text) {
  losses_.clear();
  std::istringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    long long step = 0;
    double loss = 0;
    if (std::sscanf(entry.c_str(), "%lld:%lf", &step, &loss) != 2) {
      throw Error("checkpoint: malformed loss window entry '" + entry + "'");
    }
    losses_[step] = loss;
  }
}

}  // namespace trainyard
