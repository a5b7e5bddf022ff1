// Concise metric lines on standard output: loss, learning rate, throughput and time left. On a
// terminal the training line is a progress bar redrawn in place; elsewhere (logs, pipes) every
// record is its own plain line.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "trainyard/api/metrics.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

std::string duration(double seconds) {
  auto total = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lldh%02lldm", total / 3600, total / 60 % 60);
  } else {
    std::snprintf(text, sizeof text, "%lldm%02llds", total / 60, total % 60);
  }
  return text;
}

// A figure as the line shows it: a count (is_count_metric) holding a whole number without
// decimals, anything else through `format` (printf, one double).
std::string figure(const std::string& name, double value, const char* format) {
  char text[64];
  if (is_count_metric(name) && std::isfinite(value) && value == std::trunc(value) &&
      std::fabs(value) < 9.0e18) {
    std::snprintf(text, sizeof text, "%lld", static_cast<long long>(value));
  } else {
    std::snprintf(text, sizeof text, format, value);
  }
  return text;
}

class Console final : public MetricsSink {
 public:
  explicit Console(const Config& options)
      : show_all_ranks_(options.get_bool("all_ranks")), progress_(options.get_string("progress")) {}

  void begin(const RunInfo& run) override {
    run_ = run;
    quiet_ = run.rank != 0 && !show_all_ranks_;
    if (quiet_) return;
    bar_ = progress_ == "bar" || (progress_ == "auto" && ::isatty(STDOUT_FILENO) == 1);
    std::printf("%s: %lld steps (%lld per epoch, %lld epochs)\n", run.name.c_str(),
                static_cast<long long>(run.total_steps),
                static_cast<long long>(run.steps_per_epoch), static_cast<long long>(run.epochs));
    std::fflush(stdout);
  }

  void write(const MetricRecord& record) override {
    if (quiet_) return;
    std::string line;
    char buffer[256];
    if (record.phase == "train") {
      const double step_ms = record.get("step_time_ms");
      const double remaining =
          static_cast<double>(run_.total_steps - record.step) * step_ms / 1000.0;
      std::snprintf(buffer, sizeof buffer,
                    "step %lld/%lld  epoch %.2f  loss %.4f  lr %.2e  %.0f samples/s  %.1f ms/step  "
                    "eta %s",
                    static_cast<long long>(record.step), static_cast<long long>(run_.total_steps),
                    record.get("epoch_progress"), record.get("loss"), record.get("lr"),
                    record.get("samples_per_s"), step_ms, duration(remaining).c_str());
      line = buffer;
      for (const char* extra : {"grad_norm", "loss_scale", "skipped_steps", "mfu"}) {
        for (const auto& [name, value] : record.values) {
          if (name == extra) line += "  " + name + " " + figure(name, value, "%.4g");
        }
      }
    } else {
      std::snprintf(buffer, sizeof buffer, "%s  step %lld  epoch %lld", record.phase.c_str(),
                    static_cast<long long>(record.step), static_cast<long long>(record.epoch));
      line = buffer;
      for (const auto& [name, value] : record.values) {
        line += "  " + name + " " + figure(name, value, "%.4f");
      }
    }
    if (bar_ && record.phase == "train") {
      // Redrawn in place: carriage return, the bar, the line, and erase what a longer previous
      // line left behind.
      const double done = run_.total_steps > 0 ? static_cast<double>(record.step) /
                                                     static_cast<double>(run_.total_steps)
                                               : 0;
      const int width = 24;
      const int filled = std::clamp(static_cast<int>(done * width + 0.5), 0, width);
      std::printf("\r[%s%s] %3.0f%% %s\033[K",
                  std::string(static_cast<std::size_t>(filled), '#').c_str(),
                  std::string(static_cast<std::size_t>(width - filled), '.').c_str(), 100.0 * done,
                  line.c_str());
      bar_open_ = true;
    } else {
      std::printf("%s%s\n", bar_open_ ? "\n" : "", line.c_str());
      bar_open_ = false;
    }
    std::fflush(stdout);
  }

  void end() override {
    if (bar_open_) std::printf("\n");
    bar_open_ = false;
    std::fflush(stdout);
  }

 private:
  RunInfo run_;
  bool show_all_ranks_ = false;
  std::string progress_;
  bool quiet_ = false;
  bool bar_ = false;       // draw the training line as a progress bar
  bool bar_open_ = false;  // the bar is on screen without its newline
};

void register_components(Registry& registry) {
  registry.add<MetricsSink>("console",
                            {option("all_ranks", false, "print on every rank, not only rank 0"),
                             option("progress", "auto",
                                    "auto (a progress bar on a terminal, plain lines otherwise), "
                                    "bar or lines")
                                 .one_of({"auto", "bar", "lines"})},
                            "concise metric lines on standard output",
                            [](const Config& options, const BuildContext&) {
                              return std::make_unique<Console>(options);
                            });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("console", "1.0.0", trainyard::register_components)
