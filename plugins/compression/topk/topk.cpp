// Top-k sparsification with error feedback (Stich et al., 2018; Lin et al., Deep Gradient
// Compression): each rank sends only the `ratio` largest-magnitude entries of each bucket, as
// (index, value) pairs gathered from every rank, and keeps what it did not send to add to the
// next step's gradients. Every rank sums the gathered pairs in rank order, so all hold the same
// average.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "staged_compressor.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

struct TopkOptions {
  double ratio = 0.01;
  bool error_feedback = true;
  std::int64_t start_step = 0;
};

// One bucket's sparse exchange: indices (int32 where they fit) and values travel as one message
// of bytes, so one all-gather carries both.
class TopkBucket {
 public:
  explicit TopkBucket(std::int64_t numel, double ratio)
      : numel_(numel),
        count_(std::max<std::int64_t>(
            1, static_cast<std::int64_t>(std::ceil(ratio * static_cast<double>(numel))))),
        index_dtype_(numel <= std::numeric_limits<std::int32_t>::max() ? at::kInt : at::kLong) {}

  void begin(GradientBucket& bucket, const c10::intrusive_ptr<c10d::Backend>& group,
             bool error_feedback) {
    at::Tensor& flat = bucket.flat;
    if (error.defined()) error = error.to(flat.device());
    if (error_feedback && error.defined()) flat.add_(error);
    const auto selected = at::topk(flat.abs(), count_, /*dim=*/0, /*largest=*/true,
                                   /*sorted=*/true);
    const at::Tensor& indices = std::get<1>(selected);
    const at::Tensor values = flat.index_select(0, indices);
    if (error_feedback) {
      error = flat.clone();
      error.index_fill_(0, indices, 0);
    }
    message_ = at::cat({indices.to(index_dtype_).view(at::kByte), values.view(at::kByte)});
    gathered_ = at::empty({message_.numel() * group->getSize()}, message_.options());
    work_ = group->_allgather_base(gathered_, message_);
  }

  void end(GradientBucket& bucket, const c10::intrusive_ptr<c10d::Backend>& group) {
    work_->wait();
    at::Tensor& flat = bucket.flat;
    const std::int64_t index_bytes = count_ * static_cast<std::int64_t>(elementSize(index_dtype_));
    const std::int64_t message_bytes = message_.numel();
    flat.zero_();
    for (int rank = 0; rank < group->getSize(); ++rank) {
      const at::Tensor part = gathered_.narrow(0, rank * message_bytes, message_bytes);
      // Copies: a slice of the bytes need not be aligned for the wider dtypes.
      const at::Tensor indices = part.narrow(0, 0, index_bytes).clone().view(index_dtype_);
      const at::Tensor values =
          part.narrow(0, index_bytes, message_bytes - index_bytes).clone().view(flat.scalar_type());
      flat.index_add_(0, indices.to(at::kLong), values);
    }
    flat.div_(group->getSize());
    work_.reset();
    message_ = at::Tensor();
    gathered_ = at::Tensor();
  }

  std::int64_t numel() const { return numel_; }

  at::Tensor error;  // what this rank has not sent yet (undefined before its first step)

 private:
  std::int64_t numel_;
  std::int64_t count_;
  at::ScalarType index_dtype_;
  at::Tensor message_, gathered_;
  c10::intrusive_ptr<c10d::Work> work_;
};

class TopkCompressor final : public StagedCompressor {
 public:
  TopkCompressor(const BucketShapes& shapes, c10::intrusive_ptr<c10d::Backend> group,
                 const TopkOptions& options)
      : StagedCompressor(std::move(group), options.start_step), options_(options) {
    for (std::int64_t numel : bucket_numels(shapes)) buckets_.emplace_back(numel, options.ratio);
  }

  void save_state(StateDict& out, const std::string& prefix) const override {
    save_iteration(out, prefix);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (!buckets_[b].error.defined()) continue;
      out.tensors[prefix + "bucket" + std::to_string(b) + ".error"] = buckets_[b].error.detach();
    }
  }

  void load_state(const StateDict& in, const std::string& prefix) override {
    if (!load_iteration(in, prefix)) return;  // saved without compression: start afresh
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const std::string name = prefix + "bucket" + std::to_string(b) + ".error";
      const auto found = in.tensors.find(name);
      if (found == in.tensors.end()) {
        buckets_[b].error = at::Tensor();
        continue;
      }
      if (found->second.numel() != buckets_[b].numel()) {
        throw Error("topk: the checkpoint's '" + name + "' holds " +
                    std::to_string(found->second.numel()) + " values where this bucket has " +
                    std::to_string(buckets_[b].numel()) +
                    " (saved with other buckets or another model)");
      }
      buckets_[b].error = found->second.clone();
    }
  }

 private:
  void begin_compressed(GradientBucket& bucket) override {
    buckets_.at(bucket.index).begin(bucket, group(), options_.error_feedback);
  }
  void end_compressed(GradientBucket& bucket) override {
    buckets_.at(bucket.index).end(bucket, group());
  }

  TopkOptions options_;
  std::vector<TopkBucket> buckets_;
};

class Topk final : public GradientCompression {
 public:
  explicit Topk(const Config& config) {
    options_.ratio = config.get_float("ratio");
    options_.error_feedback = config.get_bool("error_feedback");
    options_.start_step = config.get_int("start_step");
  }

  std::unique_ptr<BucketCompressor> make_compressor(
      const BucketShapes& shapes, const c10::intrusive_ptr<c10d::Backend>& group) override {
    return std::make_unique<TopkCompressor>(shapes, group, options_);
  }

 private:
  TopkOptions options_;
};

void register_components(Registry& registry) {
  registry.add<GradientCompression>(
      "topk",
      {option("ratio", 0.01, "share of each bucket's entries sent: those of largest magnitude")
           .greater_than(0)
           .at_most(1),
       option("error_feedback", true,
              "add the entries not sent to the next step's gradients (false: drop them)"),
       option("start_step", std::int64_t{0}, "synchronised steps that run plain all-reduces first")
           .at_least(0)},
      "top-k sparsification with error feedback: the largest entries as (index, value) pairs",
      [](const Config& options, const BuildContext&) { return std::make_unique<Topk>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("topk", "1.0.0", trainyard::register_components)
