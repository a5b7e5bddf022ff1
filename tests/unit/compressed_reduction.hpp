#pragma once
// Random gradients reduced through the SDK's GradientReducer with a compression plugin, on ranks
// running as threads over gloo: the shared ground of the compression tests.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <string>
#include <vector>

#include "step_harness.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/api/state.hpp"
#include "trainyard/parallel/gradient_reducer.hpp"

namespace trainyard::testing {

// Matrices worth compressing, two of one shape, a convolution's 4-D weight, vectors and a matrix
// too small to compress at rank 2 or 4.
inline const std::vector<std::vector<std::int64_t>> kCompressedShapes = {
    {24, 16}, {16}, {8, 4, 3, 3}, {24, 16}, {10, 24}, {10}, {6, 5}};

inline std::uint64_t gradient_seed(int step, int rank, std::size_t parameter) {
  return (static_cast<std::uint64_t>(step) * 16 + static_cast<std::uint64_t>(rank)) * 64 +
         parameter;
}

// Parameter `parameter`'s gradient on `rank` at `step` (powersgd_hook.py draws the same).
inline at::Tensor drawn_gradient(int step, int rank, std::size_t parameter) {
  at::Generator generator = at::detail::createCPUGenerator(gradient_seed(step, rank, parameter));
  return at::randn(kCompressedShapes[parameter], generator);
}

struct Reduced {
  std::vector<std::vector<std::size_t>> buckets;
  at::Tensor averaged;  // every step's averaged buckets, back to back
  StateDict state;      // the compressor's state after the last step, under "compression."
};

struct ReductionSetting {
  int ranks = 2;
  int steps = 20;
  double bucket_cap_mb = 25;
  std::string compression;  // empty: plain all-reduces
  std::string options;      // the [compression] section's TOML
};

// `setting.steps` synchronised backwards of drawn gradients through a reducer on this rank.
inline Reduced reduce_on_rank(const BuildContext& context, const ReductionSetting& setting) {
  at::set_num_threads(1);
  std::vector<at::Tensor> parameters;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < kCompressedShapes.size(); ++i) {
    parameters.push_back(at::zeros(kCompressedShapes[i]).requires_grad_());
    names.push_back(std::string("p").append(std::to_string(i)));
  }
  GradientReducerOptions options;
  options.bucket_cap_mb = setting.bucket_cap_mb;
  options.first_bucket_mb = setting.bucket_cap_mb;
  if (!setting.compression.empty()) {
    options.compression = bundled_registry().create<GradientCompression>(
        setting.compression, options_section("compression", setting.options), context);
  }
  GradientReducer reducer(parameters, names, context.mesh->group(MeshGroup::kData), options);
  Reduced out{reducer.bucket_parameters(), {}, {}};
  std::vector<at::Tensor> steps;
  for (int step = 0; step < setting.steps; ++step) {
    reducer.zero_gradients();
    reducer.prepare(true);
    // d/dp sum(p * g) = g: each parameter's gradient is exactly this rank's draw.
    at::Tensor loss = at::zeros({});
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      loss = loss + (parameters[i] * drawn_gradient(step, context.rank, i)).sum();
    }
    loss.backward();
    reducer.finish();
    for (const auto& bucket : out.buckets) {
      for (std::size_t i : bucket) steps.push_back(parameters[i].grad().reshape({-1}).clone());
    }
  }
  out.averaged = at::cat(steps);
  if (reducer.compressor()) reducer.compressor()->save_state(out.state, "compression.");
  return out;
}

// Over Gloo's TCP ring, as the Python references run: PowerSGD's power iteration carries the
// rounding of a sum in another order (shared memory sums in rank order) past fp32's tolerance
// within 20 steps on 4 ranks.
inline std::vector<Reduced> reduce(const ReductionSetting& setting) {
  return on_data_parallel_ranks<Reduced>(
      setting.ranks, BuildContext{},
      [&](const BuildContext& context) { return reduce_on_rank(context, setting); },
      "shared_memory_mb = 0");
}

// The mean of the ranks' gradients laid out as `buckets`, for each of `steps` steps.
inline at::Tensor exact_means(int ranks, int steps,
                              const std::vector<std::vector<std::size_t>>& buckets) {
  std::vector<at::Tensor> out;
  for (int step = 0; step < steps; ++step) {
    for (const auto& bucket : buckets) {
      for (std::size_t i : bucket) {
        at::Tensor sum = at::zeros(kCompressedShapes[i]);
        for (int rank = 0; rank < ranks; ++rank) sum += drawn_gradient(step, rank, i);
        out.push_back((sum / ranks).reshape({-1}));
      }
    }
  }
  return at::cat(out);
}

}  // namespace trainyard::testing
