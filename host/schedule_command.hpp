#pragma once
// `trainyard schedule NAME --stages P --micro-batches M`: builds a pipeline schedule, validates
// and simulates it, and prints its timeline with the idle share per rank.

#include <string>
#include <vector>

namespace trainyard {

int command_schedule(const std::vector<std::string>& args);

}  // namespace trainyard
