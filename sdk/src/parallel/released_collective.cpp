#include "released_collective.hpp"

#include <chrono>
#include <thread>

#include "trainyard/parallel/distributed.hpp"

namespace trainyard {

namespace {

constexpr std::chrono::milliseconds kLongestWait(5);

}  // namespace

ReleasedCollective::ReleasedCollective(std::vector<at::Tensor> tensors)
    : tensors_(std::move(tensors)) {
  for (const at::Tensor& tensor : tensors_) references_.push_back(tensor.use_count());
}

void ReleasedCollective::wait(c10::intrusive_ptr<c10d::Work> work) {
  {
    CollectiveWait waiting;
    work->wait();
  }
  work.reset();
  const auto until = std::chrono::steady_clock::now() + kLongestWait;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    // A device backend's work stays with its watchdog until the device has run it, and the
    // caching allocator orders reuse by stream: only host memory is waited for.
    if (!tensors_[i].is_cpu()) continue;
    while (tensors_[i].use_count() > references_[i] && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  }
}

}  // namespace trainyard
