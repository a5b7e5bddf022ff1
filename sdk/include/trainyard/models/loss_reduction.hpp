#pragma once
// The `loss_reduction` option of models whose loss can be a mean or a sum over its terms,
// declared and read in one place so every model spells and checks it alike.

#include <string>

#include "trainyard/api/config.hpp"
#include "trainyard/api/model.hpp"

namespace trainyard {

// The option "loss_reduction": "mean" (the default) or "sum"; `help` says over what.
OptionSpec loss_reduction_option(std::string help);
// The reduction that the section's "loss_reduction" names. Validation already refuses other
// values; this refuses them too (naming the value) for a section built without it.
LossReduction loss_reduction_from(const Config& options);

}  // namespace trainyard
