#pragma once
// The pipeline's gradient norms: the sums of squares of this rank's stages' gradients, in all
// and per block of the whole model (run.grad_norm_blocks), reduced over the data- and
// tensor-parallel ranks, each parameter of the whole model counted once (tied copies left out).
// Both are still to be summed over the pipeline group.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <vector>

#include "local_stage.hpp"
#include "trainyard/parallel/block_norms.hpp"

namespace c10d {
class Backend;
}

namespace trainyard {

// A scalar on `device`. `sharded`: the stages hold their parameters sharded over the
// data-parallel ranks (dp_sharding). Collective over the stages' data-parallel groups (sharded)
// and `tp_group` (when not null).
at::Tensor stage_gradient_squares(const std::vector<LocalStage>& stages, bool sharded,
                                  const c10::intrusive_ptr<c10d::Backend>& tp_group,
                                  const at::Device& device);

// The same per block, [blocks] on `device`.
at::Tensor stage_block_squares(const std::vector<LocalStage>& stages, const ParameterBlocks& blocks,
                               bool sharded, const c10::intrusive_ptr<c10d::Backend>& tp_group,
                               const at::Device& device);

}  // namespace trainyard
