// Live metrics for Prometheus: each rank serves the figures of its latest records at
// http://<address>:<port>/metrics while the run lasts. Names follow Prometheus conventions
// (base units, _total counters, labels for dimensions); every series carries the labels `run`
// (the recipe's name) and `rank`.

#include <arpa/inet.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "metrics_endpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

bool is_ipv4(const std::string& address) {
  in_addr parsed{};
  return ::inet_pton(AF_INET, address.c_str(), &parsed) == 1;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A figure's name as a metric name: [a-zA-Z0-9_] only, and the units of its suffix in
// Prometheus' base units (milliseconds become seconds, "_per_s" reads "_per_second", shares
// become ratios).
struct MetricName {
  std::string name;
  double scale = 1;
};

MetricName metric_name(const std::string& prefix, const std::string& figure) {
  std::string name;
  for (char c : figure) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    name.push_back(ok ? c : '_');
  }
  double scale = 1;
  auto replace_suffix = [&name](const std::string& from, const std::string& to) {
    if (!ends_with(name, from)) return false;
    name = name.substr(0, name.size() - from.size()) + to;
    return true;
  };
  if (replace_suffix("_ms", "_seconds")) {
    scale = 1e-3;
  } else if (!replace_suffix("_per_s", "_per_second") && !replace_suffix("_share", "_ratio")) {
    replace_suffix("_s", "_seconds");
  }
  return {prefix + name, scale};
}

class Prometheus final : public MetricsSink {
 public:
  explicit Prometheus(const Config& options)
      : address_(options.get_string("address")),
        base_port_(options.get_int("port")),
        linger_s_(options.get_float("linger_s")) {
    if (!is_ipv4(address_)) {
      options.fail("address", "must be an IPv4 address, got '" + address_ + "'");
    }
  }

  void begin(const RunInfo& run) override {
    const std::int64_t port = base_port_ == 0 ? 0 : base_port_ + run.rank;
    if (port > 65535) {
      throw Error("sinks.prometheus.port: rank " + std::to_string(run.rank) + " would listen on " +
                  std::to_string(port) + ", above 65535; lower the port");
    }
    registry_ = std::make_shared<prometheus::Registry>();
    labels_ = {{"run", run.name}, {"rank", std::to_string(run.rank)}};
    steps_ = &prometheus::BuildCounter()
                  .Name("trainyard_steps_total")
                  .Help("Training steps done")
                  .Labels(labels_)
                  .Register(*registry_)
                  .Add({});
    gauge("trainyard_total_steps", "Training steps the run plans")
        .Set(static_cast<double>(run.total_steps));
    finished_ = &gauge("trainyard_run_finished", "1 once the run has ended, else 0");
    finished_->Set(0);

    endpoint_ = std::make_unique<MetricsEndpoint>(registry_, address_, static_cast<int>(port));
    write_port_file(per_rank_file(run, "prometheus", ".port"), endpoint_->port());
    std::printf("trainyard: rank %d serves Prometheus metrics at http://%s:%d/metrics\n", run.rank,
                address_.c_str(), endpoint_->port());
    std::fflush(stdout);
  }

  void write(const MetricRecord& record) override {
    if (!registry_) return;
    if (record.phase == "train") {
      write_train(record);
    } else if (record.phase == "eval") {
      gauge("trainyard_eval_step", "Step of the latest evaluation")
          .Set(static_cast<double>(record.step));
      for (const auto& [figure, value] : record.values) {
        const MetricName metric = metric_name("trainyard_eval_", figure);
        set(metric.name, "Evaluation figure " + figure + " of the latest evaluation", {},
            value * metric.scale);
      }
    } else if (record.phase == "summary") {
      gauge("trainyard_run_seconds", "Wall time of the whole run").Set(record.get("wall_s"));
      finished_->Set(1);
    }
  }

  void end() override {
    if (!endpoint_) return;
    if (linger_s_ > 0) {
      std::printf("trainyard: Prometheus metrics stay up %.0f s for a final scrape\n", linger_s_);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::duration<double>(linger_s_));
    }
    endpoint_.reset();
  }

 private:
  static void write_port_file(const fs::path& file, int port) {
    if (file.has_parent_path()) fs::create_directories(file.parent_path());
    std::ofstream out(file, std::ios::out | std::ios::trunc);
    out << port << "\n";
    if (!out.flush()) throw Error("cannot write " + file.string());
  }

  void write_train(const MetricRecord& record) {
    const auto step = static_cast<double>(record.step);
    if (step > steps_->Value()) steps_->Increment(step - steps_->Value());
    for (const auto& [figure, value] : record.values) write_train_figure(figure, value);
  }

  void write_train_figure(const std::string& figure, double value) {
    static const std::map<std::string, std::pair<std::string, std::string>> kMemory = {
        {"memory_current_bytes", {"trainyard_memory_bytes", "current"}},
        {"memory_peak_bytes", {"trainyard_memory_bytes", "peak"}},
        {"held_parameter_bytes", {"trainyard_held_bytes", "parameters"}},
        {"held_gradient_bytes", {"trainyard_held_bytes", "gradients"}},
        {"held_optimizer_bytes", {"trainyard_held_bytes", "optimizer_state"}}};
    if (figure == "loss") {
      set("trainyard_loss", "Mean training loss over the latest logging interval", {}, value);
    } else if (figure == "lr") {
      set("trainyard_learning_rate", "Learning rate at the latest logged step", {}, value);
    } else if (figure == "epoch_progress") {
      set("trainyard_epoch", "Epochs done, with the fraction of the current one", {}, value);
    } else if (figure == "step_time_ms") {
      set("trainyard_step_seconds", "Mean step time over the latest logging interval", {},
          value * 1e-3);
    } else if (const std::string phase = step_phase_of(figure); !phase.empty()) {
      set("trainyard_phase_seconds",
          "Mean time per step spent in each step phase over the latest logging interval",
          {{"phase", phase}}, value * 1e-3);
    } else if (auto memory = kMemory.find(figure); memory != kMemory.end()) {
      set(memory->second.first,
          memory->second.first == "trainyard_memory_bytes"
              ? "Device (or host) memory in use now and at its peak"
              : "Bytes the strategy holds in parameters, gradients and optimizer state",
          {{"kind", memory->second.second}}, value);
    } else {
      const MetricName metric = metric_name("trainyard_", figure);
      set(metric.name, "Training figure " + figure + " of the latest logging interval", {},
          value * metric.scale);
    }
  }

  // "forward" for "forward_ms" when forward is a step phase, else "".
  static std::string step_phase_of(const std::string& figure) {
    for (int index = 0; index < kStepPhaseCount; ++index) {
      const std::string phase = step_phase_name(static_cast<StepPhase>(index));
      if (figure == phase + "_ms") return phase;
    }
    return {};
  }

  prometheus::Gauge& gauge(const std::string& name, const std::string& help,
                           const std::map<std::string, std::string>& labels = {}) {
    auto it = families_.find(name);
    if (it == families_.end()) {
      auto& family =
          prometheus::BuildGauge().Name(name).Help(help).Labels(labels_).Register(*registry_);
      it = families_.emplace(name, &family).first;
    }
    return it->second->Add(labels);
  }

  // A figure whose name clashes with a metric of another type (a custom figure called
  // "steps_total") is left out rather than failing the run.
  void set(const std::string& name, const std::string& help,
           const std::map<std::string, std::string>& labels, double value) {
    try {
      gauge(name, help, labels).Set(value);
    } catch (const std::invalid_argument&) {
    }
  }

  std::string address_;
  std::int64_t base_port_;
  double linger_s_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
  std::map<std::string, std::string> labels_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> families_;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Gauge* finished_ = nullptr;
};

void register_components(Registry& registry) {
  registry.add<MetricsSink>(
      "prometheus",
      {option("address", "127.0.0.1",
              "IPv4 address the metrics endpoint listens on (0.0.0.0: every interface)"),
       option("port", 9464,
              "port of rank 0's endpoint; rank R listens on port + R (0: any free port). The "
              "bound port is written to <output_dir>/prometheus.port (prometheus.rank<R>.port "
              "with several ranks)")
           .at_least(0)
           .at_most(65535),
       option("linger_s", 0.0,
              "seconds the endpoint stays up after the run ends, for a final scrape")
           .at_least(0)},
      "live metrics served for Prometheus to scrape (trainyard_loss, trainyard_step_seconds, ...)",
      [](const Config& options, const BuildContext&) {
        return std::make_unique<Prometheus>(options);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("prometheus", "1.0.0", trainyard::register_components)
