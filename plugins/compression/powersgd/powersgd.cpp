// PowerSGD gradient compression (Vogels, Karimireddy and Jaggi, 2019) for data-parallel
// strategies, equal to PyTorch's powerSGD_hook with the same PowerSGDState settings: plain
// averaged all-reduces before start_step, then each bucket's matrices sent as rank-r factors
// with error feedback and warm-started Q. Its state (iteration, the seed stream, each bucket's
// error and Q) is saved with every checkpoint, so a resumed run continues exactly.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "legacy_random_state.hpp"
#include "powersgd_bucket.hpp"
#include "staged_compressor.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

struct PowerSgdOptions {
  PowerSgdSettings settings;
  std::int64_t start_step = 1000;
  std::int64_t seed = 0;
};

// Refuses a rank that no gradient matrix can take: PyTorch's hook would clamp it to every
// matrix's smaller dimension and then compress nothing, silently.
void check_rank(const BucketShapes& shapes, const PowerSgdOptions& options) {
  std::int64_t largest_rows = 0;
  std::int64_t largest_columns = 0;
  for (const auto& bucket : shapes.buckets) {
    for (const auto& shape : bucket) {
      if (shape.size() < 2) continue;
      const auto [rows, columns] = matrix_shape(shape);
      if (options.settings.rank <= std::min(rows, columns)) return;
      if (rows * columns > largest_rows * largest_columns) {
        largest_rows = rows;
        largest_columns = columns;
      }
    }
  }
  throw Error("powersgd: rank " + std::to_string(options.settings.rank) +
              " is above the smaller dimension of every gradient matrix (the largest is " +
              std::to_string(largest_rows) + " x " + std::to_string(largest_columns) +
              "), so nothing would be compressed: set compression.rank to at most " +
              std::to_string(std::min(largest_rows, largest_columns)));
}

class PowerSgdCompressor final : public StagedCompressor {
 public:
  PowerSgdCompressor(const BucketShapes& shapes, c10::intrusive_ptr<c10d::Backend> group,
                     const PowerSgdOptions& options)
      : StagedCompressor(std::move(group), options.start_step),
        random_(static_cast<std::uint32_t>(options.seed)) {
    check_rank(shapes, options);
    const std::vector<std::int64_t> numels = bucket_numels(shapes);
    for (std::size_t b = 0; b < shapes.buckets.size(); ++b) {
      buckets_.emplace_back(shapes.buckets[b], numels[b], options.settings);
    }
  }

  void save_state(StateDict& out, const std::string& prefix) const override {
    save_iteration(out, prefix);
    at::Tensor words = at::empty({LegacyRandomState::kWords + 1}, at::kLong);
    auto* word = words.data_ptr<std::int64_t>();
    for (int i = 0; i < LegacyRandomState::kWords; ++i) {
      word[i] = random_.words()[static_cast<std::size_t>(i)];
    }
    word[LegacyRandomState::kWords] = random_.position();
    out.tensors[prefix + "random_state"] = words;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const std::string name = prefix + "bucket" + std::to_string(b) + ".";
      if (buckets_[b].error.defined()) out.tensors[name + "error"] = buckets_[b].error.detach();
      if (buckets_[b].q_memory.defined()) out.tensors[name + "q"] = buckets_[b].q_memory.detach();
    }
  }

  void load_state(const StateDict& in, const std::string& prefix) override {
    if (!load_iteration(in, prefix)) return;  // saved without compression: start afresh
    const at::Tensor words = require(in, prefix + "random_state", LegacyRandomState::kWords + 1)
                                 .to(at::kLong)
                                 .contiguous();
    std::array<std::uint32_t, LegacyRandomState::kWords> state{};
    const auto* word = words.data_ptr<std::int64_t>();
    for (int i = 0; i < LegacyRandomState::kWords; ++i) {
      state[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(word[i]);
    }
    random_.restore(state, static_cast<int>(word[LegacyRandomState::kWords]));
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const std::string name = prefix + "bucket" + std::to_string(b) + ".";
      PowerSgdBucket& bucket = buckets_[b];
      bucket.error = optional(in, name + "error", bucket.flat_numel());
      bucket.q_memory = optional(in, name + "q", bucket.q_numel());
    }
  }

 private:
  void begin_compressed(GradientBucket& bucket) override {
    buckets_.at(bucket.index).begin(bucket, group(), random_);
  }
  void end_compressed(GradientBucket& bucket) override {
    buckets_.at(bucket.index).end(bucket, group());
  }

  // A copy of the entry, which must hold `numel` values; the next begin() moves it to the
  // gradients' device.
  static at::Tensor require(const StateDict& in, const std::string& name, std::int64_t numel) {
    const auto found = in.tensors.find(name);
    if (found == in.tensors.end()) {
      throw Error("powersgd: the checkpoint's compression state lacks '" + name + "'");
    }
    if (found->second.numel() != numel) {
      throw Error("powersgd: the checkpoint's '" + name + "' holds " +
                  std::to_string(found->second.numel()) + " values where these buckets need " +
                  std::to_string(numel) + " (saved with other buckets or another model)");
    }
    return found->second.clone();
  }

  static at::Tensor optional(const StateDict& in, const std::string& name, std::int64_t numel) {
    if (!in.tensors.count(name)) return {};
    return require(in, name, numel);
  }

  LegacyRandomState random_;
  std::vector<PowerSgdBucket> buckets_;
};

class PowerSgd final : public GradientCompression {
 public:
  explicit PowerSgd(const Config& config) {
    options_.settings.rank = config.get_int("rank");
    options_.settings.min_compression_rate = config.get_float("min_compression_rate");
    options_.settings.error_feedback = config.get_bool("error_feedback");
    options_.settings.warm_start = config.get_bool("warm_start");
    options_.settings.orthogonalization_epsilon = config.get_float("orthogonalization_epsilon");
    options_.start_step = config.get_int("start_step");
    options_.seed = config.get_int("seed");
    if ((options_.settings.error_feedback || options_.settings.warm_start) &&
        options_.start_step <= 1) {
      config.fail("start_step",
                  "must be above 1 with error_feedback or warm_start: the first steps run plain "
                  "all-reduces while their state builds up (as PyTorch's start_powerSGD_iter)");
    }
  }

  std::unique_ptr<BucketCompressor> make_compressor(
      const BucketShapes& shapes, const c10::intrusive_ptr<c10d::Backend>& group) override {
    return std::make_unique<PowerSgdCompressor>(shapes, group, options_);
  }

 private:
  PowerSgdOptions options_;
};

void register_components(Registry& registry) {
  registry.add<GradientCompression>(
      "powersgd",
      {option("rank", std::int64_t{1},
              "rank r of each matrix's approximation P Q^T (PyTorch's matrix_approximation_rank)")
           .at_least(1),
       option("start_step", std::int64_t{1000},
              "synchronised steps that run plain all-reduces first (start_powerSGD_iter)")
           .at_least(0),
       option("min_compression_rate", 2.0,
              "a matrix is compressed only when its factors are this many times smaller")
           .at_least(1),
       option("error_feedback", true,
              "add what the last step's approximation missed to the next step's gradients"),
       option("warm_start", true, "start each step's Q from the last step's"),
       option("orthogonalization_epsilon", 0.0,
              "added to the column norms in Gram-Schmidt (0: none, as PyTorch's default)")
           .at_least(0),
       option("seed", std::int64_t{0}, "seed of the stream Q's fresh draws take their seeds from")
           .at_least(0)
           .at_most(4294967295.0)},
      "PowerSGD: low-rank gradient compression with error feedback, as PyTorch's powerSGD_hook",
      [](const Config& options, const BuildContext&) {
        return std::make_unique<PowerSgd>(options);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("powersgd", "1.0.0", trainyard::register_components)
