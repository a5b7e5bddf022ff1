#pragma once
// What a launcher must change when it restarts a group on fewer ranks than it started with: the
// world size it can use and the gradient accumulation that keeps the recipe's global batch.

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard {

struct GroupSize {
  int world_size = 0;
  std::int64_t grad_accumulation = 1;
};

// The largest group of at most `survivors` and at least `minimum` ranks on which the recipe's
// global batch (data-parallel ranks x batch_size x grad_accumulation, as planned for
// `planned_world` ranks) stays the same with a whole accumulation. `run_args` is what follows
// `trainyard run` (RECIPE and its --set options). Throws Error saying why no size fits.
GroupSize resize_group(const std::vector<std::string>& run_args, int planned_world, int survivors,
                       int minimum);

}  // namespace trainyard
