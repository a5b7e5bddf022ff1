#pragma once
// The shared-memory segment through which the ranks of one group on one host exchange their
// collectives: a header, each rank's control block (the counters its peers wait on and where
// its posted pieces lie) and each rank's staging area. Each rank writes only its own block and
// area; the peers read them.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace c10d {
class Store;
}

namespace trainyard {

constexpr std::int64_t kCacheLine = 64;
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
  // Collective over the group's store: rank 0 creates the segment (every byte reserved, so a
  // full /dev/shm fails here instead of faulting later) and names it in the store, the others
  // map it, and the name is removed once all have answered, so the memory goes with the last
  // mapping however the processes end (names a rank 0 that died first left behind are removed
  // by a later one, an hour on). Null on every rank when any rank cannot map it (another
  // host, another /dev/shm, too little room).
  static std::unique_ptr<SharedSegment> map(c10d::Store& store, int rank, int size,
                                            std::int64_t capacity);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  RankControl& control(int of) { return controls_[of]; }
  // Byte `offset` of rank `of`'s staging area.
  std::byte* area(int of, std::int64_t offset) { return staging_ + of * capacity_ + offset; }
  std::int64_t capacity() const { return capacity_; }
  // Whether rank `of`'s process has ended (false where it cannot be watched: a rank of this
  // process, or of another pid namespace).
  bool process_ended(int of) const;

 private:
  SharedSegment() = default;
  void* base_ = nullptr;
  std::int64_t mapped_ = 0;
  RankControl* controls_ = nullptr;
  std::byte* staging_ = nullptr;
  std::int64_t capacity_ = 0;
  std::vector<int> processes_;  // a pidfd per rank, -1 where unwatched
};

// Sleeps while `word` holds `observed`, at most `timeout`; wakes on futex_wake of `word` from
// any process mapping it.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t observed,
                std::chrono::nanoseconds timeout);
void futex_wake(std::atomic<std::uint32_t>& word);
// A pause between two looks at a counter another core writes.
void cpu_relax();

}  // namespace trainyard
