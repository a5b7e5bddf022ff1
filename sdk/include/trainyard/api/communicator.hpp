#pragma once
// Communication backends: process groups over PyTorch's c10d.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "trainyard/api/component.hpp"

namespace trainyard {

// Where and how a rank meets the others (the torchrun variables, or Slurm's).
struct Rendezvous {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// A communicator plugin, named after the collective library it drives. connect() joins the job through a c10d TCPStore; the
// world group and any sub-group are c10d backends, so collectives are PyTorch's own. Creating a
// sub-group is collective: every rank calls new_group with the same ranks in the same order.
// Every collective ends within the rendezvous timeout with an Error when a peer has died. A rank
// that is not in a sub-group gets a null backend from new_group.
class Communicator : public Component {
 public:
  static constexpr const char* kKind = "comm";
  // The device types (device plugin names, as torch::Device spells the type) whose tensors its
  // collectives take; connect() refuses a device of another type.
  virtual std::vector<std::string> device_types() const = 0;
  // What `trainyard doctor` reports of the collective library (built in, version), one line each.
  virtual std::vector<std::string> doctor_report() const { return {}; }
  virtual void connect(const Rendezvous& rendezvous, const c10::Device& device) = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual c10::intrusive_ptr<c10d::Backend> world() = 0;
  virtual c10::intrusive_ptr<c10d::Backend> new_group(const std::vector<int>& ranks) = 0;
  virtual void barrier() = 0;
  // The rendezvous store (the runtime keeps its failure records and heartbeats there).
  virtual c10::intrusive_ptr<c10d::Store> store() = 0;
  // Whether messages between two ranks in opposite directions at once should travel on separate
  // backends (a pipeline's activations forward, its gradients back): true where a backend's
  // connection between two ranks serializes its sends and receives under one lock, so that one of
  // two simultaneous sends waits for the other's (ProcessMesh::pipeline_return_group).
  virtual bool one_backend_per_direction() const { return false; }
};

}  // namespace trainyard
