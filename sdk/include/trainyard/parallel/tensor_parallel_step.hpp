#pragma once
// What a step does differently when tensor-parallel ranks hold shards of some parameters (a
// model's parameter_layout says which): the gradient norm sums the shards' squares over the tp
// group and counts whole copies once, the decision to skip a step is agreed over the group, and
// the whole model is assembled from the shards for export.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/parameter_pieces.hpp"

namespace c10d {
class Backend;
}

namespace trainyard {

// The sum of squares of `split` gradients (each rank's shard) over `group`, plus those of
// `whole` gradients (copies every rank holds alike) once. Collective over a non-null group.
at::Tensor squares_over_group(const std::vector<at::Tensor>& split,
                              const std::vector<at::Tensor>& whole,
                              const c10::intrusive_ptr<c10d::Backend>& group);

// found_inf (one element) becomes its maximum over `group`; unchanged when undefined or the
// group is null.
void agree_on_found_inf(at::Tensor& found_inf, const c10::intrusive_ptr<c10d::Backend>& group);

// The whole tensors that `held` (with `layouts`, pieces of whole parameters as boxes) cut out,
// assembled on every rank of `group` from every rank's pieces, by parameter name. Tensors held
// whole are taken as they are. Collective over a non-null group (every rank passes its tensors
// in the same order, each of the same shape on every rank); with a null group every layout
// must be whole.
TensorMap gather_whole_tensors(const std::vector<at::Tensor>& held,
                               const std::vector<HeldLayout>& layouts,
                               const c10::intrusive_ptr<c10d::Backend>& group);

}  // namespace trainyard
