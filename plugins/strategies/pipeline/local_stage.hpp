#pragma once
// One pipeline stage as this rank holds it: a build of the model with only the stage's blocks,
// its parameters under their own and the whole model's names, and how its data-parallel ranks
// hold them.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "stage_parameters.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/parallel/pipeline_stages.hpp"

namespace trainyard {

struct LocalStage {
  int index = 0;  // in the whole pipeline, 0 .. stages - 1
  BlockRange blocks;
  std::shared_ptr<Model> model;
  std::vector<Block> run;  // the blocks as they run (activation checkpointing applied)
  bool first = false;
  bool last = false;
  std::vector<at::Tensor> parameters;    // whole, as the model built them
  std::vector<std::string> names;        // in this build's module
  std::vector<std::string> whole_names;  // in the whole model (a tied copy: the tied name)
  // True for a stage's copy of a tied parameter (the gpt head's copy of the embedding): saved
  // as a piece of the tied parameter like the owner's, counted once in norms and gathers.
  std::vector<bool> tied_copy;
  // How the stage holds each parameter: whole, or the model's tensor-parallel shards; pieces of
  // tied copies are named by the tied parameter.
  std::vector<HeldLayout> layouts;
  std::vector<at::Tensor> buffers;
  std::vector<std::string> buffer_names;
  // How the stage's data-parallel ranks hold the parameters: replicated or sharded.
  std::unique_ptr<StageParameters> held;
  // Index in the rank's action list of the last action that computes this stage's weight
  // gradients: the backward that synchronises them across data-parallel ranks.
  std::size_t last_weight_action = 0;
};

// The stage of pipeline index `index` among this rank's, or null when another rank holds it.
inline LocalStage* find_stage(std::vector<LocalStage>& stages, int index) {
  for (auto& stage : stages) {
    if (stage.index == index) return &stage;
  }
  return nullptr;
}

}  // namespace trainyard
