#pragma once
// How a pipeline cuts a model's blocks into stages: consecutive runs of blocks, named in the
// recipe or balanced by cost. Pure logic: no tensors.

#include <string>
#include <vector>

#include "trainyard/api/build_context.hpp"

namespace trainyard {

// Stages from the recipe: each entry lists one stage's blocks by name, separated by commas
// ("embed, layer0"), in forward order. Together they must name every block of `block_names`
// exactly once, in order, in `stage_count` stages. Throws Error naming what is wrong (an
// unknown, missing, repeated or out-of-order block, or the wrong number of stages).
std::vector<BlockRange> named_stages(const std::vector<std::string>& stages,
                                     const std::vector<std::string>& block_names, int stage_count);

// What a pipeline balances its stages by: each block's FLOPs per sample when the model reports
// any, else each block's parameter count.
std::vector<double> stage_balancing_costs(std::vector<double> block_flops,
                                          std::vector<double> block_parameters);

// `stage_count` consecutive runs of the blocks, each at least one block, whose largest summed
// cost is the smallest possible (ties: the earliest cut that achieves it, so every rank computes
// the same cut). Throws Error naming the numbers when there are fewer blocks than stages or a
// cost is negative or not finite.
std::vector<BlockRange> balanced_stages(const std::vector<double>& block_costs, int stage_count);

// One line per stage: "stage 1: layer1..head (3 blocks, 41.2% of the cost)"; the cost share is
// left out when `block_costs` is empty.
std::vector<std::string> describe_stages(const std::vector<BlockRange>& stages,
                                         const std::vector<std::string>& block_names,
                                         const std::vector<double>& block_costs);

// The cut in one line, as a checkpoint's layout records it: "stages embed,layer0|layer1,head".
std::string stage_cut_key(const std::vector<BlockRange>& stages,
                          const std::vector<std::string>& block_names);

}  // namespace trainyard
