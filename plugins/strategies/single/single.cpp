// One device, one process: the reference every parallel strategy is compared against.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <optional>

#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/gradients.hpp"
#include "trainyard/parallel/held_blocks.hpp"
#include "trainyard/parallel/micro_batch.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/parallel/block_norms.hpp"
#include "trainyard/parallel/replicated_step.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {
namespace {

class Single final : public Strategy {
 public:
  void setup(StrategyContext& context) override {
    // Refused before anything is built: a launch of several processes is a mistake here.
    if (context.communicator && context.communicator->world_size() > 1) {
      throw Error("strategy 'single' runs one process, but this run has " +
                  std::to_string(context.communicator->world_size()) +
                  " processes; use [strategy] plugin = \"ddp\", or start one process");
    }
    context_ = context;
    model_ = context.make_model(context.build);
    model_->module().to(context.build.device);
    model_->module().train();
    blocks_ = with_activation_checkpointing(held_blocks(*model_), context.step.activation_checkpointing,
                                            context.device_backend);
    parameters_ = model_->module().parameters(true);
    layouts_ = parameter_layouts(*model_);
    if (context.step.block_grad_norms) parameter_blocks_.emplace(*model_);
    optimizer_ = context.optimizer->create(parameters_);
    autocast_dtype_ = context.precision->autocast_dtype();
  }

  StepResult train_step(std::span<const Batch> micro_batches) override {
    const auto count = static_cast<std::int64_t>(micro_batches.size());
    optimizer_->zero_grad(/*set_to_none=*/true);
    torch::Tensor loss_sum;
    StepResult result;
    for (const auto& batch : micro_batches) {
      torch::Tensor detached =
          forward_backward(*model_, blocks_, batch, count, context_, autocast_dtype_);
      loss_sum = loss_sum.defined() ? loss_sum + detached : detached;
      result.samples += batch.size;
    }
    finish_replicated_step(parameters_, layouts_, context_, *optimizer_, loss_sum, count, result,
                           parameter_blocks_ ? &*parameter_blocks_ : nullptr);
    return result;
  }

  EvalResult eval_step(const Batch& batch) override {
    return evaluate_blocks(*model_, blocks_, batch, context_.build.device.type(), autocast_dtype_);
  }

  void set_learning_rate(double lr) override { trainyard::set_learning_rate(*optimizer_, lr); }

  // Whole tensors, as placed pieces any strategy reads; loads from any layout's pieces.
  void save_state(CheckpointState& out) const override {
    mark_pieces_format(out.shared);
    save_whole_module_state(model_->module(), *context_.optimizer, optimizer_.get(), out.shared);
  }

  void load_state(const CheckpointState& in) override {
    require_pieces_format(in);
    load_whole_module_state(model_->module(), *context_.optimizer, optimizer_.get(),
                            PlacedState(in));
  }

  std::vector<torch::Tensor> optimizer_stepped_tensors() const override {
    return stepped_tensors(*optimizer_);
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
  std::vector<HeldLayout> layouts_;  // whole parameters, for naming a non-finite gradient
  std::optional<ParameterBlocks> parameter_blocks_;  // with run.grad_norm_blocks
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torch::ScalarType> autocast_dtype_;
};

void register_components(Registry& registry) {
  registry.add<Strategy>(
      "single", {}, "one process on one device (cpu or cuda)",
      [](const Config&, const BuildContext&) { return std::make_unique<Single>(); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("single", "1.0.0", trainyard::register_components)
