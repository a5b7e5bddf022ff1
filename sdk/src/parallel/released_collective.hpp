#pragma once
// A collective waited for until the communicator has let go of its tensors. A host
// communicator's worker thread can drop its references to a finished collective's tensors a
// moment after wait() returns, so a tensor whose last user frees it in that moment stays
// allocated until the worker gets there: a tensor-parallel forward, whose blocks all-reduce and
// then drop their outputs, kept one such tensor more at random when the allocator measured it
// (run.track_memory), and the allocator could not hand the memory to the next operation at once.
// Internal to the SDK library.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

namespace trainyard {

class ReleasedCollective {
 public:
  // `tensors`: those the collective about to be issued reads or writes; how many references
  // the caller holds to each is noted now.
  explicit ReleasedCollective(std::vector<at::Tensor> tensors);

  // Waits for `work` (as a CollectiveWait), drops it, then yields until no one else refers to
  // the host tensors among them, for a few milliseconds at most: past that, the memory is left
  // to whoever still holds it.
  void wait(c10::intrusive_ptr<c10d::Work> work);

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<std::size_t> references_;
};

}  // namespace trainyard
