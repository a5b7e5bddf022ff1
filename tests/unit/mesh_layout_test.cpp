// The mesh's rank arithmetic against published layouts, and the layouts it refuses.

#include <gtest/gtest.h>

#include <set>

#include "test_support.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

using Groups = std::vector<std::vector<int>>;

std::string error_of(const MeshRequest& request, int world_size) {
  try {
    MeshLayout::resolve(request, world_size);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// Megatron-LM's example (parallel_state.initialize_model_parallel): 16 ranks, tensor parallel 2,
// pipeline parallel 4, hence data parallel 2.
TEST(DeviceMesh, MegatronsSixteenRankExample) {
  const MeshLayout mesh =
      MeshLayout::resolve({.pp = 4, .dp_replicate = 1, .dp_shard = -1, .tp = 2}, 16);
  EXPECT_EQ(mesh.size(MeshGroup::kData), 2);
  EXPECT_EQ(mesh.groups(MeshGroup::kTensor),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(mesh.groups(MeshGroup::kPipeline),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(mesh.groups(MeshGroup::kData),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
}

TEST(DeviceMesh, CoordinatesPutTensorInnermostAndPipelineOutermost) {
  const MeshLayout mesh =
      MeshLayout::resolve({.pp = 2, .dp_replicate = 2, .dp_shard = 2, .tp = 2}, 16);
  for (int rank = 0; rank < 16; ++rank) {
    const MeshCoordinates place = mesh.coordinates(rank);
    EXPECT_EQ(place[MeshAxis::kTensor], rank % 2);
    EXPECT_EQ(place[MeshAxis::kDataShard], (rank / 2) % 2);
    EXPECT_EQ(place[MeshAxis::kDataReplicate], (rank / 4) % 2);
    EXPECT_EQ(place[MeshAxis::kPipeline], rank / 8);
    EXPECT_EQ(mesh.rank_at(place), rank);
  }
  // dp flattens replicate (outer) and shard (inner): rank 6 is pp 0, replica 1, shard 1, tp 0.
  EXPECT_EQ(mesh.group_ranks(MeshGroup::kData, 6), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(mesh.rank_in(MeshGroup::kData, 6), 3);
  EXPECT_EQ(mesh.group_ranks(MeshGroup::kDataShard, 6), (std::vector<int>{4, 6}));
  EXPECT_EQ(mesh.group_ranks(MeshGroup::kDataReplicate, 6), (std::vector<int>{2, 6}));
  EXPECT_EQ(mesh.group_ranks(MeshGroup::kPipeline, 6), (std::vector<int>{6, 14}));
  EXPECT_EQ(mesh.group_ranks(MeshGroup::kTensor, 6), (std::vector<int>{6, 7}));
  EXPECT_EQ(mesh.describe(), "pp 2 x dp_replicate 2 x dp_shard 2 x tp 2");
}

TEST(DeviceMesh, EveryKindOfGroupCoversTheWorldOnceWithRanksInGroupOrder) {
  const MeshLayout mesh =
      MeshLayout::resolve({.pp = 3, .dp_replicate = 2, .dp_shard = 2, .tp = 2}, 24);
  for (MeshGroup kind : {MeshGroup::kPipeline, MeshGroup::kData, MeshGroup::kDataReplicate,
                         MeshGroup::kDataShard, MeshGroup::kTensor}) {
    std::multiset<int> seen;
    for (const auto& group : mesh.groups(kind)) {
      ASSERT_EQ(static_cast<int>(group.size()), mesh.size(kind)) << mesh_group_name(kind);
      for (std::size_t position = 0; position < group.size(); ++position) {
        seen.insert(group[position]);
        EXPECT_EQ(mesh.rank_in(kind, group[position]), static_cast<int>(position));
        EXPECT_EQ(mesh.group_ranks(kind, group[position]), group);
      }
    }
    EXPECT_EQ(seen.size(), 24u);
    EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), 24u) << mesh_group_name(kind);
  }
}

TEST(DeviceMesh, DefaultRequestIsDataParallelOverTheWorld) {
  const MeshLayout mesh = MeshLayout::resolve(MeshRequest{}, 4);
  EXPECT_EQ(mesh.size(MeshAxis::kDataShard), 4);
  EXPECT_EQ(mesh.size(MeshGroup::kData), 4);
  EXPECT_EQ(mesh.size(MeshGroup::kTensor), 1);
  EXPECT_EQ(mesh.groups(MeshGroup::kTensor), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(MeshLayout().world_size(), 1);
}

TEST(DeviceMesh, MinusOneFillsAnyOneDimension) {
  EXPECT_EQ(MeshLayout::resolve({.pp = -1, .dp_replicate = 1, .dp_shard = 2, .tp = 1}, 8)
                .size(MeshAxis::kPipeline),
            4);
  EXPECT_EQ(MeshLayout::resolve({.pp = 1, .dp_replicate = 1, .dp_shard = 2, .tp = -1}, 8)
                .size(MeshAxis::kTensor),
            4);
}

TEST(DeviceMesh, InvalidLayoutsAreRefusedWithTheReason) {
  EXPECT_HAS(error_of({.pp = 2, .dp_replicate = 1, .dp_shard = 2, .tp = 2}, 4),
             "parallel: pp 2 x dp_replicate 1 x dp_shard 2 x tp 2 makes 8 ranks, but there are 4");
  EXPECT_HAS(error_of({.pp = 3, .dp_replicate = 1, .dp_shard = -1, .tp = 1}, 8),
             "needs a world size divisible by 3, but there are 8 ranks");
  EXPECT_HAS(error_of({.pp = -1, .dp_replicate = 1, .dp_shard = -1, .tp = 1}, 8),
             "only one dimension may be -1, but pp and dp_shard both are");
  EXPECT_HAS(error_of({.pp = 0, .dp_replicate = 1, .dp_shard = -1, .tp = 1}, 8),
             "parallel.pp must be >= 1 (or -1 to fill), got 0");
  EXPECT_HAS(error_of({.pp = 1, .dp_replicate = 1, .dp_shard = 1, .tp = 1}, 0),
             "world size must be >= 1");
  EXPECT_THROW(MeshLayout::resolve(MeshRequest{}, 2).coordinates(2), Error);
}

}  // namespace
}  // namespace trainyard
