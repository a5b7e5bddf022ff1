#pragma once
// The last collectives a rank issued, kept in a ring buffer ([comm] flight_recorder) so that a
// hung or failed job can say which collective each rank was in. Every operation a mesh group's
// backend is handed is recorded with its number on that group, its shapes and the optimizer step
// the rank was in, and marked finished when its work completes. On a watchdog's SIGUSR2, a
// failed collective or a peer's failure, the rank writes the ring as JSON
// (<output_dir>/flight/rank<k>.json); `trainyard diagnose` reads every rank's file
// (flight_diagnosis.hpp) and names the rank that never entered, or entered another, collective.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace trainyard {

// A group as every record of it names it: its mesh name ("dp", "dp/dp_shard", "tp") and the
// global ranks in it, in group-rank order.
struct CollectiveGroup {
  std::string name;
  std::vector<int> ranks;
};

enum class CollectiveState { kIssued, kCompleted, kFailed };

const char* collective_state_name(CollectiveState state);

struct CollectiveRecord {
  std::int64_t id = 0;  // the rank's running count of recorded operations, from 0
  std::shared_ptr<const CollectiveGroup> group;
  // Collectives are numbered on their group from 1, alike on every member, as long as every
  // member issues the same collectives. A point-to-point operation is numbered among those with
  // the same peer and direction instead.
  std::int64_t sequence = 0;
  std::string operation;  // c10d::Backend's method: "allreduce", "_allgather_base", "send"
  std::string dtype;      // "float32"
  std::vector<std::vector<std::int64_t>> shapes;  // the input tensors'
  int peer = -1;                                  // send/recv: the peer's group rank
  std::int64_t step = 0;                          // the optimizer step the rank was in
  std::int64_t issued_us = 0;                     // wall clock, microseconds since the epoch
  std::int64_t finished_us = 0;                   // 0 while not finished
  CollectiveState state = CollectiveState::kIssued;

  bool point_to_point() const;
  // "allreduce #12 on dp [0,1,2,3] (float32 [1024], step 4)".
  std::string describe() const;
};

// Thread-safe: a rank issues collectives from several threads (gradient hooks, the pipeline's
// channel), and its works finish on the backend's threads.
class FlightRecorder {
 public:
  explicit FlightRecorder(std::size_t capacity);

  std::size_t capacity() const { return capacity_; }
  // Keeps `record` (its id, step, issue time and state filled in), overwriting the oldest once the
  // ring is full; the id to pass to finished().
  std::int64_t issued(CollectiveRecord record);
  // The operation `id` finished (ok) or failed; nothing once the ring has overwritten it.
  void finished(std::int64_t id, bool ok);

  // The optimizer step the rank is in, stamped on what it issues from now on.
  void set_step(std::int64_t step) { step_ = step; }
  std::int64_t step() const { return step_; }

  // What the ring holds, oldest first.
  std::vector<CollectiveRecord> snapshot() const;

 private:
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> ring_;
  std::int64_t next_id_ = 0;
  std::atomic<std::int64_t> step_{0};
};

// Microseconds since the epoch, as records and dumps stamp them (comparable across machines as
// far as their clocks agree).
std::int64_t wall_clock_us();

// The ring of rank `rank` of `world_size` as JSON, written to `file` atomically (a reader sees
// the previous dump or this one, whole), with why it was written.
void write_flight_record(const std::filesystem::path& file, const FlightRecorder& recorder,
                         int rank, int world_size, const std::string& reason);

// The process's dump, set by a multi-process run: dump_flight_record(reason) writes it (from
// any thread; not from a signal handler), and does nothing where none is set.
void set_flight_record_dump(std::function<void(const std::string& reason)> dump);
void dump_flight_record(const std::string& reason);

// From now on an uncaught exception, on any thread, writes a dump before the process aborts (a
// communication library's thread throwing on a mismatched collective). Idempotent.
void dump_flight_record_on_terminate();

// From now on SIGUSR2 asks for a dump: its handler only raises a flag, which a thread of its own
// turns into dump_flight_record("SIGUSR2") within 100 ms. Idempotent.
void dump_flight_record_on_sigusr2();

}  // namespace trainyard
