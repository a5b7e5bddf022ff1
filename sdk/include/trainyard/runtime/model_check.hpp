#pragma once
// What `trainyard validate` checks beyond the recipe's keys: that the recipe's model builds, on
// the mesh the run would form.

#include <string>

#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

// Builds the recipe's dataset (for the shapes the model is built from) and then its whole model
// on the meta device, which gives every tensor a shape and no memory. A model that refuses its
// options (gpt's n_heads that does not divide d_model) throws the Error it would throw in a run,
// before any process starts or any memory is allocated. The recipe's strategy then checks the
// model (Strategy::check_model: a sharding mode its modules cannot take). `resolved` is a
// resolved recipe.
void check_model_builds(const Recipe& resolved, const Registry& registry);

// The recipe's [parallel] mesh on `world_size` processes (0: the product of its explicit sizes,
// dp_shard -1 counting as 1), as the run would resolve it (an Error naming the sizes when they do
// not make that many ranks), and then its model built on the meta device as each tensor-parallel
// rank of the first pipeline stage would build it (an Error such as "n_heads (3) does not divide
// by tp (2)"). Returns the mesh's description.
std::string check_layout_builds(const Recipe& resolved, const Registry& registry, int world_size);

}  // namespace trainyard
