#include "shared_memory_mailbox.hpp"

#include <ATen/ATen.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>
#include <thread>

#include "shared_memory_segment.hpp"
#include "trainyard/api/error.hpp"
#include "waited_work.hpp"

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;

// How long a sleeping wait lasts before it looks at the peer's process and the deadline.
constexpr std::chrono::milliseconds kWatchInterval{50};
// Messages a sender may have in a mailbox that the receiver has not read.
constexpr std::uint32_t kLetters = 1024;

// What a message is and where its bytes lie. Letter n % kLetters holds message n.
struct alignas(kCacheLine) Letter {
  std::atomic<std::uint32_t> posted{0};  // n + 1 once message n is in it
  std::atomic<std::uint32_t> taken{0};   // n + 1 once the receiver has read message n
  std::int32_t tag = 0;
  std::int32_t via_tcp = 0;  // the bytes travel over TCP, as a message with the same tag
  std::int64_t bytes = 0;
  std::int64_t offset = 0;  // in the arena
};

struct MailboxControl {
  std::uint64_t nonce = 0;
  std::int64_t capacity = 0;
  std::atomic<std::uint32_t> opened{0};  // the receiver has mapped it
  Counter published;                     // n + 1 once message n is posted
  Counter reads;  // counts the receiver's reads: a sender waiting for a letter watches it
  Counter receiver_sleepers;
  Counter sender_sleepers;
  Letter letters[kLetters];
};

std::int64_t arena_offset() { return round_up(sizeof(MailboxControl), 4096); }
std::int64_t mailbox_bytes(std::int64_t capacity) { return arena_offset() + capacity; }

std::string mailbox_key(int from, int to) {
  return "trainyard_mailbox_" + std::to_string(from) + "_" + std::to_string(to);
}

void post_counter(Counter& counter, std::uint32_t value, Counter& sleepers) {
  counter.value.store(value, std::memory_order_seq_cst);
  if (sleepers.value.load(std::memory_order_seq_cst) > 0) futex_wake(counter.value);
}

// Spins up to `spin` while `word` holds `observed`, then sleeps on it (counted in `sleepers`)
// for at most kWatchInterval. Whether it changed.
bool wait_for_change(std::atomic<std::uint32_t>& word, std::uint32_t observed, Counter& sleepers,
                     std::chrono::microseconds spin) {
  const auto spin_until = Clock::now() + spin;
  while (Clock::now() < spin_until) {
    if (word.load(std::memory_order_acquire) != observed) return true;
    for (int i = 0; i < 64; ++i) cpu_relax();
  }
  sleepers.value.fetch_add(1, std::memory_order_seq_cst);
  if (word.load(std::memory_order_seq_cst) == observed) futex_wait(word, observed, kWatchInterval);
  sleepers.value.fetch_sub(1, std::memory_order_seq_cst);
  return word.load(std::memory_order_acquire) != observed;
}

std::string seconds_text(std::chrono::milliseconds timeout) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) + " s";
}

// The sender's side of one direction.
struct Outbox {
  void* base = nullptr;  // null: every message to this peer goes over TCP
  std::int64_t mapped = 0;
  std::string name;
  MailboxControl* control = nullptr;
  std::byte* arena = nullptr;
  std::uint32_t next = 0;  // the next message's number
  std::int64_t head = 0;   // where the next message's bytes go, counted over every lap
  // Messages in the arena the receiver has not been seen to read, oldest first.
  struct Held {
    std::uint32_t number;
    std::int64_t start;
    std::int64_t end;
  };
  std::deque<Held> held;

  // The receiver removes the name when it maps the mailbox. Messages it has not mapped yet stay
  // readable after this end has gone (a sender's messages complete once posted); names of
  // processes that ended without their receivers are removed by a later group, an hour on.
  ~Outbox() {
    if (!base) return;
    if (next == 0 || control->opened.load(std::memory_order_acquire)) shm_unlink(name.c_str());
    munmap(base, static_cast<std::size_t>(mapped));
  }
};

// A posted receive, matched to a letter in posting order.
struct Receive {
  at::Tensor target;
  int tag = 0;
  bool done = false;                   // its bytes came through the mailbox
  c10::intrusive_ptr<c10d::Work> tcp;  // or its message travels over TCP, on this work
};

// The receiver's side of one direction.
struct Inbox {
  enum class Route { kUnknown, kShared, kTcp };
  Route route = Route::kUnknown;  // unknown until the sender has named its mailbox
  void* base = nullptr;
  std::int64_t mapped = 0;
  MailboxControl* control = nullptr;
  std::byte* arena = nullptr;
  bool watching = false;
  int sender_process = -1;  // a pidfd, -1 where unwatched (another host or pid namespace)
  int sender_pid = 0;
  std::uint32_t oldest = 0;  // the lowest message number not read yet
  std::list<std::shared_ptr<Receive>> pending;

  ~Inbox() {
    if (sender_process >= 0) close(sender_process);
    if (base) munmap(base, static_cast<std::size_t>(mapped));
  }
};

}  // namespace

struct SharedMemoryMailboxes::State {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  std::int64_t capacity = 0;
  std::chrono::milliseconds timeout{0};
  std::chrono::microseconds spin{0};
  Tcp tcp;
  std::mutex mutex;
  std::map<int, std::unique_ptr<Outbox>> outboxes;
  std::map<int, Inbox> inboxes;

  // From the first receive on, the sender's process is watched: a receive waiting for a sender
  // that has ended fails at once, whether or not it had made its mailbox.
  void watch_sender(Inbox& box, int peer) {
    if (box.watching) return;
    box.watching = true;
    box.sender_pid = announced_rank(*store, peer).pid;
    if (box.sender_pid != 0) box.sender_process = watch_process(box.sender_pid);
  }

  // The mailbox to `peer`, made at the first message and named in the store for the peer.
  Outbox& outbox(int peer) {
    auto& box = outboxes[peer];
    if (box) return *box;
    box = std::make_unique<Outbox>();
    std::string named = "tcp";
    if (announced_rank(*store, peer).on_this_host) {
      const std::uint64_t nonce = fresh_nonce();
      box->name = fresh_segment_name(nonce);
      box->mapped = mailbox_bytes(capacity);
      box->base = map_named(box->name, box->mapped, /*create=*/true);
      if (box->base) {
        box->control = new (box->base) MailboxControl();
        box->control->nonce = nonce;
        box->control->capacity = capacity;
        box->arena = static_cast<std::byte*>(box->base) + arena_offset();
        named = box->name + " " + std::to_string(nonce) + " " + std::to_string(capacity);
      }
    }
    store->set(mailbox_key(rank, peer), bytes_of(named));
    return *box;
  }

  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& tensor, int peer, int tag);
  void wait_for_letter(const Outbox& box, const Letter& letter, int peer);
  std::optional<std::int64_t> room(Outbox& box, std::int64_t bytes) const;

  void resolve(Inbox& box, int peer);
  void match(Inbox& box, int peer);
  bool take_letter(Inbox& box, Receive& receive, int peer);
  void complete(Receive& receive, int peer);
  bool poll(Receive& receive, int peer);
  void wait_for_message(Inbox& box, std::uint32_t observed, const Receive& receive, int peer,
                        Clock::time_point deadline);
};

namespace {

// A send whose bytes are already in the mailbox.
class PostedWork final : public c10d::Work {
 public:
  explicit PostedWork(const at::Tensor& tensor)
      : c10d::Work(-1, c10d::OpType::SEND, "shared_memory:send", std::vector<at::Tensor>{tensor}) {
    finish();
  }
};

}  // namespace

// --- the sender's side

c10::intrusive_ptr<c10d::Work> SharedMemoryMailboxes::State::send(const at::Tensor& tensor,
                                                                  int peer, int tag) {
  std::lock_guard<std::mutex> lock(mutex);
  Outbox& box = outbox(peer);
  std::vector<at::Tensor> tensors{tensor};
  if (!box.control) return tcp.send(tensors, peer, tag);
  const std::uint32_t number = box.next;
  Letter& letter = box.control->letters[number % kLetters];
  wait_for_letter(box, letter, peer);
  const std::int64_t bytes = tensor.numel() * tensor.element_size();
  c10::intrusive_ptr<c10d::Work> work;
  if (const auto start = room(box, bytes)) {
    letter.offset = *start % capacity;
    if (bytes > 0) std::memcpy(box.arena + letter.offset, tensor.data_ptr(), bytes);
    box.held.push_back({number, *start, round_up(*start + bytes, kCacheLine)});
    box.head = box.held.back().end;
    letter.via_tcp = 0;
    work = c10::make_intrusive<PostedWork>(tensor);
  } else {
    work = tcp.send(tensors, peer, tag);
    letter.via_tcp = 1;
  }
  letter.tag = tag;
  letter.bytes = bytes;
  letter.posted.store(number + 1, std::memory_order_release);
  post_counter(box.control->published, number + 1, box.control->receiver_sleepers);
  ++box.next;
  return work;
}

// The letter a message reuses is free once the receiver has read the message it last held.
void SharedMemoryMailboxes::State::wait_for_letter(const Outbox& box, const Letter& letter,
                                                   int peer) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const std::uint32_t observed = box.control->reads.value.load(std::memory_order_acquire);
    if (letter.taken.load(std::memory_order_acquire) ==
        letter.posted.load(std::memory_order_relaxed)) {
      return;
    }
    wait_for_change(box.control->reads.value, observed, box.control->sender_sleepers, spin);
    if (Clock::now() > deadline) {
      throw Error("send over shared memory: rank " + std::to_string(peer) + " has left " +
                  std::to_string(kLetters) + " messages from this rank unread for " +
                  seconds_text(timeout));
    }
  }
}

// Where `bytes` go in the arena, or nothing when the unread messages leave no room for them.
std::optional<std::int64_t> SharedMemoryMailboxes::State::room(Outbox& box,
                                                               std::int64_t bytes) const {
  while (!box.held.empty()) {
    const Outbox::Held& oldest = box.held.front();
    const Letter& letter = box.control->letters[oldest.number % kLetters];
    if (letter.taken.load(std::memory_order_acquire) != oldest.number + 1) break;
    box.held.pop_front();
  }
  if (box.held.empty()) box.head = 0;
  const std::int64_t tail = box.held.empty() ? box.head : box.held.front().start;
  std::int64_t start = box.head;
  const std::int64_t at = start % capacity;
  if (at + bytes > capacity) start += capacity - at;  // from the arena's start: bytes lie whole
  if (bytes > capacity || start + bytes - tail > capacity) return std::nullopt;
  return start;
}

// --- the receiver's side

// Maps the mailbox `peer` named for this rank, once it has.
void SharedMemoryMailboxes::State::resolve(Inbox& box, int peer) {
  const std::string key = mailbox_key(peer, rank);
  if (!store->check({key})) return;
  std::istringstream named(text_of(store->get(key)));
  std::string name;
  std::uint64_t nonce = 0;
  std::int64_t made_capacity = 0;
  if (!(named >> name >> nonce >> made_capacity)) {
    box.route = Inbox::Route::kTcp;
    return;
  }
  box.mapped = mailbox_bytes(made_capacity);
  box.base = map_named(name, box.mapped, /*create=*/false);
  box.control = static_cast<MailboxControl*>(box.base);
  if (!box.base || box.control->nonce != nonce || box.control->capacity != made_capacity) {
    throw Error("receive over shared memory: cannot map the mailbox rank " + std::to_string(peer) +
                " made for this rank (" + name +
                "); [comm] shared_memory_mb = 0 keeps every message on TCP");
  }
  box.control->opened.store(1, std::memory_order_release);
  shm_unlink(name.c_str());  // both ends have it: it goes with the last mapping
  box.arena = static_cast<std::byte*>(box.base) + arena_offset();
  box.route = Inbox::Route::kShared;
}

// Gives the pending receives, in the order they were posted, the earliest unread messages with
// their tags.
void SharedMemoryMailboxes::State::match(Inbox& box, int peer) {
  if (box.route == Inbox::Route::kUnknown) resolve(box, peer);
  if (box.route == Inbox::Route::kUnknown) return;
  for (auto it = box.pending.begin(); it != box.pending.end();) {
    Receive& receive = **it;
    if (box.route == Inbox::Route::kTcp) {
      std::vector<at::Tensor> tensors{receive.target};
      receive.tcp = tcp.recv(tensors, peer, receive.tag);
    } else if (!take_letter(box, receive, peer)) {
      ++it;
      continue;
    }
    it = box.pending.erase(it);
  }
}

bool SharedMemoryMailboxes::State::take_letter(Inbox& box, Receive& receive, int peer) {
  const std::uint32_t published = box.control->published.value.load(std::memory_order_acquire);
  for (std::uint32_t number = box.oldest; number != published; ++number) {
    Letter& letter = box.control->letters[number % kLetters];
    // Read already (its letter may hold a later message by now), or another tag.
    if (letter.posted.load(std::memory_order_acquire) != number + 1 ||
        letter.taken.load(std::memory_order_relaxed) == number + 1 || letter.tag != receive.tag) {
      continue;
    }
    const std::int64_t bytes = receive.target.numel() * receive.target.element_size();
    if (letter.bytes != bytes) {
      throw Error("receive over shared memory: rank " + std::to_string(peer) + " sent " +
                  std::to_string(letter.bytes) + " bytes with tag " + std::to_string(receive.tag) +
                  " where this rank receives " + std::to_string(bytes));
    }
    if (letter.via_tcp) {
      std::vector<at::Tensor> tensors{receive.target};
      receive.tcp = tcp.recv(tensors, peer, receive.tag);
    } else {
      const at::Tensor arrived = at::from_blob(box.arena + letter.offset, receive.target.sizes(),
                                               receive.target.options());
      receive.target.copy_(arrived);
      receive.done = true;
    }
    letter.taken.store(number + 1, std::memory_order_release);
    post_counter(box.control->reads, box.control->reads.value.load() + 1,
                 box.control->sender_sleepers);
    while (box.oldest != published) {
      const Letter& first = box.control->letters[box.oldest % kLetters];
      if (first.posted.load(std::memory_order_acquire) == box.oldest + 1 &&
          first.taken.load(std::memory_order_relaxed) != box.oldest + 1) {
        break;
      }
      ++box.oldest;
    }
    return true;
  }
  return false;
}

bool SharedMemoryMailboxes::State::poll(Receive& receive, int peer) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!receive.done && !receive.tcp) match(inboxes[peer], peer);
  return receive.done || (receive.tcp && receive.tcp->isCompleted());
}

void SharedMemoryMailboxes::State::complete(Receive& receive, int peer) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    Inbox& box = inboxes[peer];
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const std::uint32_t observed =
          box.control ? box.control->published.value.load(std::memory_order_acquire) : 0;
      match(box, peer);
      if (receive.done || receive.tcp) break;
      wait_for_message(box, observed, receive, peer, deadline);
    }
  }
  if (receive.tcp) receive.tcp->wait();
}

void SharedMemoryMailboxes::State::wait_for_message(Inbox& box, std::uint32_t observed,
                                                    const Receive& receive, int peer,
                                                    Clock::time_point deadline) {
  if (box.route == Inbox::Route::kShared) {
    if (wait_for_change(box.control->published.value, observed, box.control->receiver_sleepers,
                        spin)) {
      return;
    }
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // until the sender names it
  }
  if (process_has_ended(box.sender_process)) {
    throw Error("receive over shared memory: rank " + std::to_string(peer) + " (process " +
                std::to_string(box.sender_pid) + ") ended before sending the message with tag " +
                std::to_string(receive.tag));
  }
  if (Clock::now() > deadline) {
    throw Error("receive over shared memory: rank " + std::to_string(peer) +
                " sent no message with tag " + std::to_string(receive.tag) + " within " +
                seconds_text(timeout));
  }
}

// --- the group's mailboxes

SharedMemoryMailboxes::SharedMemoryMailboxes(c10::intrusive_ptr<c10d::Store> store, int rank,
                                             std::int64_t capacity_bytes,
                                             std::chrono::milliseconds timeout,
                                             std::chrono::microseconds spin, Tcp tcp)
    : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->rank = rank;
  state_->capacity = round_up(std::max<std::int64_t>(capacity_bytes, 4096), kCacheLine);
  state_->timeout = timeout;
  state_->spin = spin;
  state_->tcp = std::move(tcp);
}

SharedMemoryMailboxes::~SharedMemoryMailboxes() = default;

bool SharedMemoryMailboxes::handles(const std::vector<at::Tensor>& tensors) {
  return tensors.size() == 1 && tensors.front().device().is_cpu() &&
         tensors.front().layout() == at::kStrided && tensors.front().is_contiguous();
}

c10::intrusive_ptr<c10d::Work> SharedMemoryMailboxes::send(const at::Tensor& tensor, int peer,
                                                           int tag) {
  return state_->send(tensor, peer, tag);
}

c10::intrusive_ptr<c10d::Work> SharedMemoryMailboxes::recv(const at::Tensor& tensor, int peer,
                                                           int tag) {
  auto receive = std::make_shared<Receive>();
  receive->target = tensor;
  receive->tag = tag;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    Inbox& box = state_->inboxes[peer];
    state_->watch_sender(box, peer);
    box.pending.push_back(receive);
  }
  auto state = state_;
  at::Tensor result = receive->target;
  return c10::make_intrusive<WaitedWork>(
      c10d::OpType::RECV, "shared_memory:recv", std::move(result),
      [state, receive, peer] { state->complete(*receive, peer); },
      [state, receive, peer] { return state->poll(*receive, peer); });
}

}  // namespace trainyard
