#include "trainyard/parallel/collective_counter.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include "collective_checks.hpp"
#include "emulated_link.hpp"
#include "recorded_work.hpp"
#include "trainyard/runtime/dtype_name.hpp"

namespace trainyard {

namespace {

std::int64_t bytes_of(const at::Tensor& tensor) {
  return tensor.defined() ? tensor.numel() * static_cast<std::int64_t>(tensor.element_size()) : 0;
}

std::int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  std::int64_t total = 0;
  for (const auto& tensor : tensors) total += bytes_of(tensor);
  return total;
}

std::int64_t bytes_of(const std::vector<std::vector<at::Tensor>>& lists) {
  std::int64_t total = 0;
  for (const auto& tensors : lists) total += bytes_of(tensors);
  return total;
}

void add_tensors(std::vector<at::Tensor>& out, const at::Tensor& tensor) { out.push_back(tensor); }

void add_tensors(std::vector<at::Tensor>& out, const std::vector<at::Tensor>& tensors) {
  out.insert(out.end(), tensors.begin(), tensors.end());
}

void add_tensors(std::vector<at::Tensor>& out, const std::vector<std::vector<at::Tensor>>& lists) {
  for (const auto& tensors : lists) add_tensors(out, tensors);
}

// An operation's input tensors as one list, whatever shape its arguments take.
template <typename Inputs>
std::vector<at::Tensor> tensor_list(const Inputs& inputs) {
  std::vector<at::Tensor> out;
  add_tensors(out, inputs);
  return out;
}

// TRAINYARD_TEST_SKIP_COLLECTIVE="RANK:STEP" (see CountingBackend::skipped_by_test_hook).
std::optional<std::pair<int, std::int64_t>> planned_skip() {
  const char* text = std::getenv("TRAINYARD_TEST_SKIP_COLLECTIVE");
  int rank = -1;
  long long step = -1;
  if (!text || std::sscanf(text, "%d:%lld", &rank, &step) != 2) return std::nullopt;
  return std::make_pair(rank, static_cast<std::int64_t>(step));
}

std::string bytes_text(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  auto value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  std::ostringstream out;
  out.precision(unit == 0 ? 0 : 1);
  out << std::fixed << value << " " << units[unit];
  return out.str();
}

// Everything trainyard's code and c10d's own helpers may call is forwarded, so that wrapping a
// group never changes what it can do; the operations that move tensors are also counted.
class CountingBackend final : public c10d::Backend {
 public:
  CountingBackend(c10::intrusive_ptr<c10d::Backend> inner,
                  std::shared_ptr<const CollectiveGroup> group,
                  std::shared_ptr<CollectiveCounter> counter)
      : c10d::Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        group_(std::move(group)),
        counter_(std::move(counter)) {
    pg_uid_ = inner_->getGroupUid();
    pg_desc_ = inner_->getGroupDesc();
    bound_device_id_ = inner_->getBoundDeviceId();
  }

  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }

  bool supportsSplitting() const override { return inner_->supportsSplitting(); }
  bool supportsCoalescing() const override { return inner_->supportsCoalescing(); }
  bool supportsTimeEstimation() const override { return inner_->supportsTimeEstimation(); }
  bool supportsShrinking() const override { return inner_->supportsShrinking(); }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
      const c10::intrusive_ptr<Options>& opts_override) override {
    return inner_->shrink(ranks_to_exclude, shrink_flags, opts_override);
  }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void startCoalescing() override { inner_->startCoalescing(); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override { return inner_->endCoalescing(); }
  const std::string getBackendName() const override { return inner_->getBackendName(); }
  c10::intrusive_ptr<Options> getBackendOptions() override { return inner_->getBackendOptions(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return issue("broadcast", tensors, [&] { return inner_->broadcast(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return issue("allreduce", tensors, [&] { return inner_->allreduce(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    return issue("allreduce_sparse", tensors, [&] { return inner_->allreduce_sparse(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return issue("allreduce_coalesced", tensors, [&] { return inner_->allreduce_coalesced(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    return issue("reduce", tensors, [&] { return inner_->reduce(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return issue("allgather", inputs, [&] { return inner_->allgather(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return issue("_allgather_base", input, [&] { return inner_->_allgather_base(output, input, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    return issue("allgather_coalesced", inputs, [&] { return inner_->allgather_coalesced(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return issue("allgather_into_tensor_coalesced", inputs, [&] { return inner_->allgather_into_tensor_coalesced(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    return issue("gather", inputs, [&] { return inner_->gather(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return issue("scatter", inputs, [&] { return inner_->scatter(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    return issue("reduce_scatter", inputs, [&] { return inner_->reduce_scatter(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    return issue("_reduce_scatter_base", input, [&] { return inner_->_reduce_scatter_base(output, input, opts); });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return issue("reduce_scatter_tensor_coalesced", inputs, [&] { return inner_->reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override {
    return issue("alltoall_base", input, [&] { return inner_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts); });
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    return issue("alltoall", inputs, [&] { return inner_->alltoall(outputs, inputs, opts); });
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    count("monitoredBarrier", 0);
    inner_->monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override {
    return issue_point_to_point("send", tensors, dst_rank, [&] { return inner_->send(tensors, dst_rank, tag); });
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override {
    return issue_point_to_point("recv", tensors, src_rank, [&] { return inner_->recv(tensors, src_rank, tag); });
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return issue_point_to_point("recvAnysource", tensors, -1, [&] { return inner_->recvAnysource(tensors, tag); });
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return issue("barrier", std::vector<at::Tensor>{}, [&] { return inner_->barrier(opts); });
  }
  void registerOnCompletionHook(
      std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override {
    inner_->registerOnCompletionHook(std::move(hook));
  }
  void waitForPendingWorks() override { inner_->waitForPendingWorks(); }
  void enableCollectivesTiming() override { inner_->enableCollectivesTiming(); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override {
    return inner_->split(store, ranks, opts);
  }
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                          const c10::intrusive_ptr<Options>& opts, const int& rank,
                                          const int& size) override {
    return inner_->merge(store, opts, rank, size);
  }
  void setGroupUid(const std::string& pg_uid) override {
    c10d::Backend::setGroupUid(pg_uid);
    inner_->setGroupUid(pg_uid);
  }
  void eagerConnectSingleDevice(at::Device device) override {
    inner_->eagerConnectSingleDevice(device);
  }
  c10d::ErrorType getError() override { return inner_->getError(); }
  std::shared_ptr<c10::Allocator> getMemAllocator() override { return inner_->getMemAllocator(); }
  at::Tensor allocateTensor(long size, at::TensorOptions options) override {
    return inner_->allocateTensor(size, options);
  }
  bool supportsTensorAlloc(c10::DeviceIndex device_index) override {
    return inner_->supportsTensorAlloc(device_index);
  }
  void abort() override { inner_->abort(); }
  void shutdown() override { inner_->shutdown(); }

 private:
  // Counted before forwarding: a call that throws was still issued.
  void count(const char* operation, std::int64_t bytes) {
    counter_->add(group_->name, operation, bytes);
  }

  // A collective: counted, checked against the group's under debug = "detail", recorded, and
  // paced over the counter's emulated link, if it has one.
  template <typename Inputs, typename Call>
  c10::intrusive_ptr<c10d::Work> issue(const char* operation, const Inputs& inputs, Call&& call) {
    const std::int64_t bytes = bytes_of(inputs);
    count(operation, bytes);
    const std::int64_t sequence = ++collectives_;
    if (counter_->checks_collectives()) {
      // A barrier moves no tensor to take the exchange's device from: left unchecked.
      const std::vector<at::Tensor> tensors = tensor_list(inputs);
      if (!tensors.empty()) check_same_collective(*inner_, *group_, sequence, operation, tensors);
    }
    if (skipped_by_test_hook()) return completed_work();
    return paced(operation, bytes,
                 recorded(operation, sequence, -1, inputs, std::forward<Call>(call)));
  }

  // A send or receive, numbered among those with the same peer and direction.
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> issue_point_to_point(const char* operation,
                                                      const std::vector<at::Tensor>& tensors,
                                                      int peer, Call&& call) {
    const std::int64_t bytes = bytes_of(tensors);
    count(operation, bytes);
    std::int64_t sequence = 0;
    {
      std::lock_guard<std::mutex> lock(point_to_point_mutex_);
      sequence = ++point_to_point_[{operation[0] == 's', peer}];
    }
    return paced(operation, bytes,
                 recorded(operation, sequence, peer, tensors, std::forward<Call>(call)));
  }

  template <typename Inputs, typename Call>
  c10::intrusive_ptr<c10d::Work> recorded(const char* operation, std::int64_t sequence, int peer,
                                          const Inputs& inputs, Call&& call) {
    const std::shared_ptr<FlightRecorder> recorder = counter_->recorder();
    if (!recorder) return call();
    const std::vector<at::Tensor> tensors = tensor_list(inputs);
    CollectiveRecord record;
    record.group = group_;
    record.sequence = sequence;
    record.operation = operation;
    record.peer = peer;
    record.dtype = tensors.empty() ? "none" : dtype_name(tensors.front().scalar_type());
    record.shapes.reserve(tensors.size());
    for (const auto& tensor : tensors) record.shapes.push_back(tensor.sizes().vec());
    const std::int64_t id = recorder->issued(std::move(record));
    try {
      return recorded_work(call(), recorder, id);
    } catch (...) {
      recorder->finished(id, false);
      throw;
    }
  }

  c10::intrusive_ptr<c10d::Work> paced(const char* operation, std::int64_t bytes,
                                       c10::intrusive_ptr<c10d::Work> work) {
    const std::shared_ptr<EmulatedLink> link = counter_->link();
    return link ? link->pace(operation, bytes, getSize(), std::move(work)) : work;
  }

  // TRAINYARD_TEST_SKIP_COLLECTIVE="RANK:STEP": global rank RANK does not issue the first
  // collective of its groups in step STEP, as a rank whose code takes another branch would not.
  bool skipped_by_test_hook() {
    static const std::optional<std::pair<int, std::int64_t>> planned = planned_skip();
    static std::atomic<bool> done{false};
    const std::shared_ptr<FlightRecorder> recorder = counter_->recorder();
    if (!planned || !recorder || done) return false;
    if (group_->ranks.at(static_cast<std::size_t>(getRank())) != planned->first ||
        recorder->step() != planned->second || done.exchange(true)) {
      return false;
    }
    --collectives_;  // never issued: the group's next collective takes its number
    std::cerr << "rank " << planned->first << ": test hook: skipping a collective on "
              << group_->name << " in step " << planned->second << std::endl;
    return true;
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  std::shared_ptr<const CollectiveGroup> group_;
  std::shared_ptr<CollectiveCounter> counter_;
  std::atomic<std::int64_t> collectives_{0};
  std::mutex point_to_point_mutex_;
  std::map<std::pair<bool, int>, std::int64_t> point_to_point_;  // (send, peer) -> count
};

}  // namespace

std::map<std::string, CollectiveCount> per_group(const CollectiveCounts& counts) {
  std::map<std::string, CollectiveCount> out;
  for (const auto& [key, count] : counts) {
    CollectiveCount& total = out[key.first];
    total.calls += count.calls;
    total.bytes += count.bytes;
  }
  return out;
}

std::string describe(const CollectiveCounts& counts) {
  if (counts.empty()) return "no collectives";
  std::string out;
  std::string group;
  for (const auto& [key, count] : counts) {
    if (key.first != group) {
      out += (out.empty() ? "" : "; ") + key.first + ": ";
      group = key.first;
    } else {
      out += ", ";
    }
    out += key.second + " " + std::to_string(count.calls) + " (" + bytes_text(count.bytes) + ")";
  }
  return out;
}

void CollectiveCounter::add(const std::string& group, const std::string& operation,
                            std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveCount& count = counts_[{group, operation}];
  ++count.calls;
  count.bytes += bytes;
}

CollectiveCounts CollectiveCounter::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

CollectiveCounts CollectiveCounter::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveCounts out;
  out.swap(counts_);
  return out;
}

std::string CollectiveCounter::describe() const { return trainyard::describe(snapshot()); }

void CollectiveCounter::record_flights(std::size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  recorder_ = capacity > 0 ? std::make_shared<FlightRecorder>(capacity) : nullptr;
}

std::shared_ptr<FlightRecorder> CollectiveCounter::recorder() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recorder_;
}

void CollectiveCounter::check_collectives(bool on) { check_collectives_ = on; }

void CollectiveCounter::emulate_link(double bytes_per_second) {
  std::lock_guard<std::mutex> lock(mutex_);
  link_ = bytes_per_second > 0 ? std::make_shared<EmulatedLink>(bytes_per_second) : nullptr;
}

std::shared_ptr<EmulatedLink> CollectiveCounter::link() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return link_;
}

c10::intrusive_ptr<c10d::Backend> counting_backend(c10::intrusive_ptr<c10d::Backend> inner,
                                                   CollectiveGroup group,
                                                   std::shared_ptr<CollectiveCounter> counter) {
  if (!inner) return inner;
  if (group.ranks.empty()) {
    for (int r = 0; r < inner->getSize(); ++r) group.ranks.push_back(r);
  }
  return c10::make_intrusive<CountingBackend>(
      std::move(inner), std::make_shared<const CollectiveGroup>(std::move(group)),
      std::move(counter));
}

c10::intrusive_ptr<c10d::Backend> uncounted(const c10::intrusive_ptr<c10d::Backend>& backend) {
  if (const auto* counting = dynamic_cast<const CountingBackend*>(backend.get())) {
    return counting->inner();
  }
  return backend;
}

}  // namespace trainyard
