#pragma once
// Counts the collectives a rank issues over each group of its mesh, and the bytes they hand to
// c10d, so that tests can assert what a step communicates and the run's metrics show it
// (comm_<group>_calls, comm_<group>_bytes).

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "trainyard/parallel/flight_recorder.hpp"

namespace trainyard {

class EmulatedLink;

// What one operation issued on one group. `bytes` are the bytes of the input tensors each call
// hands to c10d, summed over the call's tensors: the tensor an all-reduce or a broadcast reduces
// or sends (on every rank alike), this rank's part of an all-gather, the whole tensor a
// reduce-scatter reduces, the tensor sent or the buffer received into. What crosses the wire
// depends on the backend's algorithm; these are the sizes a model's code controls.
struct CollectiveCount {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
};

// Keyed by (group name, operation), the operation named as c10d::Backend's method: {"tp",
// "allreduce"}, {"tp", "_allgather_base"}.
using CollectiveCounts = std::map<std::pair<std::string, std::string>, CollectiveCount>;

// Every operation of a group summed: group name -> calls and bytes.
std::map<std::string, CollectiveCount> per_group(const CollectiveCounts& counts);
// "tp: allreduce 2 (384 B), _allgather_base 1 (96 B); dp: allreduce 1 (4 KiB)", or
// "no collectives".
std::string describe(const CollectiveCounts& counts);

// Thread-safe: a rank's backends may be driven from several threads (gradient hooks, the
// pipeline's channel).
class CollectiveCounter {
 public:
  void add(const std::string& group, const std::string& operation, std::int64_t bytes);
  CollectiveCounts snapshot() const;
  // The counts so far; the counter starts again from zero.
  CollectiveCounts take();
  // describe() of the counts so far, on one line.
  std::string describe() const;

  // From now on, the counted groups' collectives finish no faster than their bytes would cross
  // a link of `bytes_per_second` ([comm] emulated_bandwidth_mb_s, for benchmarks and tests);
  // 0: the machine's own speed.
  void emulate_link(double bytes_per_second);
  std::shared_ptr<EmulatedLink> link() const;

  // From now on the counted groups' operations are kept in a flight recorder of `capacity`
  // records ([comm] flight_recorder; 0: none).
  void record_flights(std::size_t capacity);
  // The recorder, or null when none records.
  std::shared_ptr<FlightRecorder> recorder() const;

  // [comm] debug = "detail": before each collective, the group's ranks exchange its operation,
  // dtype and shapes, and every rank throws an Error naming each rank's when they differ, rather
  // than running a collective that would hang or mix data.
  void check_collectives(bool on);
  bool checks_collectives() const { return check_collectives_; }

 private:
  mutable std::mutex mutex_;
  CollectiveCounts counts_;
  std::shared_ptr<EmulatedLink> link_;
  std::shared_ptr<FlightRecorder> recorder_;
  std::atomic<bool> check_collectives_{false};
};

// A backend that forwards every operation to `inner` and counts each collective and
// point-to-point call under `group.name` in `counter` (and records it, checks it, paces it as the
// counter says). `group.ranks` are the group's global ranks (empty: 0..size-1). The Work it
// returns finishes when inner's does.
c10::intrusive_ptr<c10d::Backend> counting_backend(c10::intrusive_ptr<c10d::Backend> inner,
                                                   CollectiveGroup group,
                                                   std::shared_ptr<CollectiveCounter> counter);
// The backend a counting backend forwards to; any other backend (or null) as it is.
c10::intrusive_ptr<c10d::Backend> uncounted(const c10::intrusive_ptr<c10d::Backend>& backend);

}  // namespace trainyard
