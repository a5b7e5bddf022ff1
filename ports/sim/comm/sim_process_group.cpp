#include "sim_process_group.hpp"

#include <ATen/ops/from_blob.h>

namespace sim {
namespace {

// A CPU view of a sim tensor's bytes that keeps the sim storage alive as long as the view lives
// (the transport may hold it until its work completes). CPU tensors pass through.
at::Tensor on_host(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.is_cpu()) return tensor;
  TORCH_CHECK(tensor.is_privateuseone(), "comm 'sim': expected sim or CPU tensors, got ",
              tensor.device().str());
  c10::Storage storage = tensor.storage();
  return at::from_blob(
      tensor.data_ptr(), tensor.sizes(), tensor.strides(), [storage](void*) {},
      tensor.options().device(at::kCPU));
}

std::vector<at::Tensor> on_host(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  views.reserve(tensors.size());
  for (const auto& tensor : tensors) views.push_back(on_host(tensor));
  return views;
}

std::vector<std::vector<at::Tensor>> on_host(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> views;
  views.reserve(lists.size());
  for (const auto& list : lists) views.push_back(on_host(list));
  return views;
}

}  // namespace

SimProcessGroup::SimProcessGroup(c10::intrusive_ptr<c10d::Backend> host)
    : c10d::Backend(host->getRank(), host->getSize()), host_(std::move(host)) {}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& options) {
  auto views = on_host(tensors);
  return host_->broadcast(views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& options) {
  auto views = on_host(tensors);
  return host_->allreduce(views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& options) {
  auto views = on_host(tensors);
  return host_->allreduce_coalesced(views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& options) {
  auto views = on_host(tensors);
  return host_->reduce(views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& options) {
  auto output_views = on_host(outputs);
  auto input_views = on_host(inputs);
  return host_->allgather(output_views, input_views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& options) {
  at::Tensor output_view = on_host(output);
  at::Tensor input_view = on_host(input);
  return host_->_allgather_base(output_view, input_view, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& options) {
  auto output_views = on_host(outputs);
  auto input_views = on_host(inputs);
  return host_->allgather_into_tensor_coalesced(output_views, input_views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& options) {
  auto output_views = on_host(outputs);
  auto input_views = on_host(inputs);
  return host_->gather(output_views, input_views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& options) {
  auto output_views = on_host(outputs);
  auto input_views = on_host(inputs);
  return host_->scatter(output_views, input_views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& options) {
  auto output_views = on_host(outputs);
  auto input_views = on_host(inputs);
  return host_->reduce_scatter(output_views, input_views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& options) {
  at::Tensor output_view = on_host(output);
  at::Tensor input_view = on_host(input);
  return host_->_reduce_scatter_base(output_view, input_view, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& options) {
  auto output_views = on_host(outputs);
  auto input_views = on_host(inputs);
  return host_->reduce_scatter_tensor_coalesced(output_views, input_views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& options) {
  at::Tensor output_view = on_host(output);
  at::Tensor input_view = on_host(input);
  return host_->alltoall_base(output_view, input_view, output_splits, input_splits, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& options) {
  auto output_views = on_host(outputs);
  auto input_views = on_host(inputs);
  return host_->alltoall(output_views, input_views, options);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::send(std::vector<at::Tensor>& tensors,
                                                     int destination, int tag) {
  auto views = on_host(tensors);
  return host_->send(views, destination, tag);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::recv(std::vector<at::Tensor>& tensors, int source,
                                                     int tag) {
  auto views = on_host(tensors);
  return host_->recv(views, source, tag);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  auto views = on_host(tensors);
  return host_->recvAnysource(views, tag);
}

c10::intrusive_ptr<c10d::Work> SimProcessGroup::barrier(const c10d::BarrierOptions& options) {
  return host_->barrier(options);
}

void SimProcessGroup::monitoredBarrier(const c10d::BarrierOptions& options, bool wait_all_ranks) {
  host_->monitoredBarrier(options, wait_all_ranks);
}

void SimProcessGroup::setSequenceNumberForGroup() { host_->setSequenceNumberForGroup(); }

uint64_t SimProcessGroup::getSequenceNumberForGroup() { return host_->getSequenceNumberForGroup(); }

void SimProcessGroup::setTimeout(std::chrono::milliseconds timeout) { host_->setTimeout(timeout); }

void SimProcessGroup::abort() { host_->abort(); }

void SimProcessGroup::shutdown() { host_->shutdown(); }

}  // namespace sim
