#pragma once
// Loss spikes ([run] spike): a step whose loss over the global batch rises above `factor` times
// the median of the last `window` steps' losses either stops the run or rolls it back to its
// last checkpoint, never to see the step's batches again (skipped_batches.hpp). Internal to the
// SDK library.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace trainyard {

struct SpikeSettings {
  double factor = 0;         // 0: off
  std::int64_t window = 50;  // steps whose median is the yardstick
  bool rollback = true;      // or stop
};

class SpikeGuard {
 public:
  explicit SpikeGuard(const SpikeSettings& settings) : settings_(settings) {}

  bool enabled() const { return settings_.factor > 0; }
  bool rolls_back() const { return settings_.rollback; }

  // The loss of step `step` (counted from 1) over the global batch. Returns what is wrong when
  // it spikes (the window is then left as it was); nullopt, after adding it to the window,
  // otherwise. No verdict until the window is full.
  std::optional<std::string> check(std::int64_t step, double loss);
  // Forgets the losses of the steps after `step`: the run went back to it.
  void rewind(std::int64_t step);

  // The window as checkpoint metadata, and back (every digit kept, so a resumed run judges as
  // the uninterrupted one would).
  std::string save() const;
  void load(const std::string& text);

 private:
  double median() const;

  SpikeSettings settings_;
  std::map<std::int64_t, double> losses_;  // by step, the last `window` steps at most
};

}  // namespace trainyard
