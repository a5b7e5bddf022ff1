#pragma once
// `trainyard launch`: starts the ranks of a multi-process run on this machine.

#include <string>
#include <vector>

namespace trainyard {

// Runs `trainyard run` once per local rank with the torchrun variables set, prefixes each rank's
// output lines with "[rank R] ", forwards signals, and returns the exit status of the first rank
// that fails (after stopping the others), or 0.
int command_launch(const std::vector<std::string>& args);

}  // namespace trainyard
