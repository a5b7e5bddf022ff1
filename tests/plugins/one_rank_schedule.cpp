// A strategy that is not the bundled pipeline but runs by a pipeline schedule: one rank holding
// the whole model runs its K micro-batches as 1F1B does on one rank (F0 B0 F1 B1 ...). It
// declares that schedule in the run's folder and records its first step's forwards and
// backwards as a measured timeline, through the SDK alone, so the tests can show that reports
// draw any plugin's schedule, not only the plugin named "pipeline".

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <chrono>

#include "trainyard/parallel/declared_schedule.hpp"
#include "trainyard/parallel/gradients.hpp"
#include "trainyard/parallel/held_blocks.hpp"
#include "trainyard/api/held_bytes.hpp"
#include "trainyard/parallel/micro_batch.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/parallel/pipeline_timeline.hpp"
#include "trainyard/api/placed_state.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/parallel/replicated_step.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;

class OneRankSchedule final : public Strategy {
 public:
  void setup(StrategyContext& context) override {
    context_ = context;
    model_ = context.make_model(context.build);
    model_->module().to(context.build.device);
    model_->module().train();
    blocks_ = held_blocks(*model_);
    parameters_ = model_->module().parameters(true);
    optimizer_ = context.optimizer->create(parameters_);
    autocast_dtype_ = context.precision->autocast_dtype();
    shape_ = {1, static_cast<int>(context.step.accumulation), 1};
    if (!context.build.output_dir.empty()) {
      write_declared_schedule(context.build.output_dir, {"1f1b", shape_});
    }
  }

  StepResult train_step(std::span<const Batch> micro_batches) override {
    const auto count = static_cast<std::int64_t>(micro_batches.size());
    const bool recording = steps_++ == 0 && !context_.build.output_dir.empty();
    const Clock::time_point origin = Clock::now();
    auto since_origin = [&] {
      return std::chrono::duration<double, std::micro>(Clock::now() - origin).count();
    };
    RankTimeline timeline{"1f1b", 1, shape_.micro_batches, 1, 1, 0, 0, 0, {}};
    optimizer_->zero_grad(/*set_to_none=*/true);
    torch::Tensor loss_sum;
    StepResult result;
    for (std::int64_t i = 0; i < count; ++i) {
      const int micro_batch = static_cast<int>(i);
      const double started = since_origin();
      double forward_end = started;
      torch::Tensor detached =
          forward_backward(*model_, blocks_, micro_batches[static_cast<std::size_t>(i)], count,
                           context_, autocast_dtype_, [&] { forward_end = since_origin(); });
      timeline.actions.push_back(
          {{PipelineActionKind::kForward, 0, micro_batch}, started, forward_end});
      timeline.actions.push_back(
          {{PipelineActionKind::kBackward, 0, micro_batch}, forward_end, since_origin()});
      loss_sum = loss_sum.defined() ? loss_sum + detached : detached;
      result.samples += micro_batches[static_cast<std::size_t>(i)].size;
    }
    finish_replicated_step(parameters_, parameter_layouts(*model_), context_, *optimizer_, loss_sum,
                           count, result);
    if (recording) {
      write_measured_timeline(measured_timeline_file(context_.build.output_dir, 0, 1), timeline);
    }
    return result;
  }

  EvalResult eval_step(const Batch& batch) override {
    return evaluate_blocks(*model_, blocks_, batch, context_.build.device.type(), autocast_dtype_);
  }

  void set_learning_rate(double lr) override { trainyard::set_learning_rate(*optimizer_, lr); }

  void save_state(CheckpointState& out) const override {
    mark_pieces_format(out.shared);
    save_whole_module_state(model_->module(), *context_.optimizer, optimizer_.get(), out.shared);
  }

  void load_state(const CheckpointState& in) override {
    require_pieces_format(in);
    load_whole_module_state(model_->module(), *context_.optimizer, optimizer_.get(),
                            PlacedState(in));
  }

  TensorMap full_parameters() const override {
    TensorMap out;
    for (const auto& item : model_->module().named_parameters(true)) {
      out[item.key()] = item.value().detach();
    }
    return out;
  }

  HeldBytes held_bytes() const override {
    return count_held_bytes(parameters_, optimizer_.get(), *context_.optimizer);
  }

 private:
  StrategyContext context_;
  std::shared_ptr<Model> model_;
  std::vector<Block> blocks_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torch::ScalarType> autocast_dtype_;
  PipelineShape shape_;
  std::int64_t steps_ = 0;
};

void register_components(Registry& registry) {
  registry.add<Strategy>(
      "one_rank_schedule", {},
      "one process running its micro-batches by a declared one-rank 1F1B schedule",
      [](const Config&, const BuildContext&) { return std::make_unique<OneRankSchedule>(); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("one_rank_schedule", "1.0.0", trainyard::register_components)
