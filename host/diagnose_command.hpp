#pragma once
// `trainyard diagnose DIR`: reads the flight records a hung or failed multi-process run left in
// DIR (a run's output folder, or its flight/ folder) and names the rank, the collective, the
// group and its number where the ranks parted (flight_diagnosis.hpp).

#include <string>
#include <vector>

namespace trainyard {

int command_diagnose(const std::vector<std::string>& args);

}  // namespace trainyard
