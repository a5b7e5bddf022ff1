#pragma once
// The parallel layout of a run: how its ranks form a mesh of pipeline, data-parallel (replicate
// and shard) and tensor-parallel dimensions, and which ranks make up each group. Pure rank
// arithmetic, the same on every rank; ProcessMesh (process_mesh.hpp) builds the groups.

#include <array>
#include <string>
#include <vector>

namespace trainyard {

// The mesh's axes, outermost first. A rank's number is its coordinates read in this order, so
// tensor-parallel peers are neighbours (one node) and pipeline stages are farthest apart, as in
// Megatron-LM ("tp-cp-ep-dp-pp", innermost first) and torchtitan (["pp", "dp_replicate",
// "dp_shard", "cp", "tp"]).
enum class MeshAxis { kPipeline = 0, kDataReplicate = 1, kDataShard = 2, kTensor = 3 };
inline constexpr int kMeshAxisCount = 4;
const char* mesh_axis_name(MeshAxis axis);  // "pp", "dp_replicate", "dp_shard", "tp"

// The groups a plugin communicates over: one axis each, or `kData`, the data-parallel ranks
// (dp_replicate x dp_shard flattened), over which gradients are averaged and batches split.
enum class MeshGroup { kPipeline, kData, kDataReplicate, kDataShard, kTensor };
inline constexpr int kMeshGroupCount = 5;
const char* mesh_group_name(MeshGroup group);  // "pp", "dp", "dp_replicate", "dp_shard", "tp"

// The sizes a recipe asks for ([parallel]); -1 on at most one axis fills it so that the
// product equals the world size.
struct MeshRequest {
  int pp = 1;
  int dp_replicate = 1;
  int dp_shard = -1;
  int tp = 1;
};

// A rank's place on each axis.
struct MeshCoordinates {
  std::array<int, kMeshAxisCount> index{};
  int operator[](MeshAxis axis) const { return index[static_cast<int>(axis)]; }
};

class MeshLayout {
 public:
  // A mesh of one rank.
  MeshLayout();
  // Resolves `request` on `world_size` ranks. Throws Error with the reason (sizes < 1 other
  // than one -1, two -1s, a product that does not divide or does not equal the world size).
  static MeshLayout resolve(const MeshRequest& request, int world_size);

  int world_size() const { return world_size_; }
  int size(MeshAxis axis) const { return sizes_[static_cast<std::size_t>(axis)]; }
  // The product of the axes' sizes a group spans.
  int size(MeshGroup group) const;

  MeshCoordinates coordinates(int rank) const;
  int rank_at(const MeshCoordinates& coordinates) const;
  // Position of `rank` within its group of kind `group` (its rank in that group).
  int rank_in(MeshGroup group, int rank) const;

  // The ranks of `rank`'s group of kind `group`, in group-rank order: the ranks that share
  // every other coordinate with it.
  std::vector<int> group_ranks(MeshGroup group, int rank) const;
  // Every group of kind `group`, ordered by their smallest rank; together they cover the world
  // once.
  std::vector<std::vector<int>> groups(MeshGroup group) const;

  // "pp 2 x dp_replicate 1 x dp_shard 2 x tp 2".
  std::string describe() const;

 private:
  int world_size_ = 1;
  std::array<int, kMeshAxisCount> sizes_{1, 1, 1, 1};
};

// The axes a group spans, outermost first.
std::vector<MeshAxis> mesh_group_axes(MeshGroup group);

}  // namespace trainyard
