#pragma once
// Activation bundles and their gradients between the ranks of a pipeline group, over the group's
// c10d point-to-point operations. Sends start at once and complete in the background; a receive
// is posted early and waited on when its data is needed, so transfers overlap compute. The
// shapes and dtypes of what travels between two stages are agreed once, by a small spec message
// ahead of the first transfer of each kind and micro-batch size, and cached on both sides.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "trainyard/api/activations.hpp"

namespace c10d {
class Backend;
}

namespace trainyard {

// What a message carries; with the stage and micro-batch it makes the message's tag, so that
// receives posted out of order still match their sends.
enum class StageMessage : int {
  kActivation = 0,      // a stage's output bundle, to the next stage
  kGradient = 1,        // the gradient of a stage's input bundle, to the previous stage
  kEvalActivation = 2,  // an evaluation batch's output bundle
  kTiedGradient = 3,    // a tied parameter's gradient, between the stages that hold it
};

// One tensor of a bundle as it travels.
struct TravellingTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> shape;
};

class StageChannel {
 public:
  // `group` is the pipeline group (ranks are its group ranks), `return_group` the backend over
  // the same ranks that the gradients travel back on (ProcessMesh::pipeline_return_group: a
  // backend of its own where the communicator asks for one per direction, so that two stages
  // sending to each other at once do not wait for one another); `device` where buffers live.
  StageChannel(c10::intrusive_ptr<c10d::Backend> group,
               c10::intrusive_ptr<c10d::Backend> return_group, at::Device device);
  ~StageChannel();
  StageChannel(const StageChannel&) = delete;
  StageChannel& operator=(const StageChannel&) = delete;

  // A receive in flight; wait() for its bundle.
  class Pending {
   public:
    Pending() = default;

   private:
    friend class StageChannel;
    int peer = -1;
    StageMessage kind = StageMessage::kActivation;
    int tag = 0;
    std::tuple<int, int, int, std::int64_t> key;  // the spec cache key
    bool posted = false;                          // data receives are posted (spec known)
    std::vector<TravellingTensor> spec;
    std::vector<at::Tensor> buffers;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };

  // Starts sending `bundle`'s tensors (detached, made contiguous) to `peer`. `rows` is the
  // micro-batch's sample count: bundles of another size are agreed anew.
  void send(const Activations& bundle, int peer, StageMessage kind, int stage, int micro_batch,
            std::int64_t rows);
  // Posts the receive of what `peer` sends with the same arguments. When its spec is not known
  // yet, the data receives are posted by wait(), after the spec (never blocking here, so an
  // early post cannot wait on a message its peer sends only later).
  Pending receive(int peer, StageMessage kind, int stage, int micro_batch, std::int64_t rows);
  // Waits for the receive (inside a CollectiveWait, so a dead peer is named) and returns it.
  Activations wait(Pending& pending);
  // Waits for every send started so far; their tensors are released.
  void wait_sends();
  // Waits for the sends of the bundle sent with these arguments and drops their tensors. Called
  // once the peer has answered that bundle (the next stage's gradient for the micro-batch has
  // arrived), so the wait returns at once; otherwise a stage would keep every micro-batch's
  // output alive until wait_sends at the step's end, m outputs where 1F1B means to hold p.
  void release_sent(int peer, StageMessage kind, int stage, int micro_batch);

 private:
  static int tag_of(StageMessage kind, int stage, int micro_batch, bool spec);
  void post(Pending& pending);
  // The backend messages of `kind` travel on.
  c10d::Backend& group_of(StageMessage kind) const;

  c10::intrusive_ptr<c10d::Backend> group_;
  c10::intrusive_ptr<c10d::Backend> return_group_;
  at::Device device_;
  // Specs sent (to keep the sender's side in step) and received, by (peer, kind, stage, rows).
  std::map<std::tuple<int, int, int, std::int64_t>, std::vector<TravellingTensor>> sent_specs_;
  std::map<std::tuple<int, int, int, std::int64_t>, std::vector<TravellingTensor>> received_specs_;
  struct Send {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor tensor;  // kept alive until the send completes
    int peer = -1;
    int tag = 0;
  };
  std::vector<Send> sends_;
};

}  // namespace trainyard
