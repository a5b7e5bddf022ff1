#pragma once
// The run's device mesh with its communication groups: every plugin's view of where this rank
// sits in the parallel layout (its rank and size in each dimension) and the c10d group of each.

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <array>
#include <memory>
#include <vector>

#include "trainyard/parallel/collective_counter.hpp"
#include "trainyard/parallel/mesh_layout.hpp"

namespace trainyard {

class Communicator;

class ProcessMesh {
 public:
  // The mesh of a single process: every group has one rank and no backend.
  ProcessMesh();
  // Builds, collectively (every rank calls it with the same layout), each group that has more
  // than one rank, once: a group whose ranks are the whole world is the communicator's world
  // group, and groups of different kinds with the same ranks (dp and dp_shard when dp_replicate
  // is 1) share one backend. Groups of one rank cost nothing. Each backend counts its calls in
  // collectives() under its kind's name ("pp", "dp", "dp_replicate", "dp_shard", "tp"); one
  // shared by several kinds under their names joined by '/' in that order ("dp/dp_shard").
  ProcessMesh(const MeshLayout& layout, Communicator& communicator);
  // A data-parallel mesh over the communicator's whole world (dp_shard = world size), for
  // components built outside the engine with a communicator but no mesh.
  explicit ProcessMesh(Communicator& communicator);
  // Rank `rank`'s place in `layout` without any group (every group() is null): for building a
  // model as that rank would, on the meta device, before any process starts (validation).
  ProcessMesh(const MeshLayout& layout, int rank);

  const MeshLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  int world_size() const { return layout_.world_size(); }
  int rank(MeshGroup group) const { return layout_.rank_in(group, rank_); }
  int size(MeshGroup group) const { return layout_.size(group); }
  // The ranks of this rank's group of that kind, in group-rank order.
  std::vector<int> group_ranks(MeshGroup group) const { return layout_.group_ranks(group, rank_); }
  // The group's backend; null when the group has one rank (nothing to communicate).
  c10::intrusive_ptr<c10d::Backend> group(MeshGroup group) const;
  // The backend a pipeline's gradients travel back on, over the ranks of group(kPipeline) and
  // counted under its name: a backend of its own where the communicator asks for one per
  // direction (Communicator::one_backend_per_direction: two ranks sending to each other at once
  // over one connection made one send wait a scheduler tick, 4-5 ms, on a host whose cores the
  // ranks' compute holds); group(kPipeline) itself otherwise. Null when the pipeline has one rank.
  c10::intrusive_ptr<c10d::Backend> pipeline_return_group() const { return pipeline_return_; }
  // What this rank has issued over the mesh's groups (shared by copies of this mesh); a mesh of
  // one rank has no groups, so its counter stays empty.
  CollectiveCounter& collectives() const { return *collectives_; }

 private:
  // The communicator's library, declared first so that it is released after the groups: a
  // communicator plugin's backends may run its code, and the mesh may outlive the communicator.
  std::shared_ptr<void> communicator_library_;
  MeshLayout layout_;
  int rank_ = 0;
  std::array<c10::intrusive_ptr<c10d::Backend>, kMeshGroupCount> groups_;
  c10::intrusive_ptr<c10d::Backend> pipeline_return_;
  std::shared_ptr<CollectiveCounter> collectives_ = std::make_shared<CollectiveCounter>();
};

struct BuildContext;

// The mesh a component should use: `build.mesh` when set, else a data-parallel mesh over
// `build.communicator`'s world (built once per call: keep the result), else a one-rank mesh.
std::shared_ptr<ProcessMesh> mesh_of(const BuildContext& build);

}  // namespace trainyard
