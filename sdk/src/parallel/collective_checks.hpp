#pragma once
// [comm] debug = "detail": before a collective runs, its group's ranks exchange what each is
// about to run (operation, dtype, shapes) and refuse it on every rank when they differ, as
// TORCH_DISTRIBUTED_DEBUG=DETAIL does. A mismatch otherwise hangs, or mixes one rank's gradients
// into another tensor without a word.

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <vector>

#include "trainyard/parallel/flight_recorder.hpp"

namespace trainyard {

// Throws Error on every rank of `group`, naming each rank's operation, dtype and first input
// shape, when any differs from the others'. `backend` is the group's (uncounted) backend, which
// runs the exchange: an all-gather of a few integers per rank.
void check_same_collective(c10d::Backend& backend, const CollectiveGroup& group,
                           std::int64_t sequence, const char* operation,
                           const std::vector<at::Tensor>& tensors);

}  // namespace trainyard
