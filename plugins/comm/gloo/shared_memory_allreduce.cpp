#include "shared_memory_allreduce.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "shared_memory_segment.hpp"
#include "trainyard/api/error.hpp"
#include "waited_work.hpp"

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;

// How long a sleeping wait lasts before it looks at the peer's process and the deadline; and
// before it moves the other groups' collectives on, where they have some.
constexpr std::chrono::milliseconds kWatchInterval{50};
constexpr std::chrono::milliseconds kBusyWatchInterval{1};

// One piece of an all-reduce: the elements [first, first + count) of its flat tensor.
struct Piece {
  enum Stage { kQueued, kPosted, kReduced, kReleased };
  std::uint32_t sequence = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t offset = 0;  // in this rank's staging area, once posted
  Stage stage = kQueued;
};

// An all-reduce, or a broadcast from `root`: the root posts each piece and the others copy it.
struct Operation {
  at::Tensor target;  // the caller's tensor
  at::Tensor flat;    // a contiguous 1-D view of it, or a copy when it is not contiguous
  c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
  int root = -1;  // a broadcast's root; -1 for an all-reduce
  std::vector<Piece> pieces;
  std::size_t current = 0;  // the first piece not yet released
  bool finished = false;
  c10::intrusive_ptr<c10d::Work> tcp;  // where the group's ranks cannot share memory
};

void reduce_into(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                 c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::PRODUCT:
      at::mul_out(const_cast<at::Tensor&>(out), a, b);
      return;
    case c10d::ReduceOp::MIN:
      at::minimum_out(const_cast<at::Tensor&>(out), a, b);
      return;
    case c10d::ReduceOp::MAX:
      at::maximum_out(const_cast<at::Tensor&>(out), a, b);
      return;
    default:
      at::add_out(const_cast<at::Tensor&>(out), a, b);
      return;
  }
}

}  // namespace

bool move_other_groups(const SharedMemoryAllreduce::State* waiting);

struct SharedMemoryAllreduce::State {
  std::unique_ptr<SegmentSetup> setup;     // until the segment is set up, or refused
  std::unique_ptr<SharedSegment> segment;  // once every rank has mapped it
  bool over_tcp = false;                   // some rank cannot share memory
  Tcp tcp;
  int rank = 0;
  int size = 0;
  std::int64_t capacity = 0;  // each rank's staging area (known before the segment is)
  std::chrono::milliseconds timeout{0};
  std::chrono::microseconds spin{0};

  std::mutex mutex;
  std::deque<std::shared_ptr<Operation>> queue;  // launched and not finished, in order
  std::uint32_t next_sequence = 1;
  std::uint32_t last_posted = 0;
  std::int64_t cursor = 0;  // the first free byte of this rank's staging area
  std::exception_ptr failure;

  RankControl& control(int of) { return segment->control(of); }
  std::byte* area(int of, std::int64_t offset) { return segment->area(of, offset); }

  // The first element of rank `of`'s share of a piece of `count` elements.
  std::int64_t share_start(std::int64_t count, int of) const { return count * of / size; }

  std::shared_ptr<Operation> launch(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op,
                                    int root) {
    std::lock_guard<std::mutex> lock(mutex);
    if (failure) std::rethrow_exception(failure);
    auto operation = std::make_shared<Operation>();
    operation->target = tensor;
    operation->flat = tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
    operation->op = op;
    operation->root = root;
    if (over_tcp) {
      send_over_tcp(*operation);
      return operation;
    }
    const std::int64_t per_piece = std::max<std::int64_t>(1, capacity / tensor.element_size());
    for (std::int64_t first = 0; first < tensor.numel(); first += per_piece) {
      Piece piece;
      piece.sequence = next_sequence++;
      piece.first = first;
      piece.count = std::min(per_piece, tensor.numel() - first);
      operation->pieces.push_back(piece);
    }
    if (operation->pieces.empty()) {
      operation->finished = true;
      return operation;
    }
    queue.push_back(operation);
    advance_without_waiting();
    return operation;
  }

  // Moves the queue as far as it goes without waiting for a peer.
  void advance_without_waiting() {
    try {
      while (step()) {
      }
    } catch (...) {
      failure = std::current_exception();
      throw;
    }
  }

  // Blocks until `operation` is finished (and every all-reduce launched before it).
  void complete(Operation& operation) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (operation.finished) return;
      if (failure) std::rethrow_exception(failure);
      try {
        const auto deadline = Clock::now() + timeout;
        while (!operation.finished && !operation.tcp) {
          if (step()) continue;
          // Slept briefly where another group has work this rank could move.
          const bool others_pending = move_other_groups(this);
          wait_for_peer(deadline, others_pending ? kBusyWatchInterval : kWatchInterval);
        }
      } catch (...) {
        failure = std::current_exception();
        throw;
      }
    }
    if (operation.tcp) finish_over_tcp(operation);
  }

  bool poll(Operation& operation) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!operation.finished && !operation.tcp && !failure) advance_without_waiting();
    }
    if (!operation.finished && operation.tcp && operation.tcp->isCompleted()) {
      finish_over_tcp(operation);
    }
    return operation.finished;
  }

  // Gloo takes contiguous tensors: the flat one, whose values the target gets at the end.
  void send_over_tcp(Operation& operation) {
    operation.tcp = operation.root >= 0 ? tcp.broadcast(operation.flat, operation.root)
                                        : tcp.allreduce(operation.flat, operation.op);
  }

  void finish_over_tcp(Operation& operation) {
    operation.tcp->wait();
    copy_back(operation);
    operation.finished = true;
  }

  // Moves the segment's setup on; once it is refused, every collective launched so far goes
  // over TCP, in order. False while the peers have not come far enough.
  bool set_up() {
    switch (setup->step()) {
      case SegmentSetup::Outcome::kPending:
        return false;
      case SegmentSetup::Outcome::kShared:
        segment = setup->take();
        break;
      case SegmentSetup::Outcome::kRefused:
        over_tcp = true;
        for (auto& operation : queue) send_over_tcp(*operation);
        queue.clear();
        break;
    }
    setup.reset();
    return true;
  }

  // One move: sets the segment up, posts the next queued piece that has room, or moves the head
  // piece one stage. False when nothing can move until a peer does.
  bool step() {
    if (setup) return set_up();
    if (queue.empty()) return false;
    if (post_next()) return true;
    Operation& head = *queue.front();
    Piece& piece = head.pieces[head.current];
    if (piece.stage == Piece::kQueued || lagging(need_of(head, piece)) >= 0) return false;
    if (head.root >= 0) {
      copy_from_root(head, piece);
    } else if (piece.stage == Piece::kPosted) {
      reduce_share(head, piece);
    } else {
      gather_shares(head, piece);
    }
    if (piece.stage == Piece::kReleased && ++head.current == head.pieces.size()) finish(head);
    return true;
  }

  // What a piece waits for before its next stage: every rank in [first, last] at `target` or
  // past it on `counter`.
  struct Need {
    Counter RankControl::*counter;
    std::uint32_t target;
    int first;
    int last;
  };

  Need need_of(const Operation& operation, const Piece& piece) const {
    // Posting waits for room: the peers reading all this rank posted (all before the head).
    if (piece.stage == Piece::kQueued) return {&RankControl::released, last_posted, 0, size - 1};
    if (operation.root == rank) return {&RankControl::posted, piece.sequence, rank, rank};
    if (operation.root >= 0) {
      return {&RankControl::posted, piece.sequence, operation.root, operation.root};
    }
    if (piece.stage == Piece::kPosted) return {&RankControl::posted, piece.sequence, 0, size - 1};
    return {&RankControl::reduced, piece.sequence, 0, size - 1};
  }

  // The first rank the need waits for, or -1 when it is met.
  int lagging(const Need& need) {
    for (int of = need.first; of <= need.last; ++of) {
      if (!reached((control(of).*need.counter).value.load(std::memory_order_acquire),
                   need.target)) {
        return of;
      }
    }
    return -1;
  }

  bool all_reached(Counter RankControl::*counter, std::uint32_t sequence) {
    return lagging({counter, sequence, 0, size - 1}) < 0;
  }

  // The first queued piece, in launch order, when the staging area has room for it and the
  // peers have read the place it reuses.
  bool post_next() {
    for (auto& operation : queue) {
      for (auto& piece : operation->pieces) {
        if (piece.stage != Piece::kQueued) continue;
        return post(*operation, piece);
      }
    }
    return false;
  }

  bool post(Operation& operation, Piece& piece) {
    if (operation.root >= 0 && operation.root != rank) {
      piece.stage = Piece::kPosted;  // nothing to post: it copies the root's piece
      return true;
    }
    if (piece.sequence > kPlaces &&
        !all_reached(&RankControl::released, piece.sequence - kPlaces)) {
      return false;
    }
    // Everything posted so far has been read by every rank: the area is empty again.
    if (all_reached(&RankControl::released, last_posted)) cursor = 0;
    const std::int64_t bytes = piece.count * operation.flat.element_size();
    if (cursor + bytes > capacity) return false;
    piece.offset = cursor;
    cursor = round_up(cursor + bytes, kCacheLine);
    std::memcpy(area(rank, piece.offset),
                static_cast<const std::byte*>(operation.flat.data_ptr()) +
                    piece.first * operation.flat.element_size(),
                static_cast<std::size_t>(bytes));
    Place& place = control(rank).places[piece.sequence % kPlaces];
    place.offset = piece.offset;
    place.count = piece.count;
    place.sequence.store(piece.sequence, std::memory_order_release);
    piece.stage = Piece::kPosted;
    last_posted = piece.sequence;
    publish(control(rank).posted, piece.sequence);
    return true;
  }

  at::Tensor view_in_area(int of, const Operation& operation, const Piece& piece,
                          std::int64_t start, std::int64_t count) {
    const Place& place = control(of).places[piece.sequence % kPlaces];
    const std::int64_t element = operation.flat.element_size();
    return at::from_blob(area(of, place.offset + start * element), {count},
                         operation.flat.options());
  }

  // Every rank posted this piece under the same sequence number with as many elements: ranks
  // that issued different collectives, or tensors of different sizes, are an error, not a read
  // past what a peer posted.
  void check_posted(int of, const Piece& piece) {
    const Place& place = control(of).places[piece.sequence % kPlaces];
    if (place.sequence.load(std::memory_order_acquire) != piece.sequence ||
        place.count != piece.count) {
      throw Error("collective over shared memory: rank " + std::to_string(of) +
                  " posted another collective (" + std::to_string(place.count) +
                  " elements) where this rank expects " + std::to_string(piece.count) +
                  " elements; every rank must issue collectives of the same size in the "
                  "same order");
    }
  }

  // This rank's share of the piece, reduced over every rank's copy in rank order (the same
  // order, so the same bits, whichever rank computes it), into its tensor and its staging area.
  void reduce_share(Operation& operation, Piece& piece) {
    for (int of = 0; of < size; ++of) check_posted(of, piece);
    const std::int64_t start = share_start(piece.count, rank);
    const std::int64_t count = share_start(piece.count, rank + 1) - start;
    at::Tensor out = operation.flat.narrow(0, piece.first + start, count);
    reduce_into(out, view_in_area(0, operation, piece, start, count),
                view_in_area(1, operation, piece, start, count), operation.op);
    for (int of = 2; of < size; ++of) {
      reduce_into(out, out, view_in_area(of, operation, piece, start, count), operation.op);
    }
    std::memcpy(area(rank, piece.offset + start * operation.flat.element_size()), out.data_ptr(),
                static_cast<std::size_t>(count * operation.flat.element_size()));
    piece.stage = Piece::kReduced;
    publish(control(rank).reduced, piece.sequence);
  }

  // A broadcast's piece: the root has nothing more to do; the others copy the root's.
  void copy_from_root(Operation& operation, Piece& piece) {
    if (operation.root != rank) {
      check_posted(operation.root, piece);
      operation.flat.narrow(0, piece.first, piece.count)
          .copy_(view_in_area(operation.root, operation, piece, 0, piece.count));
    }
    piece.stage = Piece::kReleased;
    publish(control(rank).released, piece.sequence);
  }

  void gather_shares(Operation& operation, Piece& piece) {
    for (int of = 0; of < size; ++of) {
      if (of == rank) continue;
      const std::int64_t start = share_start(piece.count, of);
      const std::int64_t count = share_start(piece.count, of + 1) - start;
      operation.flat.narrow(0, piece.first + start, count)
          .copy_(view_in_area(of, operation, piece, start, count));
    }
    piece.stage = Piece::kReleased;
    publish(control(rank).released, piece.sequence);
  }

  static void copy_back(Operation& operation) {
    if (operation.flat.data_ptr() != operation.target.data_ptr() ||
        !operation.target.is_contiguous()) {
      operation.target.copy_(operation.flat.view(operation.target.sizes()));
    }
  }

  void finish(Operation& operation) {
    copy_back(operation);
    operation.finished = true;
    queue.pop_front();
  }

  void publish(Counter& counter, std::uint32_t sequence) {
    counter.value.store(sequence, std::memory_order_seq_cst);
    if (control(rank).sleepers.value.load(std::memory_order_seq_cst) > 0) futex_wake(counter.value);
  }

  // Spins a while, then sleeps on the counter the head of the queue waits for; throws when the
  // peer's process has ended or the group's timeout has passed.
  void wait_for_peer(Clock::time_point deadline, std::chrono::milliseconds sleep) {
    if (setup) {
      // The peers' answers come through the store.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (Clock::now() > deadline) {
        throw Error(
            "collective over shared memory: the group's ranks did not all reach their "
            "first collective within " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
            " s");
      }
      return;
    }
    const Operation& head = *queue.front();
    const Need need = need_of(head, head.pieces[head.current]);
    const int peer = lagging(need);
    if (peer < 0) return;
    const std::uint32_t target = need.target;
    std::atomic<std::uint32_t>& word = (control(peer).*need.counter).value;
    const auto spin_until = Clock::now() + spin;
    while (Clock::now() < spin_until) {
      if (reached(word.load(std::memory_order_acquire), target)) return;
      for (int i = 0; i < 64; ++i) cpu_relax();
    }
    std::atomic<std::uint32_t>& sleepers = control(peer).sleepers.value;
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t observed = word.load(std::memory_order_seq_cst);
    if (!reached(observed, target)) futex_wait(word, observed, sleep);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(word.load(std::memory_order_acquire), target)) return;
    if (segment->process_ended(peer)) {
      throw Error("collective over shared memory: rank " + std::to_string(peer) + " (process " +
                  std::to_string(control(peer).pid) + ") ended while this rank waited for it");
    }
    if (Clock::now() > deadline) {
      throw Error(
          "collective over shared memory: rank " + std::to_string(peer) +
          " did not reach it within " +
          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) + " s");
    }
  }
};

namespace {

// Every group's collectives in this process. A rank waiting in one group's collective moves the
// others' on as well, as Gloo's threads would: nothing else moves them while its thread waits,
// and ranks may wait in collectives of different groups in different orders (rank 0 in group
// A's while rank 1 waits in group B's for rank 0).
struct Groups {
  std::mutex mutex;
  std::vector<std::weak_ptr<SharedMemoryAllreduce::State>> states;
};

Groups& groups() {
  static Groups all;
  return all;
}

}  // namespace

// Moves every other group's collectives as far as they go without waiting (skipping a group
// another thread is in); whether some group has collectives left to move.
bool move_other_groups(const SharedMemoryAllreduce::State* waiting) {
  std::vector<std::shared_ptr<SharedMemoryAllreduce::State>> others;
  {
    Groups& all = groups();
    std::lock_guard<std::mutex> lock(all.mutex);
    std::erase_if(all.states, [](const auto& state) { return state.expired(); });
    for (const auto& state : all.states) {
      if (auto other = state.lock(); other && other.get() != waiting) others.push_back(other);
    }
  }
  bool pending = false;
  for (const auto& other : others) {
    std::unique_lock<std::mutex> lock(other->mutex, std::try_to_lock);
    if (!lock || other->failure || (other->queue.empty() && !other->setup)) continue;
    try {
      other->advance_without_waiting();
    } catch (const std::exception&) {
      continue;  // recorded as that group's failure, for its own wait to report
    }
    pending = pending || !other->queue.empty() || other->setup;
  }
  return pending;
}

namespace {

c10::intrusive_ptr<c10d::Work> waited_work(std::shared_ptr<SharedMemoryAllreduce::State> state,
                                           std::shared_ptr<Operation> operation, c10d::OpType type,
                                           const char* title) {
  at::Tensor result = operation->target;
  return c10::make_intrusive<WaitedWork>(
      type, title, std::move(result), [state, operation] { state->complete(*operation); },
      [state, operation] { return state->poll(*operation); });
}

}  // namespace

SharedMemoryAllreduce::SharedMemoryAllreduce(c10::intrusive_ptr<c10d::Store> store, int rank,
                                             int size, bool all_on_this_host,
                                             std::int64_t capacity_bytes,
                                             std::chrono::milliseconds timeout, Tcp tcp)
    : state_(std::make_shared<State>()) {
  State& state = *state_;
  state.rank = rank;
  state.size = size;
  state.capacity = staging_capacity(capacity_bytes);
  state.timeout = timeout;
  state.tcp = std::move(tcp);
  state.over_tcp = !all_on_this_host;
  if (all_on_this_host) {
    state.setup = std::make_unique<SegmentSetup>(std::move(store), rank, size, state.capacity);
  }
  // Spinning pays where each rank has a core of its own; elsewhere a waiting rank sleeps soon,
  // leaving the core to the peer it waits for.
  state.spin =
      size <= usable_cores() ? std::chrono::microseconds(1000) : std::chrono::microseconds(20);
  Groups& all = groups();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.states.push_back(state_);
}

SharedMemoryAllreduce::~SharedMemoryAllreduce() = default;

bool SharedMemoryAllreduce::handles(const std::vector<at::Tensor>& tensors,
                                    const c10d::AllreduceOptions& options) {
  if (tensors.size() != 1) return false;
  const at::Tensor& tensor = tensors.front();
  if (!tensor.device().is_cpu() || tensor.layout() != at::kStrided) return false;
  const bool ordered =
      options.reduceOp == c10d::ReduceOp::MIN || options.reduceOp == c10d::ReduceOp::MAX;
  const bool arithmetic =
      options.reduceOp == c10d::ReduceOp::SUM || options.reduceOp == c10d::ReduceOp::PRODUCT;
  const at::ScalarType type = tensor.scalar_type();
  if (at::isComplexType(type)) return arithmetic;
  return (ordered || arithmetic) &&
         (at::isFloatingType(type) || at::isIntegralType(type, /*includeBool=*/true));
}

c10::intrusive_ptr<c10d::Work> SharedMemoryAllreduce::allreduce(const at::Tensor& tensor,
                                                                c10d::ReduceOp::RedOpType op) {
  return waited_work(state_, state_->launch(tensor, op, -1), c10d::OpType::ALLREDUCE,
                     "shared_memory:all_reduce");
}

bool SharedMemoryAllreduce::handles(const std::vector<at::Tensor>& tensors,
                                    const c10d::BroadcastOptions& options) {
  return tensors.size() == 1 && options.rootTensor == 0 && tensors.front().device().is_cpu() &&
         tensors.front().layout() == at::kStrided;
}

bool SharedMemoryAllreduce::over_tcp() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->over_tcp;
}

c10::intrusive_ptr<c10d::Work> SharedMemoryAllreduce::broadcast(const at::Tensor& tensor,
                                                                int root) {
  return waited_work(state_, state_->launch(tensor, c10d::ReduceOp::SUM, root),
                     c10d::OpType::BROADCAST, "shared_memory:broadcast");
}

}  // namespace trainyard
