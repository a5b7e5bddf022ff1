#include "training_meter.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "trainyard/api/strategy.hpp"

namespace trainyard {

TrainingMeter::TrainingMeter(const MeterSetup& setup, PhaseClock& phases)
    : setup_(setup), phases_(phases), interval_start_(Clock::now()) {}

void TrainingMeter::add_step(const StepResult& result) {
  if (result.loss.defined()) {
    loss_sum_ = loss_sum_.defined() ? loss_sum_.add_(result.loss) : result.loss.detach().clone();
    ++loss_steps_;
  }
  if (result.grad_norm.defined()) {
    last_grad_norm_ = result.grad_norm;
    // On the device, so that no step waits: a spike between two records still shows.
    max_grad_norm_ = max_grad_norm_.defined() ? at::fmax(max_grad_norm_, result.grad_norm)
                                              : result.grad_norm.detach().clone();
  }
  if (result.block_grad_norms.defined()) {
    last_block_grad_norms_ = result.block_grad_norms;
    block_names_ = result.block_names;
  }
  ++steps_;
  samples_ += result.samples;
  flops_ += result.flops > 0 ? result.flops
                             : static_cast<double>(result.samples) * setup_.flops_per_sample;
  if (result.skipped) ++skipped_;
  for (const auto& [name, value] : result.metrics) metric_sums_[name] += value;
}

void TrainingMeter::restart_clock() { interval_start_ = Clock::now(); }

IntervalFigures TrainingMeter::close_interval() {
  IntervalFigures figures;
  if (steps_ == 0) return figures;
  const double seconds = std::chrono::duration<double>(Clock::now() - interval_start_).count();
  const auto steps = static_cast<double>(steps_);
  // The only device sync of the interval: the loss, then the phase events.
  std::vector<double> held = {loss_sum_.defined() ? loss_sum_.item<double>() : 0.0,
                              static_cast<double>(loss_steps_), flops_, 1.0};
  if (setup_.sum_over_ranks) held = setup_.sum_over_ranks(std::move(held));
  PhaseRollup rollup = phases_.rollup();
  const double samples_per_s = seconds > 0 ? static_cast<double>(samples_) / seconds : 0;
  auto& values = figures.values;
  if (held[1] > 0) {
    figures.mean_loss = held[0] / held[1];
    values.emplace_back("loss", figures.mean_loss);
  }
  values.emplace_back("samples_per_s", samples_per_s);
  if (setup_.tokens_per_sample > 0) {
    values.emplace_back("tokens_per_s",
                        samples_per_s * static_cast<double>(setup_.tokens_per_sample));
  }
  // The FLOPs of the whole step over the time and every rank's peak: the same measure for every
  // strategy, whatever piece of the model and of the batch each rank holds.
  if (held[2] > 0 && setup_.peak_flops > 0 && seconds > 0) {
    values.emplace_back("mfu", held[2] / (seconds * held[3] * setup_.peak_flops));
  }
  values.emplace_back("step_time_ms", 1000.0 * seconds / steps);
  const double measured_steps = static_cast<double>(std::max<std::int64_t>(1, rollup.steps));
  for (int index = 0; index < kStepPhaseCount; ++index) {
    const auto phase = static_cast<StepPhase>(index);
    values.emplace_back(std::string(step_phase_name(phase)) + "_ms",
                        rollup.total_ms[static_cast<std::size_t>(index)] / measured_steps);
    total_phase_ms_[static_cast<std::size_t>(index)] +=
        rollup.total_ms[static_cast<std::size_t>(index)];
  }
  const double wait_s = rollup.at(StepPhase::DataWait) / 1000.0;
  values.emplace_back("data_wait_share", seconds > 0 ? std::min(1.0, wait_s / seconds) : 0);
  if (last_grad_norm_.defined()) {
    values.emplace_back("grad_norm", last_grad_norm_.item<double>());
    values.emplace_back("grad_norm_max", max_grad_norm_.item<double>());
  }
  if (last_block_grad_norms_.defined()) {
    const at::Tensor norms = last_block_grad_norms_.to(at::kCPU, at::kDouble);
    for (std::size_t b = 0; b < block_names_.size(); ++b) {
      values.emplace_back("grad_norm/" + block_names_[b], norms[static_cast<std::int64_t>(b)].item<double>());
    }
  }
  if (skipped_ > 0) values.emplace_back("skipped_steps", static_cast<double>(skipped_));
  for (const auto& [name, sum] : metric_sums_) {
    values.emplace_back(name, sum / steps);
    if (name.ends_with("_bytes")) total_bytes_[name] += sum;
  }
  figures.spans = std::move(rollup.spans);

  total_train_s_ += seconds;
  total_steps_ += steps_;
  loss_sum_ = at::Tensor();
  loss_steps_ = 0;
  steps_ = 0;
  samples_ = 0;
  flops_ = 0;
  skipped_ = 0;
  last_grad_norm_ = at::Tensor();
  max_grad_norm_ = at::Tensor();
  last_block_grad_norms_ = at::Tensor();
  metric_sums_.clear();
  interval_start_ = Clock::now();
  return figures;
}

double TrainingMeter::phase_share(StepPhase phase) const {
  double total = 0;
  for (double ms : total_phase_ms_) total += ms;
  return total > 0 ? total_phase_ms_[static_cast<std::size_t>(phase)] / total : 0;
}

std::vector<std::pair<std::string, double>> TrainingMeter::traffic_per_step() const {
  std::vector<std::pair<std::string, double>> out;
  if (total_steps_ == 0) return out;
  const auto steps = static_cast<double>(total_steps_);
  for (const auto& [name, total] : total_bytes_) out.emplace_back(name + "_per_step", total / steps);
  // The data-parallel group's counts, under whatever names its members share ("dp/dp_shard").
  const auto sent = std::find_if(total_bytes_.begin(), total_bytes_.end(), [](const auto& entry) {
    return entry.first == "comm_dp_bytes" ||
           (entry.first.starts_with("comm_dp/") && entry.first.ends_with("_bytes"));
  });
  const auto buckets = total_bytes_.find("gradient_bytes");
  if (sent != total_bytes_.end() && buckets != total_bytes_.end() && buckets->second > 0) {
    out.emplace_back("gradient_traffic_share", sent->second / buckets->second);
  }
  return out;
}

std::vector<std::string> TrainingMeter::bottleneck_report(
    const std::optional<std::string>& faster_precision) const {
  if (total_steps_ == 0) return {};
  return describe_bottleneck(total_phase_ms_, total_steps_,
                             1000.0 * total_train_s_ / static_cast<double>(total_steps_),
                             faster_precision);
}

}  // namespace trainyard
