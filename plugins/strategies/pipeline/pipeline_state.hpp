#pragma once
// What a pipeline rank's stages hold, as checkpoint pieces and as the whole model: saving and
// loading them in any layout's pieces, and gathering the whole model's tensors on every rank.

#include <c10/util/intrusive_ptr.h>

#include <vector>

#include "local_stage.hpp"
#include "trainyard/api/state.hpp"

namespace c10d {
class Backend;
}
namespace torch::optim {
class Optimizer;
}

namespace trainyard {

class Optimizer;

// How each optimized tensor of `stages` maps onto the whole model's parameters, in stage order.
std::vector<HeldLayout> stage_layouts(const std::vector<LocalStage>& stages);

// The bytes plain all-reduces of `stages`' gradient buckets carry per step (0: none).
std::int64_t gradient_bytes(const std::vector<LocalStage>& stages);

// Saves this rank's stages' parameters, buffers and optimizer state as pieces of the whole
// model's (a stage's copy of a tied parameter as another piece of it, equal to the owner's),
// and each stage's gradient-compression state as this rank's own.
// `replicas`: the mesh group whose ranks hold the same pieces (empty: none do).
void save_stages(const std::vector<LocalStage>& stages, const Optimizer& plugin,
                 const torch::optim::Optimizer& optimizer, const std::string& replicas,
                 CheckpointState& out);

// The reverse, from the pieces of any layout that cover what this rank's stages hold. Throws
// Error naming a buffer whose shape differs.
void load_stages(std::vector<LocalStage>& stages, const Optimizer& plugin,
                 torch::optim::Optimizer& optimizer, const CheckpointState& in);

// Where a rank sits in the pipeline, for gathering the whole model.
struct PipelinePlace {
  c10::intrusive_ptr<c10d::Backend> pp_group;  // null with one pipeline rank
  c10::intrusive_ptr<c10d::Backend> tp_group;  // null without tensor parallelism
  int pp_rank = 0;
  int pp_ranks = 1;
  at::Device device = at::kCPU;
};

// The whole model's parameters (and buffers when `buffers`) on every rank: tensor-parallel shards
// assembled over the tp group, then each pp rank in turn broadcasting its stages'. Tied copies
// are left out (the owner's tensor is the parameter).
TensorMap gather_whole_model(const std::vector<LocalStage>& stages, bool buffers,
                             const PipelinePlace& place);

}  // namespace trainyard
