#pragma once
// Averages the gradients of replicated parameters across the ranks of one c10d group, as
// PyTorch's DDP Reducer does: gradients are laid out in buckets, and a hook on each parameter's
// gradient accumulator launches a bucket's all-reduce as soon as its last gradient is ready, so
// communication overlaps the rest of backward. Any strategy can run it over any group (ddp over
// the mesh's data-parallel group; a pipeline stage over its own dp group).

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/api/error.hpp"

namespace c10d {
class Backend;
}

namespace trainyard {

class BucketCompressor;
class GradientCompression;

struct GradientReducerOptions {
  // Bucket size in MiB (one all-reduce per bucket).
  double bucket_cap_mb = 25;
  // Size of the first bucket (the last layers), small so that its all-reduce starts early.
  double first_bucket_mb = 1;
  // Parameters without a gradient in a backward count as ready (zero) instead of an error; one
  // that no rank used keeps no gradient (one more small all-reduce per synchronised backward).
  bool find_unused_parameters = false;
  // Gradients are views into the buckets (no copies, no second gradient buffer); false:
  // separate gradients copied into the buckets and the averages copied back.
  bool gradient_as_bucket_view = true;
  // Launch all-reduces from the gradient hooks during backward; false: all after backward.
  bool overlap = true;
  // The dtype gradients travel in (fp16 or bf16 halve the bytes; unset: their own dtype).
  std::optional<c10::ScalarType> wire_dtype;
  // Replaces each bucket's all-reduce (gradient_compression.hpp); null: plain all-reduces. Not
  // with wire_dtype.
  std::shared_ptr<GradientCompression> compression;
};

// Thrown by GradientReducer::finish when parameters got no gradient in a synchronised backward
// and find_unused_parameters is off; names() lists them.
class UnusedParametersError : public Error {
 public:
  explicit UnusedParametersError(std::vector<std::string> names);
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
};

// One instance per set of parameters: zero_gradients() at the start of a step, prepare() before
// each backward, finish() after it. A null group is a group of one rank: the reducer then only
// keeps the gradients in its buckets. Every rank of the group must hold the same parameters in
// the same order.
class GradientReducer {
 public:
  GradientReducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                  const c10::intrusive_ptr<c10d::Backend>& group,
                  const GradientReducerOptions& options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  std::size_t bucket_count() const;
  // Each bucket's parameters (indices into the constructor's list), in the order the bucket lays
  // out their gradients.
  std::vector<std::vector<std::size_t>> bucket_parameters() const;
  // The bytes one synchronised backward's buckets hold: what plain all-reduces would carry.
  std::int64_t bucket_bytes() const;
  // The compressor of these buckets (null without compression or without a group), whose state
  // the strategy checkpoints.
  BucketCompressor* compressor() const;
  // All-reduces launched since the last call (one per bucket per synchronised backward).
  std::int64_t take_launch_count();

  // Clears gradients before a step: as views into the zeroed buckets, or unset.
  void zero_gradients();
  // The next backward synchronises (the last micro-batch) or only accumulates (no_sync).
  void prepare(bool synchronise);
  // After the synchronising backward: completes buckets of parameters that got no gradient,
  // launches what is left, waits for every all-reduce (inside a CollectiveWait) and leaves the
  // averaged gradients in .grad. Throws UnusedParametersError for parameters without a gradient
  // unless find_unused_parameters is set. Nothing after a backward that did not synchronise.
  void finish();

  // The flat buffers the buckets all-reduce (gradient memory beyond .grad unless the gradients
  // are views into them).
  std::vector<at::Tensor> bucket_buffers() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainyard
