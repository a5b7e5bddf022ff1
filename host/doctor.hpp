#pragma once
// `trainyard doctor`: checks the environment a run needs, one line per check.

#include <string>
#include <vector>

#include "trainyard/api/registry.hpp"

namespace trainyard {

int command_doctor(const std::vector<std::string>& args, Registry& registry);

}  // namespace trainyard
