#include "tied_weights.hpp"

#include <ATen/ATen.h>

#include <set>

#include "stage_channel.hpp"
#include "trainyard/api/activations.hpp"

namespace trainyard {

TiedGroup& TiedWeights::group(const TiedParameter& tie, const std::vector<BlockRange>& cut,
                              const std::vector<std::string>& block_names) {
  for (auto& group : groups_) {
    if (group.name == tie.name) return group;
  }
  TiedGroup group;
  group.name = tie.name;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    for (std::int64_t b = cut[s].begin; b < cut[s].end; ++b) {
      const std::string& block = block_names[static_cast<std::size_t>(b)];
      bool uses = false;
      for (const auto& user : tie.blocks) uses = uses || user == block;
      if (uses) {
        group.stages.push_back(static_cast<int>(s));
        break;
      }
    }
  }
  groups_.push_back(std::move(group));
  return groups_.back();
}

void TiedWeights::sum_gradients(std::vector<LocalStage>& stages, StageChannel* channel,
                                const PipelineShape& shape, int pp_rank) {
  for (TiedGroup& group : groups_) {
    if (group.stages.size() < 2) continue;
    std::map<int, at::Tensor> grads;
    for (auto& [stage, parameter] : group.local) {
      grads[stage] = find_stage(stages, stage)->held->whole_gradient(parameter);
    }
    std::set<int> other_ranks;
    for (int stage : group.stages) {
      if (shape.rank_of_stage(stage) != pp_rank) other_ranks.insert(shape.rank_of_stage(stage));
    }
    std::vector<StageChannel::Pending> pending;
    std::vector<int> pending_stage;
    for (int peer : other_ranks) {
      for (auto& [stage, grad] : grads) {
        Activations one;
        one.tensors.emplace(group.name, grad);
        channel->send(one, peer, StageMessage::kTiedGradient, stage, 0, 0);
      }
      for (int stage : group.stages) {
        if (shape.rank_of_stage(stage) != peer) continue;
        pending.push_back(channel->receive(peer, StageMessage::kTiedGradient, stage, 0, 0));
        pending_stage.push_back(stage);
      }
    }
    for (std::size_t i = 0; i < pending.size(); ++i) {
      grads[pending_stage[i]] = channel->wait(pending[i]).tensors.at(group.name);
    }
    if (channel) channel->wait_sends();
    at::Tensor total;
    for (int stage : group.stages) {
      total = total.defined() ? total + grads.at(stage) : grads.at(stage).clone();
    }
    for (auto& [stage, parameter] : group.local) {
      find_stage(stages, stage)->held->set_whole_gradient(parameter, total);
    }
  }
}

namespace {

// The squares of each tied copy's whole gradient, added to `total` (moved to the gradients'
// device) at [kind] or [kind][block of the tied parameter]: kind 0 for tensor-parallel pieces,
// 1 for whole copies.
void add_tied_copy_squares(const std::vector<LocalStage>& stages, const ParameterBlocks* blocks,
                           at::Tensor& total) {
  for (const auto& stage : stages) {
    for (std::size_t i = 0; i < stage.parameters.size(); ++i) {
      if (!stage.tied_copy[i]) continue;
      const at::Tensor grad = stage.held->whole_gradient(i);
      const std::int64_t kind = holds_whole(stage.layouts[i]) ? 1 : 0;
      total = total.to(grad.device());
      at::Tensor slot = total[kind];
      if (blocks) slot = slot[blocks->index(stage.whole_names[i])];
      slot += grad.to(at::kFloat).square().sum();
    }
  }
}

}  // namespace

at::Tensor tied_copy_squares(const std::vector<LocalStage>& stages) {
  at::Tensor total = at::zeros({2}, at::kFloat);
  add_tied_copy_squares(stages, nullptr, total);
  return total;
}

at::Tensor tied_copy_block_squares(const std::vector<LocalStage>& stages,
                                   const ParameterBlocks& blocks) {
  at::Tensor total = at::zeros({2, blocks.count()}, at::kFloat);
  add_tied_copy_squares(stages, &blocks, total);
  return total;
}

}  // namespace trainyard
