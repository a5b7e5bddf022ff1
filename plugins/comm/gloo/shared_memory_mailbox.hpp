#pragma once
// Point-to-point messages between ranks of one host through shared memory: a pipeline's
// activations and gradients. Over loopback TCP each message waits for Gloo's threads to get a
// core on both sides (about a millisecond here); through a mailbox the sender copies the tensor
// in and returns, and the receiver copies it out when it waits.
//
// Each direction between two ranks has a mailbox of its own, made by the sender at its first
// message to that peer: letters (message number, tag, size, where the bytes lie) and an arena
// the bytes go to, used as a ring. The receiver maps it at its first receive from that peer.
// Receives match messages by tag, the earliest first, in the order the receives were posted, as
// c10d's point-to-point operations do. A message that does not fit the arena's free space goes
// over TCP instead, its letter saying so; so do all messages between ranks of different hosts
// (announce_host, shared_memory_segment.hpp). A receive
// waiting for a peer of this host whose process has ended fails within 50 ms.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace trainyard {

class SharedMemoryMailboxes {
 public:
  // The group's own TCP send and receive, for the messages that do not go through a mailbox.
  struct Tcp {
    std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&, int peer, int tag)> send;
    std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&, int peer, int tag)> recv;
  };

  // `capacity_bytes`: each mailbox's arena; `timeout`: how long a receive waits for a sender
  // that has not ended, or a sender for a letter, before it fails; `spin`: how long a waiting
  // rank spins before it sleeps.
  SharedMemoryMailboxes(c10::intrusive_ptr<c10d::Store> store, int rank,
                        std::int64_t capacity_bytes, std::chrono::milliseconds timeout,
                        std::chrono::microseconds spin, Tcp tcp);
  ~SharedMemoryMailboxes();
  SharedMemoryMailboxes(const SharedMemoryMailboxes&) = delete;
  SharedMemoryMailboxes& operator=(const SharedMemoryMailboxes&) = delete;

  // Whether a send or receive of `tensors` goes through here: one contiguous CPU tensor (what
  // Gloo's own sends and receives take). Both ends of a message get the same answer for the same
  // tensors.
  static bool handles(const std::vector<at::Tensor>& tensors);
  // Complete at once when the message went into the mailbox (the tensor may be reused).
  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& tensor, int peer, int tag);
  // Completed by waiting on it, or by polling isCompleted().
  c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& tensor, int peer, int tag);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace trainyard
