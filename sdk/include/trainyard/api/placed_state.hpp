#pragma once
// Tensors saved in pieces. Each piece records where it sits in the whole tensor (the whole
// shape, and the piece's offsets or its range of the flattened elements), as
// torch.distributed.checkpoint's chunk metadata does, so that a checkpoint written under one
// parallel layout (rank count, mesh, strategy) loads into any other by re-slicing.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainyard/api/state.hpp"

namespace trainyard {

struct TensorPlacement {
  std::vector<std::int64_t> global_shape;
  // A box: the piece's offset along each dimension of the whole tensor (its extent is its own
  // shape). Empty for a flat range.
  std::vector<std::int64_t> offsets;
  // A flat range: the piece holds elements [flat_offset, flat_offset + numel) of the whole
  // tensor's row-major order (flattened shards, as fsdp keeps them). -1 for a box.
  std::int64_t flat_offset = -1;
  // The mesh group whose ranks hold identical copies of this piece ("dp", "tp", ... or empty),
  // of which exactly one wrote it: for readers of the checkpoint, not needed to load it.
  std::string replicas;

  static TensorPlacement whole(std::vector<std::int64_t> shape);
  static TensorPlacement box(std::vector<std::int64_t> global_shape,
                             std::vector<std::int64_t> offsets);
  static TensorPlacement flat(std::vector<std::int64_t> global_shape, std::int64_t flat_offset);

  // "global=4,8;box=0,4;replicas=dp" or "global=4,8;flat=16"; decode throws Error on anything
  // else.
  std::string encode() const;
  static TensorPlacement decode(const std::string& text);
};

// Metadata key that holds the placement of entry `name`.
std::string placement_key(const std::string& name);

// Adds `piece` as entry `name` of `out` with its placement. Throws Error when the piece does not
// fit inside the whole tensor the placement describes.
void put_piece(StateDict& out, const std::string& name, const torch::Tensor& piece,
               const TensorPlacement& placement);

// Every piece of every tensor of a loaded checkpoint: its shared entries, this rank's local ones
// and, when the store read every saved rank's files (saved_rank_key), each of those. Entries
// without a placement are whole tensors. Tensors are assembled on demand, one at a time.
class PlacedState {
 public:
  explicit PlacedState(const CheckpointState& state);

  bool contains(const std::string& name) const { return pieces_.count(name) != 0; }
  // Names of the whole tensors starting with `prefix`, in order.
  std::vector<std::string> names(const std::string& prefix = "") const;
  std::vector<std::int64_t> global_shape(const std::string& name) const;
  // The whole tensor, assembled from its pieces (on the CPU). Throws Error naming the tensor when
  // it is unknown, when pieces disagree on its shape or dtype, or leave elements uncovered. The
  // parts below need only their own elements covered (this rank's pieces may be enough).
  torch::Tensor whole(const std::string& name) const;
  // The part of the whole tensor at `offsets` with extent `sizes`.
  torch::Tensor box(const std::string& name, const std::vector<std::int64_t>& offsets,
                    const std::vector<std::int64_t>& sizes) const;
  // Elements [offset, offset + count) of the whole tensor's row-major order; elements past its
  // end (padding of a flat shard) are zeros.
  torch::Tensor flat_range(const std::string& name, std::int64_t offset, std::int64_t count) const;

 private:
  struct Piece {
    torch::Tensor tensor;
    TensorPlacement placement;
  };
  struct Assembled {
    std::vector<std::int64_t> shape;
    torch::Tensor values;   // flat, row-major
    torch::Tensor covered;  // flat, true where a piece stored the element
  };
  Assembled assemble(const std::string& name) const;
  void add(const std::string& name, const torch::Tensor& tensor,
           const std::map<std::string, std::string>& metadata, const std::string& metadata_key);
  std::map<std::string, std::vector<Piece>> pieces_;
};

}  // namespace trainyard
