#pragma once
// All-reduces and broadcasts among the ranks of one group that share a host, through a
// shared-memory segment instead of TCP. On a loopback TCP link every byte of an all-reduce is
// copied through the kernel twice and every hand-over between Gloo's threads waits for a core; here
// each rank copies its tensor into its own part of the segment, reduces its share of every rank's
// copy and reads the others' reduced shares back: a few memory copies, in the calling thread.
//
// Progress is made by whoever waits on (or polls) an all-reduce: a launch only posts the
// tensor when the segment has room, and wait() completes every earlier all-reduce of the group
// in order, as every rank issues them in the same order. Ranks that wait spin briefly (a core
// each where the host has one per rank) and then sleep on a futex of the segment; a peer that
// exits or stays away longer than the group's timeout ends the wait with an error.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace trainyard {

class SharedMemoryAllreduce {
 public:
  // Collective over the group's store: every rank calls it with the same `capacity_bytes` (the
  // part of the segment each rank stages its tensor in; larger tensors go in pieces). Null on
  // every rank when any rank cannot map the segment (another host, another /dev/shm, too little
  // room): the group then keeps its all-reduces on TCP.
  static std::unique_ptr<SharedMemoryAllreduce> connect(c10d::Store& store, int rank, int size,
                                                        std::int64_t capacity_bytes,
                                                        std::chrono::milliseconds timeout);
  ~SharedMemoryAllreduce();
  SharedMemoryAllreduce(const SharedMemoryAllreduce&) = delete;
  SharedMemoryAllreduce& operator=(const SharedMemoryAllreduce&) = delete;

  // Whether an all-reduce of `tensors` with `options` runs here: one dense CPU tensor and a sum,
  // product, minimum or maximum. The same answer on every rank for the same call.
  static bool handles(const std::vector<at::Tensor>& tensors,
                      const c10d::AllreduceOptions& options);
  c10::intrusive_ptr<c10d::Work> allreduce(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op);
  // Whether a broadcast of `tensors` runs here: one dense CPU tensor, any dtype.
  static bool handles(const std::vector<at::Tensor>& tensors,
                      const c10d::BroadcastOptions& options);
  c10::intrusive_ptr<c10d::Work> broadcast(const at::Tensor& tensor, int root);

  struct State;

 private:
  explicit SharedMemoryAllreduce(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace trainyard
