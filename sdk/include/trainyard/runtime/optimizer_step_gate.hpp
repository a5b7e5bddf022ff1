#pragma once
// The point in a training step right before the optimizer changes the parameters and its state
// in place. Work that must read them as the previous step left them, such as an asynchronous
// checkpoint writing them during the next step's forward and backward, holds the gate;
// the strategy enters it right before its optimizer steps, and waits there until that work is
// done. Forward and backward, which leave those tensors alone, never wait.

#include <future>
#include <mutex>

namespace trainyard {

class OptimizerStepGate {
 public:
  // The next enter() waits until `done` is ready. A newer hold replaces an older one, which the
  // holder has finished with by then (the checkpoint store commits one save before the next).
  void hold(std::shared_future<void> done);
  // Called by strategies before every optimizer step, stepped or skipped; returns at once unless
  // the gate is held. Failures of the holder's work are the holder's to report, not the step's.
  void enter();
  // Whether a hold has not been entered yet: after a training step, a strategy that stepped
  // without entering the gate.
  bool held() const;

 private:
  mutable std::mutex mutex_;
  std::shared_future<void> done_;
};

}  // namespace trainyard
