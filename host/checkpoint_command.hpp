#pragma once
// `trainyard checkpoint inspect|export`: look inside a checkpoint without training, and hand its
// weights to other tools.

#include <string>
#include <vector>

#include "trainyard/api/registry.hpp"

namespace trainyard {

int command_checkpoint(const std::vector<std::string>& args, Registry& registry);

}  // namespace trainyard
