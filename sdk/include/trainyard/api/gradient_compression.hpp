#pragma once
// Gradient compression: how a data-parallel strategy's gradient buckets travel between ranks
// when the network, not the device, limits the step. A compression plugin ([compression] in a
// recipe) replaces the plain all-reduce of each bucket, as a PyTorch DDP communication hook
// (register_comm_hook) does: it gets the bucket's flat gradients and the group, and leaves the
// ranks' average (as it approximates it) in the bucket. Its state (error feedback, warm starts,
// random streams) is saved with every checkpoint, so a resumed run continues exactly.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainyard/api/component.hpp"
#include "trainyard/api/state.hpp"

namespace c10d {
class Backend;
}

namespace trainyard {

// One bucket as a compression sees it. `flat` holds the bucket's gradients back to back;
// `gradients` are views into it, one per parameter in the bucket's order (the same on every
// rank). The index is stable for the life of the reducer: state kept per bucket is keyed by it.
struct GradientBucket {
  std::size_t index = 0;
  at::Tensor flat;
  std::vector<at::Tensor> gradients;
};

// The compression of one reducer's buckets over one group: created by the strategy for each set
// of buckets it reduces, it holds that set's state. For every synchronised backward:
//   begin(bucket) for each bucket as its gradients become ready (during backward, possibly on
//       autograd's thread), in bucket order; it may launch collectives and return at once;
//   end(bucket) for each bucket in order after backward: completes what begin started and
//       leaves in bucket.flat the average over the group's ranks, identical on every rank;
//   end_step() once after the last end().
// Every rank of the group calls them in the same order, so the collectives they issue match.
class BucketCompressor {
 public:
  virtual ~BucketCompressor();
  virtual void begin(GradientBucket& bucket) = 0;
  virtual void end(GradientBucket& bucket) = 0;
  virtual void end_step() = 0;
  // This rank's state under `prefix` ("compression."): every rank saves its own (error feedback
  // differs across ranks). load_state() of a state without these entries (a checkpoint written
  // without compression, or by another number of ranks) starts afresh; one whose entries do not
  // fit these buckets throws Error naming the entry.
  virtual void save_state(StateDict& out, const std::string& prefix) const = 0;
  virtual void load_state(const StateDict& in, const std::string& prefix) = 0;
};

// The shape of the buckets a compressor will reduce, known before any backward: the parameters'
// shapes in bucket order, for checks that refuse settings that cannot apply (a PowerSGD rank
// above every matrix's dimensions).
struct BucketShapes {
  std::vector<std::vector<std::vector<std::int64_t>>> buckets;
};

// A compression plugin. Compressions replace all-reduces: strategies that reduce-scatter
// gradients (fsdp) refuse them.
class GradientCompression : public Component {
 public:
  static constexpr const char* kKind = "compression";

  // A compressor for buckets of `shapes` averaged over `group` (never null: a strategy with one
  // data-parallel rank has nothing to compress and asks for none).
  virtual std::unique_ptr<BucketCompressor> make_compressor(
      const BucketShapes& shapes, const c10::intrusive_ptr<c10d::Backend>& group) = 0;
};

}  // namespace trainyard
