#pragma once
// The median of a sample, as the run's guards and the comparison of runs take it.

#include <vector>

namespace trainyard {

// The middle value, or the mean of the two middle ones; 0 for no values.
double median(std::vector<double> values);

}  // namespace trainyard
