#pragma once
// The state a component contributes to a checkpoint.

#include <map>
#include <string>

#include "trainyard/api/batch.hpp"

namespace trainyard {

// Tensors by name plus string metadata (versions, the resolved recipe).
struct StateDict {
  TensorMap tensors;
  std::map<std::string, std::string> metadata;
};

// `shared` entries are identical on every rank and written once, by rank 0; `local` entries are
// each rank's own (RNG streams, loader position, parameter shards) and written by every rank.
struct CheckpointState {
  StateDict shared;
  StateDict local;
};

}  // namespace trainyard
