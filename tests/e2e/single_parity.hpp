#pragma once
// The bundled gpt_text recipe (shrunk to a 2-layer model on its fortunes corpus for speed) under a
// multi-rank strategy against one process on the same global batch: the logged loss of every
// step (the mean over the ranks, which is the global batch's) and the final parameters within
// PyTorch's fp32 tolerances, rtol 1.3e-6 and atol 1e-5. Each strategy is compared with `single`
// directly, not through another strategy.

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard::testing {

// `strategy` (its options as "--set" pairs) on `ranks` ranks of `batch` sequences each against
// one process on ranks * batch.
void expect_matches_single(const std::string& strategy, const std::vector<std::string>& options,
                           int ranks, std::int64_t batch);

// The "--set" pair choosing fsdp's sharding mode.
std::vector<std::string> sharding(const std::string& mode);

}  // namespace trainyard::testing
