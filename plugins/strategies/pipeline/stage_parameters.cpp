#include "stage_parameters.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <set>

#include "trainyard/api/error.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/parallel/gradients.hpp"

namespace trainyard {

std::vector<at::Tensor> StageParameters::gradients() const { return gradients_of(optimized()); }

namespace {

at::Tensor sum_of_squares(const std::vector<at::Tensor>& gradients, at::Device device) {
  at::Tensor total = at::zeros({}, at::TensorOptions(at::kFloat).device(device));
  for (const auto& gradient : gradients) {
    total = total + gradient.detach().to(at::kFloat).square().sum();
  }
  return total;
}

// [squares of the tensor-parallel pieces, squares of the whole parameters].
at::Tensor split_and_whole_squares(const std::vector<at::Tensor>& split,
                                   const std::vector<at::Tensor>& whole, at::Device device) {
  return at::stack({sum_of_squares(split, device), sum_of_squares(whole, device)});
}

class ReplicatedStageParameters final : public StageParameters {
 public:
  ReplicatedStageParameters(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                            std::vector<Block> blocks, std::vector<HeldLayout> layouts,
                            const c10::intrusive_ptr<c10d::Backend>& group,
                            const GradientReducerOptions& options)
      : parameters_(std::move(parameters)),
        blocks_(std::move(blocks)),
        layouts_(std::move(layouts)) {
    std::vector<at::Tensor> trainable;
    std::vector<std::string> trainable_names;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (!parameters_[i].requires_grad()) continue;
      trainable.push_back(parameters_[i]);
      trainable_names.push_back(names[i]);
    }
    if (group && !trainable.empty()) {
      reducer_ = std::make_unique<GradientReducer>(trainable, trainable_names, group, options);
    }
  }

  const std::vector<Block>& blocks() const override { return blocks_; }
  std::vector<at::Tensor> optimized() const override { return parameters_; }

  void zero_gradients() override {
    if (reducer_) {
      reducer_->zero_gradients();
      return;
    }
    for (auto& parameter : parameters_) parameter.mutable_grad() = at::Tensor();
  }
  void before_backward(bool synchronise) override {
    if (reducer_) reducer_->prepare(synchronise);
  }
  void after_backward() override {}
  void finish() override {
    if (!reducer_) return;
    try {
      reducer_->finish();
    } catch (const UnusedParametersError& error) {
      std::string list;
      for (const auto& name : error.names()) list += (list.empty() ? "" : ", ") + name;
      throw Error("pipeline: parameters got no gradient in this step (" + list + ")");
    }
  }

  at::Tensor whole_gradient(std::size_t parameter) override {
    const at::Tensor& grad = parameters_[parameter].grad();
    return grad.defined() ? grad : at::zeros_like(parameters_[parameter]);
  }
  void set_whole_gradient(std::size_t parameter, const at::Tensor& gradient) override {
    at::Tensor& grad = parameters_[parameter].mutable_grad();
    if (grad.defined()) {
      grad.copy_(gradient);
    } else {
      grad = gradient.clone();
    }
  }
  at::Tensor gradient_squares() const override {
    std::vector<at::Tensor> split;
    std::vector<at::Tensor> whole;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const at::Tensor& grad = parameters_[i].grad();
      if (grad.defined()) (holds_whole(layouts_[i]) ? whole : split).push_back(grad);
    }
    return split_and_whole_squares(split, whole, parameters_.front().device());
  }
  at::Tensor block_gradient_squares(const ParameterBlocks& blocks) const override {
    std::vector<at::Tensor> gradients;
    for (const auto& parameter : parameters_) gradients.push_back(parameter.grad());
    return block_squares(
        gradients, layouts_, blocks,
        [&](std::size_t i, const ParameterPiece&) { return !holds_whole(layouts_[i]); },
        parameters_.front().device());
  }
  void combine_found_inf(at::Tensor&) const override {}  // equal gradients on every rank

  std::vector<HeldLayout> layouts(const std::vector<std::string>&) const override {
    return layouts_;
  }
  std::vector<at::Tensor> whole_parameters() const override {
    std::vector<at::Tensor> out;
    for (const auto& parameter : parameters_) out.push_back(parameter.detach());
    return out;
  }
  void release() override {}
  BucketCompressor* compressor() const override {
    return reducer_ ? reducer_->compressor() : nullptr;
  }
  std::int64_t gradient_bytes() const override { return reducer_ ? reducer_->bucket_bytes() : 0; }
  HeldBytes held_bytes(const torch::optim::Optimizer* optimizer,
                       const Optimizer& plugin) const override {
    return count_held_bytes(parameters_, optimizer, plugin,
                            reducer_ ? reducer_->bucket_buffers() : std::vector<at::Tensor>{});
  }

 private:
  std::vector<at::Tensor> parameters_;
  std::vector<Block> blocks_;
  std::vector<HeldLayout> layouts_;
  std::unique_ptr<GradientReducer> reducer_;
};

class ShardedStageParameters final : public StageParameters {
 public:
  ShardedStageParameters(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                         const std::vector<Block>& blocks, std::vector<HeldLayout> layouts,
                         const c10::intrusive_ptr<c10d::Backend>& shard_group,
                         const c10::intrusive_ptr<c10d::Backend>& replicate_group,
                         const ShardedUnitsOptions& options)
      : parameters_(parameters),
        names_(names),
        layouts_(std::move(layouts)),
        shard_group_(shard_group) {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (!holds_whole(layouts_[i])) split_names_.insert(layouts_[i].front().name);
      if (!parameters_[i].requires_grad()) {
        throw Error(frozen_under_sharding(names_[i]));
      }
    }
    units_ = std::make_unique<ShardedUnits>(std::move(parameters), std::move(names), blocks,
                                            shard_group, options);
    // Hybrid sharding: the shards' gradients averaged across the replicate groups too.
    units_->average_over(replicate_group);
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      const ShardedUnitLayout& layout = units_->layout(u);
      for (std::size_t k = 0; k < layout.parameters.size(); ++k) {
        place_[layout.parameters[k]] = {u, layout.offsets[k]};
      }
    }
  }

  const std::vector<Block>& blocks() const override { return units_->blocks(); }
  std::vector<at::Tensor> optimized() const override { return units_->shards(); }

  void zero_gradients() override {
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      units_->shard(u).mutable_grad() = at::Tensor();
    }
  }
  void before_backward(bool synchronise) override {
    units_->prepare_backward(synchronise);
  }
  void before_weight_backward(bool synchronise) override {
    units_->gather_all();
    before_backward(synchronise);
  }
  void after_backward() override {
    units_->finish_backward();
  }
  void finish() override {}  // each synchronising backward waited for its reductions

  at::Tensor whole_gradient(std::size_t parameter) override {
    const auto [unit, offset] = place_.at(parameter);
    const at::Tensor& shard = units_->shard(unit);
    const at::Tensor grad = shard.grad().defined() ? shard.grad() : at::zeros_like(shard);
    const at::Tensor flat = units_->gather_copy(unit, grad);
    const at::Tensor& whole = parameters_[parameter];
    return flat.narrow(0, offset, whole.numel()).view(whole.sizes()).clone();
  }
  void set_whole_gradient(std::size_t parameter, const at::Tensor& gradient) override {
    const auto [unit, offset] = place_.at(parameter);
    const at::Tensor& shard = units_->shard(unit);
    at::Tensor& grad = shard.mutable_grad();
    if (!grad.defined()) grad = at::zeros_like(shard);
    // The part of the parameter's elements that falls into this rank's shard.
    const std::int64_t shard_begin = units_->shard_rank() * shard.numel();
    const std::int64_t begin = std::max(shard_begin, offset);
    const std::int64_t end =
        std::min(shard_begin + shard.numel(), offset + parameters_[parameter].numel());
    if (begin >= end) return;
    at::NoGradGuard no_grad;
    grad.narrow(0, begin - shard_begin, end - begin)
        .copy_(gradient.reshape({-1}).narrow(0, begin - offset, end - begin));
  }
  at::Tensor gradient_squares() const override {
    const std::vector<HeldLayout> shard_layouts = layouts({});
    std::vector<at::Tensor> split;
    std::vector<at::Tensor> whole;
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      const at::Tensor& grad = units_->shard(u).grad();
      if (!grad.defined()) continue;
      const at::Tensor flat = grad.detach().reshape({-1});
      for (const ParameterPiece& piece : shard_layouts[u]) {
        (split_names_.count(piece.name) ? split : whole)
            .push_back(flat.narrow(0, piece.offset, piece.length));
      }
    }
    std::vector<at::Tensor> squares{
        split_and_whole_squares(split, whole, units_->shard(0).device())};
    if (units_->shard_ranks() > 1) {  // replicated units each hold every gradient
      CollectiveWait wait;
      shard_group_->allreduce(squares)->wait();
    }
    return squares[0];
  }
  at::Tensor block_gradient_squares(const ParameterBlocks& blocks) const override {
    std::vector<at::Tensor> gradients;
    for (std::size_t u = 0; u < units_->unit_count(); ++u) gradients.push_back(units_->shard(u).grad());
    std::vector<at::Tensor> squares{block_squares(
        gradients, layouts({}), blocks,
        [&](std::size_t, const ParameterPiece& piece) { return split_names_.count(piece.name) > 0; },
        units_->shard(0).device())};
    if (units_->shard_ranks() > 1) {  // replicated units each hold every gradient
      CollectiveWait wait;
      shard_group_->allreduce(squares)->wait();
    }
    return squares[0];
  }
  void combine_found_inf(at::Tensor& found_inf) const override {
    units_->combine_found_inf(found_inf);
  }

  // The units' shards as pieces of the parameters as the stage holds them (named by the whole
  // model's names already: the layouts given at construction).
  std::vector<HeldLayout> layouts(const std::vector<std::string>&) const override {
    std::vector<HeldLayout> out;
    for (std::size_t u = 0; u < units_->unit_count(); ++u) {
      const ShardedUnitLayout& unit = units_->layout(u);
      std::vector<HeldLayout> held;
      std::vector<std::int64_t> numels;
      for (std::size_t i : unit.parameters) {
        held.push_back(layouts_[i]);
        numels.push_back(parameters_[i].numel());
      }
      out.push_back(flat_shard_layout(held, numels, units_->shard_rank() * unit.shard_numel,
                                      unit.shard_numel));
    }
    return out;
  }
  std::vector<at::Tensor> whole_parameters() const override {
    const std::map<std::string, at::Tensor> full = units_->full_parameters();
    std::vector<at::Tensor> out;
    for (const auto& name : names_) out.push_back(full.at(name));
    return out;
  }
  void release() override { units_->release_all(); }
  HeldBytes held_bytes(const torch::optim::Optimizer* optimizer,
                       const Optimizer& plugin) const override {
    return units_->held_bytes(optimizer, plugin);
  }

 private:
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<HeldLayout> layouts_;    // whole, or this tp rank's boxes, by the whole model's names
  std::set<std::string> split_names_;  // parameters held as tensor-parallel pieces
  c10::intrusive_ptr<c10d::Backend> shard_group_;
  std::unique_ptr<ShardedUnits> units_;
  std::map<std::size_t, std::pair<std::size_t, std::int64_t>> place_;  // unit and flat offset
};

}  // namespace

std::unique_ptr<StageParameters> replicated_stage_parameters(
    std::vector<at::Tensor> parameters, std::vector<std::string> names, std::vector<Block> blocks,
    std::vector<HeldLayout> layouts, const c10::intrusive_ptr<c10d::Backend>& group,
    const GradientReducerOptions& options) {
  return std::make_unique<ReplicatedStageParameters>(std::move(parameters), std::move(names),
                                                     std::move(blocks), std::move(layouts), group,
                                                     options);
}

std::unique_ptr<StageParameters> sharded_stage_parameters(
    std::vector<at::Tensor> parameters, std::vector<std::string> names,
    const std::vector<Block>& blocks, std::vector<HeldLayout> layouts,
    const c10::intrusive_ptr<c10d::Backend>& shard_group,
    const c10::intrusive_ptr<c10d::Backend>& replicate_group, const ShardedUnitsOptions& options) {
  return std::make_unique<ShardedStageParameters>(std::move(parameters), std::move(names), blocks,
                                                  std::move(layouts), shard_group, replicate_group,
                                                  options);
}

std::string frozen_under_sharding(const std::string& name) {
  return "pipeline: parameter '" + name +
         "' is frozen (requires no gradient); dp_sharding shards trainable parameters only: set "
         "dp_sharding = \"none\", or use fsdp, which keeps frozen parameters whole";
}

}  // namespace trainyard
