#pragma once
// `trainyard compare`: runs variants of a recipe (or several recipes) one after another with the
// same seed and data, then prints a side-by-side table and writes an HTML report.

#include <string>
#include <vector>

namespace trainyard {

class Registry;

// Returns 0 when at least one variant finished; 1 when every variant failed. Bad options throw
// Error (one line) before anything runs.
int command_compare(const std::vector<std::string>& args, Registry& registry);

}  // namespace trainyard
