#include "trainyard/parallel/gradient_reducer.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <map>
#include <utility>

#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/parallel/gradients.hpp"

namespace trainyard {

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string list;
  for (const auto& name : names) list += (list.empty() ? "" : ", ") + name;
  return list;
}

// Gradients of several parameters laid out in one flat tensor, all-reduced as one.
struct Bucket {
  std::vector<std::size_t> parameters;  // indices into the reducer's parameter list
  std::vector<std::int64_t> offsets;
  at::Tensor flat;
  at::Tensor wire;          // `flat` in the compression dtype while it travels (undefined without)
  std::size_t pending = 0;  // parameters not yet ready in this backward
  c10::intrusive_ptr<c10d::Work> work;  // the in-flight all-reduce
};

}  // namespace

UnusedParametersError::UnusedParametersError(std::vector<std::string> names)
    : Error("parameters got no gradient in this step (" + joined(names) +
            "); count them as ready with find_unused_parameters"),
      names_(std::move(names)) {}

struct GradientReducer::State {
  State(std::vector<at::Tensor> parameters_in, std::vector<std::string> names_in,
        c10::intrusive_ptr<c10d::Backend> group_in, const GradientReducerOptions& options_in)
      : parameters(std::move(parameters_in)),
        names(std::move(names_in)),
        group(std::move(group_in)),
        options(options_in) {
    if (options.compression && options.wire_dtype) {
      throw Error("gradient compression replaces the all-reduce that a wire dtype narrows: use "
                  "one or the other");
    }
    assign_buckets();
    bucket_of.assign(parameters.size(), {0, 0});
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      for (std::size_t i = 0; i < buckets[b].parameters.size(); ++i) {
        bucket_of[buckets[b].parameters[i]] = {b, i};
      }
    }
    ready.assign(parameters.size(), false);
    if (options.compression && group) start_compression();
    accumulators = trainyard::on_gradient_ready(
        parameters, [this](std::size_t index) { on_gradient_ready(index); });
  }

  void assign_buckets() {
    // Reverse registration order approximates the order backward produces gradients. The first
    // bucket is small so that its all-reduce starts early in backward (as PyTorch's DDP does).
    const auto cap = static_cast<std::int64_t>(options.bucket_cap_mb * 1024 * 1024);
    const auto first_cap = static_cast<std::int64_t>(
        std::min(options.first_bucket_mb, options.bucket_cap_mb) * 1024 * 1024);
    // Open buckets by dtype and device: their index and the elements they hold so far.
    std::map<std::pair<at::ScalarType, std::string>, std::pair<std::size_t, std::int64_t>> open;
    for (std::size_t k = parameters.size(); k-- > 0;) {
      const at::Tensor& parameter = parameters[k];
      auto key = std::make_pair(parameter.scalar_type(), parameter.device().str());
      auto it = open.find(key);
      if (it == open.end()) {
        buckets.emplace_back();
        it = open.emplace(key, std::make_pair(buckets.size() - 1, std::int64_t{0})).first;
      }
      auto& [index, used] = it->second;
      buckets[index].parameters.push_back(k);
      used += parameter.numel();
      const std::int64_t limit = index == 0 ? first_cap : cap;
      if (used * parameter.element_size() >= limit) open.erase(it);
    }
    for (auto& bucket : buckets) {
      // Inside a bucket, parameters keep registration order, as in PyTorch's buckets (what a
      // compression hook sees as the bucket's gradients).
      std::reverse(bucket.parameters.begin(), bucket.parameters.end());
      std::int64_t offset = 0;
      for (std::size_t k : bucket.parameters) {
        bucket.offsets.push_back(offset);
        offset += parameters[k].numel();
      }
      bucket.flat = at::zeros({offset}, parameters[bucket.parameters.back()].options());
      // Only floating-point gradients wider than the wire dtype are compressed.
      if (options.wire_dtype && bucket.flat.is_floating_point() &&
          bucket.flat.element_size() >
              static_cast<std::int64_t>(at::elementSize(*options.wire_dtype))) {
        bucket.wire = at::empty_like(bucket.flat, bucket.flat.options().dtype(*options.wire_dtype));
      }
    }
  }

  // The compressor sees each bucket's flat gradients and their views, made once: the flat
  // buffers live as long as the reducer.
  void start_compression() {
    BucketShapes shapes;
    for (auto& bucket : buckets) {
      GradientBucket view{views.size(), bucket.flat, {}};
      std::vector<std::vector<std::int64_t>> sizes;
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
        view.gradients.push_back(view_of(bucket, i));
        sizes.push_back(parameters[bucket.parameters[i]].sizes().vec());
      }
      views.push_back(std::move(view));
      shapes.buckets.push_back(std::move(sizes));
    }
    compressor = options.compression->make_compressor(shapes, group);
  }

  at::Tensor view_of(Bucket& bucket, std::size_t i) {
    const at::Tensor& parameter = parameters[bucket.parameters[i]];
    return bucket.flat.narrow(0, bucket.offsets[i], parameter.numel()).view(parameter.sizes());
  }

  void on_gradient_ready(std::size_t index) {
    if (!synchronise || ready[index]) return;
    ready[index] = true;
    auto [b, i] = bucket_of[index];
    Bucket& bucket = buckets[b];
    if (!options.gradient_as_bucket_view) {
      at::NoGradGuard no_grad;
      at::Tensor slot = view_of(bucket, i);
      const at::Tensor& gradient = parameters[index].grad();
      if (gradient.defined()) {
        slot.copy_(gradient);
      } else {
        slot.zero_();
      }
    }
    if (--bucket.pending == 0 && options.overlap) {
      // Every rank launches buckets in the same order, whatever order they complete in.
      while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
        launch(next_launch++);
      }
    }
  }

  void launch(std::size_t b) {
    ++launches;
    if (!group) return;  // one rank: its gradients are the average
    Bucket& bucket = buckets[b];
    at::NoGradGuard no_grad;
    if (compressor) {
      compressor->begin(views[b]);
      return;
    }
    // Averaged before any compression, so the sum cannot leave the narrower dtype's range
    // where each rank's share is inside it.
    bucket.flat.div_(group->getSize());
    if (bucket.wire.defined()) bucket.wire.copy_(bucket.flat);
    std::vector<at::Tensor> tensors{bucket.wire.defined() ? bucket.wire : bucket.flat};
    bucket.work = group->allreduce(tensors);
  }

  void finish() {
    if (!synchronise) return;
    std::vector<std::string> missing;
    // Which parameters this rank's backward used, before the loop below marks the rest ready.
    std::vector<float> used_here;
    if (options.find_unused_parameters) used_here.assign(ready.begin(), ready.end());
    for (std::size_t index = 0; index < parameters.size(); ++index) {
      if (ready[index]) continue;
      if (!options.find_unused_parameters) {
        missing.push_back(names[index]);
        continue;
      }
      on_gradient_ready(index);
    }
    if (!missing.empty()) throw UnusedParametersError(std::move(missing));
    if (!options.overlap) {
      for (std::size_t b = 0; b < buckets.size(); ++b) launch(b);
    }
    c10::intrusive_ptr<c10d::Work> usage;
    at::Tensor used;
    if (options.find_unused_parameters) {
      used = at::tensor(used_here, at::kFloat).to(parameters.front().device());
      std::vector<at::Tensor> tensors{used};
      // After every bucket, in the same order on all ranks.
      if (group) usage = group->allreduce(tensors);
    }
    {
      CollectiveWait wait;
      for (auto& bucket : buckets) {
        if (bucket.work) bucket.work->wait();
      }
      if (compressor) {
        at::NoGradGuard no_grad;
        for (auto& view : views) compressor->end(view);
        compressor->end_step();
      }
      if (usage) usage->wait();
    }
    for (auto& bucket : buckets) {
      bucket.work.reset();
      if (bucket.wire.defined() && group) {
        at::NoGradGuard no_grad;
        bucket.flat.copy_(bucket.wire);
      }
      if (options.gradient_as_bucket_view) continue;
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
        at::Tensor& parameter = parameters[bucket.parameters[i]];
        at::Tensor averaged = view_of(bucket, i);
        if (parameter.grad().defined()) {
          parameter.mutable_grad().copy_(averaged);
        } else {
          parameter.mutable_grad() = averaged.clone();
        }
      }
    }
    if (used.defined()) {
      const at::Tensor counts = used.cpu();
      const float* count = counts.data_ptr<float>();
      for (std::size_t index = 0; index < parameters.size(); ++index) {
        if (count[index] == 0) parameters[index].mutable_grad() = at::Tensor();
      }
    }
  }

  std::vector<at::Tensor> parameters;
  std::vector<std::string> names;
  c10::intrusive_ptr<c10d::Backend> group;
  GradientReducerOptions options;
  std::vector<Bucket> buckets;
  std::vector<std::pair<std::size_t, std::size_t>> bucket_of;
  std::vector<bool> ready;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<GradientBucket> views;  // what the compressor sees of each bucket
  std::unique_ptr<BucketCompressor> compressor;
  std::size_t next_launch = 0;
  std::int64_t launches = 0;
  bool synchronise = false;
};

GradientReducer::GradientReducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                                 const c10::intrusive_ptr<c10d::Backend>& group,
                                 const GradientReducerOptions& options)
    : state_(std::make_unique<State>(std::move(parameters), std::move(names), group, options)) {}

GradientReducer::~GradientReducer() = default;

std::size_t GradientReducer::bucket_count() const { return state_->buckets.size(); }

std::vector<std::vector<std::size_t>> GradientReducer::bucket_parameters() const {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& bucket : state_->buckets) out.push_back(bucket.parameters);
  return out;
}

std::int64_t GradientReducer::bucket_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& bucket : state_->buckets) {
    bytes += bucket.flat.numel() * static_cast<std::int64_t>(bucket.flat.element_size());
  }
  return bytes;
}

BucketCompressor* GradientReducer::compressor() const { return state_->compressor.get(); }

std::int64_t GradientReducer::take_launch_count() { return std::exchange(state_->launches, 0); }

void GradientReducer::zero_gradients() {
  if (!state_->options.gradient_as_bucket_view) {
    for (auto& parameter : state_->parameters) parameter.mutable_grad() = at::Tensor();
    return;
  }
  for (auto& bucket : state_->buckets) {
    bucket.flat.zero_();
    for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
      at::Tensor& parameter = state_->parameters[bucket.parameters[i]];
      parameter.mutable_grad() = state_->view_of(bucket, i);
    }
  }
}

void GradientReducer::prepare(bool synchronise) {
  state_->synchronise = synchronise;
  if (!synchronise) return;
  for (auto& bucket : state_->buckets) {
    bucket.pending = bucket.parameters.size();
    bucket.work.reset();
  }
  std::fill(state_->ready.begin(), state_->ready.end(), false);
  state_->next_launch = 0;
}

void GradientReducer::finish() { state_->finish(); }

std::vector<at::Tensor> GradientReducer::bucket_buffers() const {
  std::vector<at::Tensor> flats;
  for (const auto& bucket : state_->buckets) {
    flats.push_back(bucket.flat);
    if (bucket.wire.defined()) flats.push_back(bucket.wire);
  }
  return flats;
}

}  // namespace trainyard
