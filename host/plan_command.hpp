#pragma once
// `trainyard plan RECIPE [--set ...] [--nproc N] [--json]`: what each rank of the recipe's
// layout will hold (parameters, gradients, optimizer state, activations) and the step's peak
// with its phase, before any process starts (memory_plan.hpp).

#include <string>
#include <vector>

namespace trainyard {

class Registry;

int command_plan(const std::vector<std::string>& args, Registry& registry);

}  // namespace trainyard
