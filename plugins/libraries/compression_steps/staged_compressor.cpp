#include "staged_compressor.hpp"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace trainyard {

std::vector<std::int64_t> bucket_numels(const BucketShapes& shapes) {
  std::vector<std::int64_t> numels;
  for (const auto& bucket : shapes.buckets) {
    std::int64_t numel = 0;
    for (const auto& shape : bucket) numel += c10::multiply_integers(shape);
    numels.push_back(numel);
  }
  return numels;
}

StagedCompressor::StagedCompressor(c10::intrusive_ptr<c10d::Backend> group, std::int64_t start_step)
    : group_(std::move(group)), start_step_(start_step) {}

void StagedCompressor::begin(GradientBucket& bucket) {
  if (!plain()) {
    begin_compressed(bucket);
    return;
  }
  // Averaged before the sum, so that the sum stays in range.
  bucket.flat.div_(group_->getSize());
  std::vector<at::Tensor> tensors{bucket.flat};
  pending_[bucket.index] = group_->allreduce(tensors);
}

void StagedCompressor::end(GradientBucket& bucket) {
  if (!plain()) {
    end_compressed(bucket);
    return;
  }
  pending_.at(bucket.index)->wait();
}

void StagedCompressor::end_step() {
  pending_.clear();
  ++iteration_;
}

void StagedCompressor::save_iteration(StateDict& out, const std::string& prefix) const {
  out.tensors[prefix + "iteration"] = at::tensor({iteration_}, at::kLong);
}

bool StagedCompressor::load_iteration(const StateDict& in, const std::string& prefix) {
  const auto found = in.tensors.find(prefix + "iteration");
  if (found == in.tensors.end()) return false;
  iteration_ = found->second.item<std::int64_t>();
  return true;
}

}  // namespace trainyard
