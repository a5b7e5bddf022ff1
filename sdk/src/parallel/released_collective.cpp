#include "released_collective.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "recorded_work.hpp"
#include "trainyard/parallel/distributed.hpp"

namespace trainyard {

namespace {

constexpr std::chrono::milliseconds kLongestWait(5);

}  // namespace

ReleasedCollective::ReleasedCollective(std::vector<at::Tensor> tensors)
    : tensors_(std::move(tensors)) {
  for (const at::Tensor& tensor : tensors_) references_.push_back(tensor.use_count());
}

void wait_released(c10::intrusive_ptr<c10d::Work> work, bool host) {
  {
    CollectiveWait waiting;
    work->wait();
  }
  // A device backend's work stays with its watchdog until the device has run it, and the
  // caching allocator orders reuse by stream: only host work is waited for.
  if (!host) return;
  c10::intrusive_ptr<c10d::Work> own = communicator_work(work);
  work.reset();
  const auto until = std::chrono::steady_clock::now() + kLongestWait;
  while (own.use_count() > 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
}

void ReleasedCollective::wait(c10::intrusive_ptr<c10d::Work> work) {
  const bool host = std::any_of(tensors_.begin(), tensors_.end(),
                                [](const at::Tensor& tensor) { return tensor.is_cpu(); });
  wait_released(std::move(work), host);
  const auto until = std::chrono::steady_clock::now() + kLongestWait;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensors_[i].is_cpu()) continue;  // as wait_released
    while (tensors_[i].use_count() > references_[i] && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  }
}

}  // namespace trainyard
