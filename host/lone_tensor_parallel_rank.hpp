#pragma once
// One rank of a tensor-parallel group, alone in its process: a mesh whose tp group's collectives
// keep the shapes a group of `tp` ranks gives (an all-gather's output is tp times its input, a
// reduce-scatter's a tp-th) with no peer to exchange with. A model built on it allocates and
// computes what a rank of that group does, so the planner's probe measures a tensor-parallel
// rank's parameters, activations and transients in one process. The values it computes are not
// a real run's (a sum over the group is this rank's part alone): only bytes and time are read.

#include <memory>

namespace trainyard {

class ProcessMesh;

// Rank 0 of a mesh whose only dimension is tp (`tp` >= 1).
std::shared_ptr<ProcessMesh> lone_tensor_parallel_rank(int tp);

}  // namespace trainyard
