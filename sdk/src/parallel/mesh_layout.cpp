#include "trainyard/parallel/mesh_layout.hpp"

#include <algorithm>

#include "trainyard/api/error.hpp"

namespace trainyard {

namespace {

constexpr std::array<MeshAxis, kMeshAxisCount> kAxes = {
    MeshAxis::kPipeline, MeshAxis::kDataReplicate, MeshAxis::kDataShard, MeshAxis::kTensor};

}  // namespace

const char* mesh_axis_name(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kPipeline:
      return "pp";
    case MeshAxis::kDataReplicate:
      return "dp_replicate";
    case MeshAxis::kDataShard:
      return "dp_shard";
    case MeshAxis::kTensor:
      return "tp";
  }
  return "?";
}

const char* mesh_group_name(MeshGroup group) {
  switch (group) {
    case MeshGroup::kPipeline:
      return "pp";
    case MeshGroup::kData:
      return "dp";
    case MeshGroup::kDataReplicate:
      return "dp_replicate";
    case MeshGroup::kDataShard:
      return "dp_shard";
    case MeshGroup::kTensor:
      return "tp";
  }
  return "?";
}

std::vector<MeshAxis> mesh_group_axes(MeshGroup group) {
  switch (group) {
    case MeshGroup::kPipeline:
      return {MeshAxis::kPipeline};
    case MeshGroup::kData:
      return {MeshAxis::kDataReplicate, MeshAxis::kDataShard};
    case MeshGroup::kDataReplicate:
      return {MeshAxis::kDataReplicate};
    case MeshGroup::kDataShard:
      return {MeshAxis::kDataShard};
    case MeshGroup::kTensor:
      return {MeshAxis::kTensor};
  }
  return {};
}

MeshLayout::MeshLayout() = default;

MeshLayout MeshLayout::resolve(const MeshRequest& request, int world_size) {
  if (world_size < 1) throw Error("the world size must be >= 1, got " + std::to_string(world_size));
  const std::array<int, kMeshAxisCount> asked = {request.pp, request.dp_replicate, request.dp_shard,
                                                 request.tp};
  int fill = -1;
  long long product = 1;
  for (int axis = 0; axis < kMeshAxisCount; ++axis) {
    const char* name = mesh_axis_name(kAxes[static_cast<std::size_t>(axis)]);
    const int size = asked[static_cast<std::size_t>(axis)];
    if (size == -1) {
      if (fill >= 0) {
        throw Error(std::string("parallel: only one dimension may be -1, but ") +
                    mesh_axis_name(kAxes[static_cast<std::size_t>(fill)]) + " and " + name +
                    " both are");
      }
      fill = axis;
    } else if (size < 1) {
      throw Error(std::string("parallel.") + name + " must be >= 1 (or -1 to fill), got " +
                  std::to_string(size));
    } else {
      product *= size;
    }
  }
  auto describe_asked = [&] {
    std::string text;
    for (int axis = 0; axis < kMeshAxisCount; ++axis) {
      text += (axis ? " x " : "") +
              std::string(mesh_axis_name(kAxes[static_cast<std::size_t>(axis)])) + " " +
              std::to_string(asked[static_cast<std::size_t>(axis)]);
    }
    return text;
  };
  MeshLayout layout;
  layout.world_size_ = world_size;
  layout.sizes_ = asked;
  if (fill >= 0) {
    if (world_size % product != 0) {
      throw Error("parallel: " + describe_asked() + " needs a world size divisible by " +
                  std::to_string(product) + ", but there are " + std::to_string(world_size) +
                  " ranks");
    }
    layout.sizes_[static_cast<std::size_t>(fill)] = static_cast<int>(world_size / product);
  } else if (product != world_size) {
    throw Error("parallel: " + describe_asked() + " makes " + std::to_string(product) +
                " ranks, but there are " + std::to_string(world_size));
  }
  return layout;
}

int MeshLayout::size(MeshGroup group) const {
  int product = 1;
  for (MeshAxis axis : mesh_group_axes(group)) product *= size(axis);
  return product;
}

MeshCoordinates MeshLayout::coordinates(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    throw Error("rank " + std::to_string(rank) + " is outside a mesh of " +
                std::to_string(world_size_));
  }
  MeshCoordinates coordinates;
  // Row-major, the last axis (tp) fastest.
  for (int axis = kMeshAxisCount - 1; axis >= 0; --axis) {
    const int size = sizes_[static_cast<std::size_t>(axis)];
    coordinates.index[static_cast<std::size_t>(axis)] = rank % size;
    rank /= size;
  }
  return coordinates;
}

int MeshLayout::rank_at(const MeshCoordinates& coordinates) const {
  int rank = 0;
  for (int axis = 0; axis < kMeshAxisCount; ++axis) {
    rank = rank * sizes_[static_cast<std::size_t>(axis)] +
           coordinates.index[static_cast<std::size_t>(axis)];
  }
  return rank;
}

int MeshLayout::rank_in(MeshGroup group, int rank) const {
  const MeshCoordinates place = coordinates(rank);
  int position = 0;
  for (MeshAxis axis : mesh_group_axes(group)) position = position * size(axis) + place[axis];
  return position;
}

std::vector<int> MeshLayout::group_ranks(MeshGroup group, int rank) const {
  const std::vector<MeshAxis> axes = mesh_group_axes(group);
  const MeshCoordinates origin = coordinates(rank);
  std::vector<int> ranks;
  ranks.reserve(static_cast<std::size_t>(size(group)));
  for (int position = 0; position < size(group); ++position) {
    MeshCoordinates member = origin;
    int rest = position;
    for (auto axis = axes.rbegin(); axis != axes.rend(); ++axis) {
      member.index[static_cast<std::size_t>(*axis)] = rest % size(*axis);
      rest /= size(*axis);
    }
    ranks.push_back(rank_at(member));
  }
  return ranks;
}

std::vector<std::vector<int>> MeshLayout::groups(MeshGroup group) const {
  std::vector<std::vector<int>> all;
  std::vector<bool> covered(static_cast<std::size_t>(world_size_), false);
  for (int rank = 0; rank < world_size_; ++rank) {
    if (covered[static_cast<std::size_t>(rank)]) continue;
    all.push_back(group_ranks(group, rank));
    for (int member : all.back()) covered[static_cast<std::size_t>(member)] = true;
  }
  return all;
}

std::string MeshLayout::describe() const {
  std::string text;
  for (MeshAxis axis : kAxes) {
    text += (text.empty() ? "" : " x ") + std::string(mesh_axis_name(axis)) + " " +
            std::to_string(size(axis));
  }
  return text;
}

}  // namespace trainyard
