#pragma once
// What a pipeline needs of a model before cutting it into stages.

#include <cstdint>
#include <string>
#include <vector>

#include "trainyard/api/model.hpp"

namespace trainyard {

// The model's block names, when it builds stages and (unless the recipe names the stages) has
// at least one block for each of `ranks` x `virtual_stages` stages; an Error naming the fix
// otherwise.
std::vector<std::string> cuttable_block_names(Model& model, int ranks, std::int64_t virtual_stages,
                                              bool stages_named);

}  // namespace trainyard
