#pragma once
// Works as the counting backend hands them back: one that marks its flight record finished when
// it is waited for (or found complete), and one already complete for a collective never issued.

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <memory>

#include "trainyard/parallel/flight_recorder.hpp"

namespace trainyard {

// `work`, whose record `id` in `recorder` becomes completed when a wait() on it returns or
// isCompleted() finds it done, and failed when its wait throws. Completion is what the rank
// observes: on a GPU backend a wait returns once the collective is ordered on the current stream.
c10::intrusive_ptr<c10d::Work> recorded_work(c10::intrusive_ptr<c10d::Work> work,
                                             std::shared_ptr<FlightRecorder> recorder,
                                             std::int64_t id);

// The communicator's own work beneath `work`: the work the communicator's threads hold, which
// recording wraps. `work` itself when it is not a recording.
c10::intrusive_ptr<c10d::Work> communicator_work(const c10::intrusive_ptr<c10d::Work>& work);

// A work that has already finished, successfully.
c10::intrusive_ptr<c10d::Work> completed_work();

}  // namespace trainyard
