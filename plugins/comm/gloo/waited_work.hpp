#pragma once
// A c10d::Work that whoever waits on it, or polls it, completes: the shared-memory collectives
// and messages have no thread of their own to make progress.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

namespace trainyard {

class WaitedWork final : public c10d::Work {
 public:
  // `complete` makes progress until the operation is done (throwing when it fails); `poll` makes
  // what progress it can without waiting and says whether it is done. `title` names the
  // operation in a profile, from its launch to its completion; `result` is the tensor it fills.
  WaitedWork(c10d::OpType type, const char* title, at::Tensor result,
             std::function<void()> complete, std::function<bool()> poll)
      : c10d::Work(-1, type, title, std::vector<at::Tensor>{result}),
        result_(std::move(result)),
        complete_(std::move(complete)),
        poll_(std::move(poll)) {}

  bool isCompleted() override {
    if (c10d::Work::isCompleted()) return true;
    try {
      if (poll_()) finish();
    } catch (...) {
      finish(std::current_exception());
    }
    return c10d::Work::isCompleted();
  }

  bool wait(std::chrono::milliseconds /*timeout: the group's, from its options*/) override {
    try {
      complete_();
    } catch (...) {
      finish(std::current_exception());
      throw;
    }
    finish();
    return true;
  }

  std::vector<at::Tensor> result() override { return {result_}; }

  // The future of the finished operation: progress is made by waiting, here.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    wait(kNoTimeout);
    auto future =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(std::vector<at::Tensor>{result_}));
    return future;
  }

 private:
  at::Tensor result_;
  std::function<void()> complete_;
  std::function<bool()> poll_;
};

}  // namespace trainyard
