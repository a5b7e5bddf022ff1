#pragma once
// Parameters several pipeline stages hold (a tied token embedding and output head): each holding
// stage computes its own gradient, and before the optimizer steps every holder gets their sum.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "local_stage.hpp"
#include "trainyard/parallel/block_norms.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"
#include "trainyard/parallel/pipeline_stages.hpp"

namespace trainyard {

class StageChannel;

// One tied parameter: the stages that hold it, and which of this rank's parameters it is.
struct TiedGroup {
  std::string name;
  std::vector<int> stages;           // holding stages, ascending
  std::map<int, std::size_t> local;  // stage -> index of the parameter this rank holds for it
};

class TiedWeights {
 public:
  // The tie's group, created the first time with every stage of `cut` that holds one of its
  // blocks. References stay valid as groups are added.
  TiedGroup& group(const TiedParameter& tie, const std::vector<BlockRange>& cut,
                   const std::vector<std::string>& block_names);

  // Every holder's gradient becomes the sum of all holders' gradients, added in stage order so
  // that each rank computes exactly the same value; the holders on other pp ranks exchange
  // theirs over `channel`.
  void sum_gradients(std::vector<LocalStage>& stages, StageChannel* channel,
                     const PipelineShape& shape, int pp_rank);

 private:
  std::deque<TiedGroup> groups_;
};

// The sums of squares of the gradients of this rank's tied copies, which a norm counts once (with
// the owner), as StageParameters::gradient_squares gives them: [tensor-parallel pieces, whole].
at::Tensor tied_copy_squares(const std::vector<LocalStage>& stages);
// The same per block, [2, blocks], each in the block that owns the tied parameter (the block its
// pieces' squares were counted in).
at::Tensor tied_copy_block_squares(const std::vector<LocalStage>& stages,
                                   const ParameterBlocks& blocks);

}  // namespace trainyard
