// Concise metric lines on standard output: loss, learning rate, throughput and time left.

#include <unistd.h>

#include <cstdio>
#include <string>

#include "trainyard/metrics.hpp"
#include "trainyard/plugin.hpp"

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

class Console final : public MetricsSink {
 public:
  explicit Console(const Config& options) : show_all_ranks_(options.get_bool("all_ranks")) {}

  void begin(const RunInfo& run) override {
    run_ = run;
    quiet_ = run.rank != 0 && !show_all_ranks_;
    if (quiet_) return;
    std::printf("%s: %lld steps (%lld per epoch, %lld epochs)\n", run.name.c_str(),
                static_cast<long long>(run.total_steps), static_cast<long long>(run.steps_per_epoch),
                static_cast<long long>(run.epochs));
    std::fflush(stdout);
  }

  void write(const MetricRecord& record) override {
    if (quiet_) return;
    std::string line;
    char buffer[256];
    if (record.phase == "train") {
      const double step_ms = record.get("step_time_ms");
      const double remaining = static_cast<double>(run_.total_steps - record.step) * step_ms / 1000.0;
      std::snprintf(buffer, sizeof buffer,
                    "step %lld/%lld  epoch %.2f  loss %.4f  lr %.2e  %.0f samples/s  %.1f ms/step  "
                    "eta %s",
                    static_cast<long long>(record.step), static_cast<long long>(run_.total_steps),
                    record.get("epoch_progress"), record.get("loss"), record.get("lr"),
                    record.get("samples_per_s"), step_ms, duration(remaining).c_str());
      line = buffer;
      for (const char* extra : {"grad_norm", "loss_scale", "skipped_steps"}) {
        for (const auto& [name, value] : record.values) {
          if (name == extra) {
            std::snprintf(buffer, sizeof buffer, "  %s %.4g", extra, value);
            line += buffer;
          }
        }
      }
    } else {
      std::snprintf(buffer, sizeof buffer, "%s  step %lld  epoch %lld", record.phase.c_str(),
                    static_cast<long long>(record.step), static_cast<long long>(record.epoch));
      line = buffer;
      for (const auto& [name, value] : record.values) {
        std::snprintf(buffer, sizeof buffer, "  %s %.4f", name.c_str(), value);
        line += buffer;
      }
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

 private:
  RunInfo run_;
  bool show_all_ranks_ = false;
  bool quiet_ = false;
};

void register_components(Registry& registry) {
  registry.add<MetricsSink>("console", {option("all_ranks", false, "print on every rank, not only rank 0")},
                            "concise metric lines on standard output",
                            [](const Config& options, const BuildContext&) {
                              return std::make_unique<Console>(options);
                            });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("console", "1.0.0", trainyard::register_components)
