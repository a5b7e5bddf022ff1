#include "trainyard/parallel/collective_counter.hpp"

#include <sstream>
#include <vector>

#include "emulated_link.hpp"

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
  CountingBackend(c10::intrusive_ptr<c10d::Backend> inner, std::string group_name,
                  std::shared_ptr<CollectiveCounter> counter)
      : c10d::Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        group_name_(std::move(group_name)),
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
    const std::int64_t bytes = bytes_of(tensors);
    count("broadcast", bytes);
    return paced("broadcast", bytes, inner_->broadcast(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const std::int64_t bytes = bytes_of(tensors);
    count("allreduce", bytes);
    return paced("allreduce", bytes, inner_->allreduce(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    const std::int64_t bytes = bytes_of(tensors);
    count("allreduce_sparse", bytes);
    return paced("allreduce_sparse", bytes, inner_->allreduce_sparse(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    const std::int64_t bytes = bytes_of(tensors);
    count("allreduce_coalesced", bytes);
    return paced("allreduce_coalesced", bytes, inner_->allreduce_coalesced(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const std::int64_t bytes = bytes_of(tensors);
    count("reduce", bytes);
    return paced("reduce", bytes, inner_->reduce(tensors, opts));
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const std::int64_t bytes = bytes_of(inputs);
    count("allgather", bytes);
    return paced("allgather", bytes, inner_->allgather(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    const std::int64_t bytes = bytes_of(input);
    count("_allgather_base", bytes);
    return paced("_allgather_base", bytes, inner_->_allgather_base(output, input, opts));
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    const std::int64_t bytes = bytes_of(inputs);
    count("allgather_coalesced", bytes);
    return paced("allgather_coalesced", bytes, inner_->allgather_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    const std::int64_t bytes = bytes_of(inputs);
    count("allgather_into_tensor_coalesced", bytes);
    return paced("allgather_into_tensor_coalesced", bytes, inner_->allgather_into_tensor_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const std::int64_t bytes = bytes_of(inputs);
    count("gather", bytes);
    return paced("gather", bytes, inner_->gather(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const std::int64_t bytes = bytes_of(inputs);
    count("scatter", bytes);
    return paced("scatter", bytes, inner_->scatter(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const std::int64_t bytes = bytes_of(inputs);
    count("reduce_scatter", bytes);
    return paced("reduce_scatter", bytes, inner_->reduce_scatter(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const std::int64_t bytes = bytes_of(input);
    count("_reduce_scatter_base", bytes);
    return paced("_reduce_scatter_base", bytes, inner_->_reduce_scatter_base(output, input, opts));
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    const std::int64_t bytes = bytes_of(inputs);
    count("reduce_scatter_tensor_coalesced", bytes);
    return paced("reduce_scatter_tensor_coalesced", bytes, inner_->reduce_scatter_tensor_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override {
    const std::int64_t bytes = bytes_of(input);
    count("alltoall_base", bytes);
    return paced("alltoall_base", bytes, inner_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts));
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    const std::int64_t bytes = bytes_of(inputs);
    count("alltoall", bytes);
    return paced("alltoall", bytes, inner_->alltoall(outputs, inputs, opts));
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    count("monitoredBarrier", 0);
    inner_->monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override {
    const std::int64_t bytes = bytes_of(tensors);
    count("send", bytes);
    return paced("send", bytes, inner_->send(tensors, dst_rank, tag));
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override {
    const std::int64_t bytes = bytes_of(tensors);
    count("recv", bytes);
    return paced("recv", bytes, inner_->recv(tensors, src_rank, tag));
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    const std::int64_t bytes = bytes_of(tensors);
    count("recvAnysource", bytes);
    return paced("recvAnysource", bytes, inner_->recvAnysource(tensors, tag));
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    count("barrier", 0);
    return inner_->barrier(opts);
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
    counter_->add(group_name_, operation, bytes);
  }

  // The work as it finishes over the counter's emulated link, if it has one.
  c10::intrusive_ptr<c10d::Work> paced(const char* operation, std::int64_t bytes,
                                       c10::intrusive_ptr<c10d::Work> work) {
    const std::shared_ptr<EmulatedLink> link = counter_->link();
    return link ? link->pace(operation, bytes, getSize(), std::move(work)) : work;
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  std::string group_name_;
  std::shared_ptr<CollectiveCounter> counter_;
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

void CollectiveCounter::emulate_link(double bytes_per_second) {
  std::lock_guard<std::mutex> lock(mutex_);
  link_ = bytes_per_second > 0 ? std::make_shared<EmulatedLink>(bytes_per_second) : nullptr;
}

std::shared_ptr<EmulatedLink> CollectiveCounter::link() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return link_;
}

c10::intrusive_ptr<c10d::Backend> counting_backend(c10::intrusive_ptr<c10d::Backend> inner,
                                                   std::string group_name,
                                                   std::shared_ptr<CollectiveCounter> counter) {
  if (!inner) return inner;
  return c10::make_intrusive<CountingBackend>(std::move(inner), std::move(group_name),
                                              std::move(counter));
}

c10::intrusive_ptr<c10d::Backend> uncounted(const c10::intrusive_ptr<c10d::Backend>& backend) {
  if (const auto* counting = dynamic_cast<const CountingBackend*>(backend.get())) {
    return counting->inner();
  }
  return backend;
}

}  // namespace trainyard
