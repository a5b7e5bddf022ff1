#pragma once
// Metric sinks: where the numbers of a run go.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainyard/api/component.hpp"
#include "trainyard/api/step_phases.hpp"

namespace trainyard {

struct RunInfo {
  std::string name;  // the recipe's name
  std::int64_t total_steps = 0;
  std::int64_t steps_per_epoch = 0;
  std::int64_t epochs = 0;
  int rank = 0;
  int world_size = 1;
  std::string output_dir;  // where sinks put files unless configured otherwise
  // The step of the checkpoint the run resumed from (0: it starts from scratch). Sinks that write
  // files continue them: records up to this step are kept, later ones (written before a failure
  // and lost with it) are replaced by the run's new ones.
  std::int64_t resumed_at_step = 0;
};

// A sink's file in the run's output folder: `<stem><extension>`, or `<stem>.rank<R><extension>`
// when the run has several ranks (each rank writes its own).
std::filesystem::path per_rank_file(const RunInfo& run, const std::string& stem,
                                    const std::string& extension);

// One line of metrics. `phase` is "train" (rolled up over the logging interval), "eval" (one
// per evaluation) or "summary" (once at the end).
struct MetricRecord {
  std::string phase;
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  double elapsed_s = 0;  // since the run started
  std::vector<std::pair<std::string, double>> values;

  // The value named `name`, or `fallback`.
  double get(const std::string& name, double fallback = 0) const;
};

// Whether the metric called `name` counts something, so that sinks show it as a whole number
// ("steps 2811", not "steps 2811.0000"). The kind is declared by the name: "steps", "samples",
// "tokens", "epoch", or a name ending in _steps, _samples, _tokens, _bytes, _calls, _count,
// _total, _workers, _threads, _ranks or _index; an "eval_" prefix (the summary's copy of an
// evaluation figure) is looked through. Rates and means ("samples_per_s", "loss") are not counts.
bool is_count_metric(std::string_view name);

// A metrics sink plugin. Records arrive in order from the engine's thread; write() must not
// block for long (buffer, flush at end()).
class MetricsSink : public Component {
 public:
  static constexpr const char* kKind = "sink";
  virtual void begin(const RunInfo& run) {}
  virtual void write(const MetricRecord& record) = 0;
  // Sinks that draw timelines (traces) ask for every step's phases; they arrive once per
  // logging interval, before that interval's "train" record.
  virtual bool wants_phase_spans() const { return false; }
  virtual void write_phase_spans(const std::vector<PhaseSpan>& spans) {}
  virtual void end() {}
};

}  // namespace trainyard
