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

// Waits for `work` (as a CollectiveWait) and drops it. Where the collective runs on host
// tensors (`host`), it first yields until the communicator's worker has let go of the work too,
// for a few milliseconds at most: the work holds its tensors, and what it allocated for them on
// the caller's thread, which would otherwise be freed later, on the worker's thread, and be
// counted beside what the caller allocates meanwhile (a step could end holding a collective's
// tensors, at random).
void wait_released(c10::intrusive_ptr<c10d::Work> work, bool host);

class ReleasedCollective {
 public:
  // `tensors`: those the collective about to be issued reads or writes; how many references
  // the caller holds to each is noted now.
  explicit ReleasedCollective(std::vector<at::Tensor> tensors);

  // Waits for `work` (wait_released), then yields until no one else refers to the host tensors
  // among them, for a few milliseconds at most: past that, the memory is left to whoever still
  // holds it.
  void wait(c10::intrusive_ptr<c10d::Work> work);

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<std::size_t> references_;
};

}  // namespace trainyard
