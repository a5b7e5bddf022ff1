#pragma once
// What `trainyard validate` checks beyond the recipe's keys: that the recipe's model builds.

#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

// Builds the recipe's dataset (for the shapes the model is built from) and then its whole model
// on the meta device, which gives every tensor a shape and no memory. A model that refuses its
// options (gpt's n_heads that does not divide d_model) throws the Error it would throw in a run,
// before any process starts or any memory is allocated. `resolved` is a resolved recipe.
void check_model_builds(const Recipe& resolved, const Registry& registry);

}  // namespace trainyard
