#pragma once
// A compressor that runs plain averaged all-reduces for its first `start_step` synchronised
// steps (as PyTorch's default hook: each bucket divided by the rank count, then summed), and its
// own compression after, counting the steps and checkpointing the count.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainyard/api/gradient_compression.hpp"

namespace c10d {
class Backend;
class Work;
}  // namespace c10d

namespace trainyard {

// The number of values each bucket of `shapes` holds.
std::vector<std::int64_t> bucket_numels(const BucketShapes& shapes);

class StagedCompressor : public BucketCompressor {
 public:
  StagedCompressor(c10::intrusive_ptr<c10d::Backend> group, std::int64_t start_step);

  void begin(GradientBucket& bucket) final;
  void end(GradientBucket& bucket) final;
  void end_step() final;

 protected:
  virtual void begin_compressed(GradientBucket& bucket) = 0;
  virtual void end_compressed(GradientBucket& bucket) = 0;

  // The step count under `prefix` + "iteration"; load_iteration() returns false (and leaves the
  // count) when the state has none: a checkpoint written without compression.
  void save_iteration(StateDict& out, const std::string& prefix) const;
  bool load_iteration(const StateDict& in, const std::string& prefix);

  const c10::intrusive_ptr<c10d::Backend>& group() const { return group_; }

 private:
  bool plain() const { return iteration_ < start_step_; }

  c10::intrusive_ptr<c10d::Backend> group_;
  std::int64_t start_step_;
  std::int64_t iteration_ = 0;                                     // synchronised steps so far
  std::map<std::size_t, c10::intrusive_ptr<c10d::Work>> pending_;  // plain all-reduces in flight
};

}  // namespace trainyard
