#pragma once
// All-reduces and broadcasts among the ranks of one group that share a host, through a
// shared-memory segment instead of TCP. On a loopback TCP link every byte of an all-reduce is
// copied through the kernel twice and every hand-over between Gloo's threads waits for a core; here
// each rank copies its tensor into its own part of the segment, reduces its share of every rank's
// copy and reads the others' reduced shares back: a few memory copies, in the calling thread.
//
// Progress is made by whoever waits on (or polls) an all-reduce: a launch never waits (it only
// posts the tensor when the segment is set up and has room), and wait() completes every earlier
// all-reduce of the group in order, as every rank issues them in the same order. Ranks that wait
// spin briefly (a core each where the host has one per rank) and then sleep on a futex of the
// segment; a peer that exits or stays away longer than the group's timeout ends the wait with an
// error.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace trainyard {

class SharedMemoryAllreduce {
 public:
  // The group's own TCP all-reduce and broadcast, for a group whose ranks cannot share memory.
  struct Tcp {
    std::function<c10::intrusive_ptr<c10d::Work>(at::Tensor&, c10d::ReduceOp::RedOpType)> allreduce;
    std::function<c10::intrusive_ptr<c10d::Work>(at::Tensor&, int root)> broadcast;
  };

  // Made by each rank at its first collective that can run here (every rank issues the same
  // ones in the same order), without waiting for its peers: the segment is set up as the
  // collectives progress (SegmentSetup). Every rank passes the same `capacity_bytes` (the part of
  // the segment each rank stages its tensor in; larger tensors go in pieces). Where any rank
  // cannot share the host's memory (another host: `all_on_this_host` false, another /dev/shm,
  // too little room in it), the group's collectives, those already launched included, go to
  // `tcp` in the order they were launched.
  SharedMemoryAllreduce(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                        bool all_on_this_host, std::int64_t capacity_bytes,
                        std::chrono::milliseconds timeout, Tcp tcp);
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
  // Whether the group's collectives go to Gloo's TCP from now on (its ranks cannot share memory):
  // the caller may issue them there itself.
  bool over_tcp() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace trainyard
