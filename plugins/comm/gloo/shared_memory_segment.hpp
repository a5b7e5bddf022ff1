#pragma once
// The shared-memory segment through which the ranks of one group on one host exchange their
// collectives: a header, each rank's control block (the counters its peers wait on and where
// its posted pieces lie) and each rank's staging area. Each rank writes only its own block and
// area; the peers read them.

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace trainyard {

constexpr std::int64_t kCacheLine = 64;

inline std::int64_t round_up(std::int64_t value, std::int64_t to) {
  return (value + to - 1) / to * to;
}
// Posted pieces whose place in a staging area the peers can look up at once.
constexpr std::uint32_t kPlaces = 64;

// Sequence numbers wrap around; whether `a` is at or past `b`.
inline bool reached(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::int32_t>(a - b) >= 0;
}

// A counter of a rank's, alone on its cache line: the last sequence number that reached a stage.
struct alignas(kCacheLine) Counter {
  std::atomic<std::uint32_t> value{0};
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

// Where a posted piece lies in its rank's staging area, and its element count.
struct Place {
  std::atomic<std::uint32_t> sequence{0};
  std::int64_t offset = 0;
  std::int64_t count = 0;
};

struct alignas(kCacheLine) RankControl {
  Counter posted;    // its piece is in its staging area
  Counter reduced;   // its share of the piece is reduced and back in its staging area
  Counter released;  // it has read the other ranks' shares: they may reuse their areas
  Counter sleepers;  // peers asleep on one of its counters, to be woken
  std::int32_t pid = 0;
  std::uint64_t pid_namespace = 0;
  Place places[kPlaces];
};

class SharedSegment {
 public:
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  RankControl& control(int of) { return controls_[of]; }
  // Byte `offset` of rank `of`'s staging area.
  std::byte* area(int of, std::int64_t offset) { return staging_ + of * capacity_ + offset; }
  // Whether rank `of`'s process has ended (false where it cannot be watched: a rank of this
  // process, or of another pid namespace).
  bool process_ended(int of) const;

 private:
  friend class SegmentSetup;
  SharedSegment() = default;
  void* base_ = nullptr;
  std::int64_t mapped_ = 0;
  RankControl* controls_ = nullptr;
  std::byte* staging_ = nullptr;
  std::int64_t capacity_ = 0;
  std::vector<int> processes_;  // a pidfd per rank, -1 where unwatched
};

// The staging area each rank gets for `bytes` asked for.
std::int64_t staging_capacity(std::int64_t bytes);

// Setting a group's segment up through the group's store, without ever waiting: rank 0 makes
// the segment (every byte reserved, so a full /dev/shm fails here instead of faulting later)
// and names it in the store, each other rank maps it once the name is there, and every rank
// says whether it could. step() moves this as far as the peers have come: a rank whose first
// collective on one group waited there for its peers could not serve a collective of another
// group that they wait in. The name is removed once all have answered, so the memory goes with
// the last mapping however the processes end (names a rank 0 that died first left behind are
// removed by a later one, an hour on).
class SegmentSetup {
 public:
  enum class Outcome { kPending, kShared, kRefused };

  // `capacity`: each rank's staging area (staging_capacity). Rank 0 makes the segment here.
  SegmentSetup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::int64_t capacity);
  ~SegmentSetup();
  SegmentSetup(const SegmentSetup&) = delete;
  SegmentSetup& operator=(const SegmentSetup&) = delete;

  // kShared once every rank has mapped the segment (take() it then), kRefused once any has
  // said it cannot (another /dev/shm, too little room in it), kPending before.
  Outcome step();
  std::unique_ptr<SharedSegment> take();

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::string name_;
  std::unique_ptr<SharedSegment> segment_;
  bool answered_ = false;     // this rank has said whether it mapped the segment
  std::vector<int> answers_;  // each rank's: -1 not yet, 0 could not map it, 1 mapped
  Outcome outcome_ = Outcome::kPending;
};

// Each rank of a group names its host and its process in the group's store as the group is
// made (before its ranks meet, so that the answers are there for their first collective):
// ranks of one host can share memory, and watch each other's processes.
void announce_host(c10d::Store& store, int rank);
struct AnnouncedRank {
  bool on_this_host = false;  // same boot of the same machine, same /dev/shm
  int pid = 0;                // where watchable from here (same pid namespace), else 0
};
AnnouncedRank announced_rank(c10d::Store& store, int rank);

// The pieces segments are made of, for the mailboxes of point-to-point messages as well.
// A store value as bytes, and back.
std::vector<std::uint8_t> bytes_of(const std::string& text);
std::string text_of(const std::vector<std::uint8_t>& bytes);
// A random number that tells one segment from another that had the same name.
std::uint64_t fresh_nonce();
// The CPUs this process may run on (at least 1): whether the ranks of a host each have one.
int usable_cores();
// A fresh name for a segment of this process ("/trainyard-<pid>-<nonce>"), after removing the
// names that ended processes left behind an hour ago or more.
std::string fresh_segment_name(std::uint64_t nonce);
// Maps `name`, created (every byte reserved) or opened; null when it cannot.
void* map_named(const std::string& name, std::int64_t bytes, bool create);
// This process's pid namespace (0 where unknown): pids are only comparable within one.
std::uint64_t pid_namespace();
// A descriptor that becomes readable when process `pid` ends (-1 where the kernel has none);
// whether it has.
int watch_process(int pid);
bool process_has_ended(int pidfd);

// Sleeps while `word` holds `observed`, at most `timeout`; wakes on futex_wake of `word` from
// any process mapping it.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t observed,
                std::chrono::nanoseconds timeout);
void futex_wake(std::atomic<std::uint32_t>& word);
// A pause between two looks at a counter another core writes.
void cpu_relax();

}  // namespace trainyard
