#include "lone_tensor_parallel_rank.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <string>
#include <vector>

#include "trainyard/api/communicator.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/runtime/default_plugins.hpp"

namespace trainyard {

namespace {

class DoneWork final : public c10d::Work {
 public:
  DoneWork() { finish(); }
};

c10::intrusive_ptr<c10d::Work> done() { return c10::make_intrusive<DoneWork>(); }

// Rank 0 of `size` ranks whose peers hold what it holds: a reduction leaves its tensors as they
// are, a gather repeats its input in every rank's place, a scatter keeps rank 0's part. Each
// writes into the caller's buffers only, as a real backend does, so what is allocated is the
// caller's.
class ShapeOnlyBackend final : public c10d::Backend {
 public:
  explicit ShapeOnlyBackend(int size) : c10d::Backend(0, size) {}

  const std::string getBackendName() const override { return "shape_only"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>&,
                                           const c10d::BroadcastOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&,
                                           const c10d::AllreduceOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>&, const c10d::AllreduceCoalescedOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      for (auto& output : outputs.at(i)) output.copy_(inputs[i]);
    }
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    for (auto& part : output.chunk(getSize())) part.copy_(input.view_as(part));
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions&) override {
    output.copy_(input.chunk(getSize()).front().view_as(output));
    return done();
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions&) override {
    for (std::size_t i = 0; i < outputs.size(); ++i) outputs[i].copy_(inputs.at(i).front());
    return done();
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override { return done(); }
};

// The communicator of that one rank: its world is the shape-only group.
class LoneRankCommunicator final : public Communicator {
 public:
  explicit LoneRankCommunicator(int size)
      : world_(c10::make_intrusive<ShapeOnlyBackend>(size)), size_(size) {}

  std::vector<std::string> device_types() const override { return {default_plugins::kDevice}; }
  void connect(const Rendezvous&, const c10::Device&) override {}
  int rank() const override { return 0; }
  int world_size() const override { return size_; }
  c10::intrusive_ptr<c10d::Backend> world() override { return world_; }
  c10::intrusive_ptr<c10d::Backend> new_group(const std::vector<int>&) override {
    throw Error("a lone tensor-parallel rank has no groups but its world");
  }
  void barrier() override {}
  c10::intrusive_ptr<c10d::Store> store() override { return {}; }

 private:
  c10::intrusive_ptr<c10d::Backend> world_;
  int size_;
};

}  // namespace

std::shared_ptr<ProcessMesh> lone_tensor_parallel_rank(int tp) {
  if (tp < 1) throw Error("tp must be at least 1, not " + std::to_string(tp));
  if (tp == 1) return std::make_shared<ProcessMesh>();
  MeshRequest request;
  request.tp = tp;
  request.dp_shard = 1;
  LoneRankCommunicator communicator(tp);
  return std::make_shared<ProcessMesh>(MeshLayout::resolve(request, tp), communicator);
}

}  // namespace trainyard
