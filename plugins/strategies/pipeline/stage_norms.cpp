#include "stage_norms.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "stage_parameters.hpp"
#include "tied_weights.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/parallel/tensor_parallel_step.hpp"

namespace trainyard {

at::Tensor stage_gradient_squares(const std::vector<LocalStage>& stages, bool sharded,
                                  const c10::intrusive_ptr<c10d::Backend>& tp_group,
                                  const at::Device& device) {
  if (sharded) {
    // Flat shards mix parameters: the copies' squares are taken out again. Tensor-parallel
    // pieces' squares are then summed over the tp group; whole copies count once.
    at::Tensor squares = at::zeros({2}, at::kFloat).to(device);
    for (const auto& stage : stages) squares = squares + stage.held->gradient_squares();
    squares = (squares - tied_copy_squares(stages).to(squares.device())).clamp_min(0);
    std::vector<at::Tensor> pieces{squares.narrow(0, 0, 1).clone()};
    if (tp_group) {
      CollectiveWait wait;
      tp_group->allreduce(pieces)->wait();
    }
    return pieces[0][0] + squares[1];
  }
  std::vector<at::Tensor> split;
  std::vector<at::Tensor> whole;
  for (const auto& stage : stages) {
    for (std::size_t i = 0; i < stage.parameters.size(); ++i) {
      const at::Tensor& grad = stage.parameters[i].grad();
      if (!grad.defined() || stage.tied_copy[i]) continue;
      (holds_whole(stage.layouts[i]) ? whole : split).push_back(grad);
    }
  }
  return squares_over_group(split, whole, tp_group);
}

at::Tensor stage_block_squares(const std::vector<LocalStage>& stages, const ParameterBlocks& blocks,
                               bool sharded, const c10::intrusive_ptr<c10d::Backend>& tp_group,
                               const at::Device& device) {
  at::Tensor squares = at::zeros({2, blocks.count()}, at::kFloat).to(device);
  if (sharded) {
    // As above, the tied copies' squares taken out of the block that owns the tied parameter
    // (where the shards' pieces of them were counted).
    for (const auto& stage : stages) squares += stage.held->block_gradient_squares(blocks);
    squares = (squares - tied_copy_block_squares(stages, blocks).to(device)).clamp_min(0);
  } else {
    for (const auto& stage : stages) {
      std::vector<at::Tensor> gradients;
      for (const auto& parameter : stage.parameters) gradients.push_back(parameter.grad());
      squares += block_squares(
          gradients, stage.layouts, blocks,
          [&](std::size_t i, const ParameterPiece&) { return !holds_whole(stage.layouts[i]); },
          device, [&](std::size_t i) { return stage.tied_copy[i]; });
    }
  }
  if (tp_group) {
    std::vector<at::Tensor> split{squares[0].clone()};
    CollectiveWait wait;
    tp_group->allreduce(split)->wait();
    squares[0].copy_(split[0]);
  }
  return squares.sum(0);
}

}  // namespace trainyard
