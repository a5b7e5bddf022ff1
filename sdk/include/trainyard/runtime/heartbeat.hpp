#pragma once
// The heartbeat every rank of a multi-process run publishes in the rendezvous store (about
// every 100 ms, from a thread of its own): how a launcher or a peer tells a frozen process (its
// heartbeat stops) from a stuck one (it beats, but its step does not move).

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <vector>

namespace trainyard {

struct Heartbeat {
  bool present = false;      // the rank has beaten at least once
  std::int64_t counter = 0;  // grows with every beat
  std::int64_t step = 0;     // the optimizer step the rank last began
  bool waiting = false;      // inside a collective
  bool finished = false;     // the run ended on this rank
};

// The last heartbeat of each of ranks 0..world_size-1 in `store` (absent ones not present).
std::vector<Heartbeat> read_heartbeats(c10d::Store& store, int world_size);

}  // namespace trainyard
