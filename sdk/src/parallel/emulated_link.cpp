#include "emulated_link.hpp"

#include <algorithm>
#include <thread>

namespace trainyard {

namespace {

// The inner work, finished no earlier than `until`.
class PacedWork final : public c10d::Work {
 public:
  PacedWork(c10::intrusive_ptr<c10d::Work> inner, std::chrono::steady_clock::time_point until)
      : inner_(std::move(inner)), until_(until) {}

  bool isCompleted() override {
    return inner_->isCompleted() && std::chrono::steady_clock::now() >= until_;
  }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool done = inner_->wait(timeout);
    std::this_thread::sleep_until(until_);
    return done;
  }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::chrono::steady_clock::time_point until_;
};

}  // namespace

double EmulatedLink::wire_bytes(const std::string& operation, std::int64_t bytes, int ranks) {
  const double n = std::max(1, ranks);
  const auto size = static_cast<double>(bytes);
  if (operation.starts_with("allreduce")) return 2 * (n - 1) / n * size;
  if (operation.find("allgather") != std::string::npos) return (n - 1) * size;
  if (operation.find("reduce_scatter") != std::string::npos) return (n - 1) / n * size;
  if (operation == "recv" || operation == "recvAnysource") return 0;  // the sender pays
  return size;  // broadcast, reduce, send, gather, scatter, all-to-all: the input once
}

c10::intrusive_ptr<c10d::Work> EmulatedLink::pace(const std::string& operation, std::int64_t bytes,
                                                  int ranks, c10::intrusive_ptr<c10d::Work> work) {
  const double seconds = wire_bytes(operation, bytes, ranks) / bytes_per_second_;
  if (!work || seconds <= 0) return work;
  std::chrono::steady_clock::time_point until;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto start = std::max(Clock::now(), free_at_);
    free_at_ =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    until = free_at_;
  }
  return c10::make_intrusive<PacedWork>(std::move(work), until);
}

}  // namespace trainyard
