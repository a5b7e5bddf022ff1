#include "trainyard/parallel/process_mesh.hpp"

#include <map>

#include "trainyard/api/build_context.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {

namespace {

constexpr std::array<MeshGroup, kMeshGroupCount> kGroups = {
    MeshGroup::kPipeline, MeshGroup::kData, MeshGroup::kDataReplicate, MeshGroup::kDataShard,
    MeshGroup::kTensor};

}  // namespace

ProcessMesh::ProcessMesh() = default;

ProcessMesh::ProcessMesh(const MeshLayout& layout, Communicator& communicator)
    : communicator_library_(communicator.library()), layout_(layout), rank_(communicator.rank()) {
  if (layout.world_size() != communicator.world_size()) {
    throw Error("the mesh (" + layout.describe() + ") has " + std::to_string(layout.world_size()) +
                " ranks, the job " + std::to_string(communicator.world_size()));
  }
  // The name this rank's group of each kind counts under: the kinds whose group is the same
  // ranks share one backend, hence one name.
  std::map<std::vector<int>, std::string> names;
  for (MeshGroup kind : kGroups) {
    if (layout.size(kind) == 1) continue;
    std::string& name = names[layout.group_ranks(kind, rank_)];
    if (!name.empty()) name += '/';
    name += mesh_group_name(kind);
  }
  // Every rank creates every group in the same order (creation is collective), members or not.
  std::map<std::vector<int>, c10::intrusive_ptr<c10d::Backend>> made;
  std::map<const c10d::Backend*, c10::intrusive_ptr<c10d::Backend>> counted;
  auto counting = [&](const c10::intrusive_ptr<c10d::Backend>& backend, MeshGroup kind) {
    auto& wrapped = counted[backend.get()];
    if (!wrapped) {
      const std::vector<int> ranks = layout.group_ranks(kind, rank_);
      wrapped = counting_backend(backend, CollectiveGroup{names.at(ranks), ranks}, collectives_);
    }
    return wrapped;
  };
  for (MeshGroup kind : kGroups) {
    const int size = layout.size(kind);
    if (size == 1) continue;
    if (size == layout.world_size()) {
      groups_[static_cast<std::size_t>(kind)] = counting(communicator.world(), kind);
      continue;
    }
    for (const std::vector<int>& ranks : layout.groups(kind)) {
      auto existing = made.find(ranks);
      c10::intrusive_ptr<c10d::Backend> backend =
          existing != made.end() ? existing->second : communicator.new_group(ranks);
      made.emplace(ranks, backend);
      if (backend) groups_[static_cast<std::size_t>(kind)] = counting(backend, kind);
    }
  }
  // A pipeline's gradients travel back on connections of their own (pipeline_return_group).
  if (layout.size(MeshGroup::kPipeline) > 1) {
    if (!communicator.one_backend_per_direction()) {
      pipeline_return_ = groups_[static_cast<std::size_t>(MeshGroup::kPipeline)];
    } else {
      for (const std::vector<int>& ranks : layout.groups(MeshGroup::kPipeline)) {
        c10::intrusive_ptr<c10d::Backend> backend = communicator.new_group(ranks);
        if (backend) pipeline_return_ = counting(backend, MeshGroup::kPipeline);
      }
    }
  }
}

ProcessMesh::ProcessMesh(Communicator& communicator)
    : ProcessMesh(MeshLayout::resolve(MeshRequest{}, communicator.world_size()), communicator) {}

ProcessMesh::ProcessMesh(const MeshLayout& layout, int rank) : layout_(layout), rank_(rank) {
  if (rank < 0 || rank >= layout.world_size()) {
    throw Error("rank " + std::to_string(rank) + " is not in the mesh (" + layout.describe() + ")");
  }
}

std::shared_ptr<ProcessMesh> mesh_of(const BuildContext& build) {
  if (build.mesh) return build.mesh;
  if (build.communicator) return std::make_shared<ProcessMesh>(*build.communicator);
  return std::make_shared<ProcessMesh>();
}

c10::intrusive_ptr<c10d::Backend> ProcessMesh::group(MeshGroup group) const {
  return groups_[static_cast<std::size_t>(group)];
}

}  // namespace trainyard
