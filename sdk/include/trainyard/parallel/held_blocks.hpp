#pragma once
// A model's blocks as a strategy keeps them: each block's module and forward closure are the
// model plugin's code, so each holds the plugin's library loaded for as long as it lives, and a
// block kept after its model (and the registry) are gone still runs.

#include <vector>

#include "trainyard/api/model.hpp"

namespace trainyard {

// model.blocks(), each block holding model.library() (nothing more for a model built into the
// host). Strategies take their blocks through this rather than model.blocks().
std::vector<Block> held_blocks(Model& model);

}  // namespace trainyard
