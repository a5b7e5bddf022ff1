#include "recorded_work.hpp"

namespace trainyard {

namespace {

class RecordedWork final : public c10d::Work {
 public:
  RecordedWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<FlightRecorder> recorder,
               std::int64_t id)
      : inner_(std::move(inner)), recorder_(std::move(recorder)), id_(id) {}

  bool isCompleted() override {
    const bool done = inner_->isCompleted();
    if (done) recorder_->finished(id_, inner_->exception() == nullptr);
    return done;
  }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override {
    try {
      const bool done = inner_->wait(timeout);
      if (done) recorder_->finished(id_, true);
      return done;
    } catch (...) {
      recorder_->finished(id_, false);
      throw;
    }
  }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

  const c10::intrusive_ptr<c10d::Work>& inner() const { return inner_; }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  std::int64_t id_;
};

class CompletedWork final : public c10d::Work {
 public:
  CompletedWork() { finish(); }
};

}  // namespace

c10::intrusive_ptr<c10d::Work> recorded_work(c10::intrusive_ptr<c10d::Work> work,
                                             std::shared_ptr<FlightRecorder> recorder,
                                             std::int64_t id) {
  if (!work) {
    recorder->finished(id, true);
    return work;
  }
  return c10::make_intrusive<RecordedWork>(std::move(work), std::move(recorder), id);
}

c10::intrusive_ptr<c10d::Work> communicator_work(const c10::intrusive_ptr<c10d::Work>& work) {
  c10::intrusive_ptr<c10d::Work> own = work;
  while (const auto* recorded = dynamic_cast<const RecordedWork*>(own.get()))
    own = recorded->inner();
  return own;
}

c10::intrusive_ptr<c10d::Work> completed_work() { return c10::make_intrusive<CompletedWork>(); }

}  // namespace trainyard
