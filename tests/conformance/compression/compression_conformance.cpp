// Gradient-compression conformance: on two ranks (threads of this process over the bundled gloo
// communicator) a compressor leaves the same average on every rank, closer to the exact average
// of the ranks' gradients than nothing; its saved state resumes it exactly, a state without its
// entries starts it afresh, and a state saved for other buckets is refused in one line.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/accumulate.h>

#include <functional>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/gradient_compression.hpp"

namespace {

using namespace trainyard;

constexpr int kRanks = 2;

// Two buckets: a matrix and a vector; then a matrix, a vector and a convolution's weight.
BucketShapes fixture_shapes() {
  BucketShapes shapes;
  shapes.buckets = {{{24, 16}, {16}}, {{10, 24}, {10}, {8, 4, 3, 3}}};
  return shapes;
}

// Bucket `b` at `step` on `rank`: its flat gradients drawn from their own stream, and views.
GradientBucket drawn_bucket(const BucketShapes& shapes, std::size_t b, int step, int rank) {
  std::int64_t numel = 0;
  for (const auto& shape : shapes.buckets[b]) numel += c10::multiply_integers(shape);
  at::Generator generator =
      at::detail::createCPUGenerator(static_cast<std::uint64_t>((step * 8 + rank) * 8) + b);
  GradientBucket bucket{b, at::randn({numel}, generator), {}};
  std::int64_t offset = 0;
  for (const auto& shape : shapes.buckets[b]) {
    bucket.gradients.push_back(
        bucket.flat.narrow(0, offset, c10::multiply_integers(shape)).view(shape));
    offset += c10::multiply_integers(shape);
  }
  return bucket;
}

// One synchronised backward's reduction of every bucket, as a reducer drives it: begin() in
// bucket order, end() in bucket order, end_step(). The averaged buckets back to back.
at::Tensor reduce_step(BucketCompressor& compressor, const BucketShapes& shapes, int step,
                       int rank) {
  std::vector<GradientBucket> buckets;
  for (std::size_t b = 0; b < shapes.buckets.size(); ++b) {
    buckets.push_back(drawn_bucket(shapes, b, step, rank));
  }
  for (auto& bucket : buckets) compressor.begin(bucket);
  for (auto& bucket : buckets) compressor.end(bucket);
  compressor.end_step();
  std::vector<at::Tensor> flats;
  for (const auto& bucket : buckets) flats.push_back(bucket.flat);
  return at::cat(flats);
}

at::Tensor exact_average(const BucketShapes& shapes, int step) {
  std::vector<at::Tensor> flats;
  for (std::size_t b = 0; b < shapes.buckets.size(); ++b) {
    at::Tensor sum;
    for (int rank = 0; rank < kRanks; ++rank) {
      const at::Tensor flat = drawn_bucket(shapes, b, step, rank).flat;
      sum = sum.defined() ? sum + flat : flat;
    }
    flats.push_back(sum / kRanks);
  }
  return at::cat(flats);
}

class CompressionConformance : public ::testing::TestWithParam<std::string> {
 protected:
  // The plugin with the suite's settings: compressed from the third step where it has a
  // start_step (the first two run plain all-reduces while state builds up).
  std::shared_ptr<GradientCompression> build() {
    auto table = std::make_shared<Table>();
    if (conformance::has_option("compression", GetParam(), "start_step")) {
      table->set("start_step", Value(std::int64_t{2}));
    }
    return conformance::registry().create<GradientCompression>(
        GetParam(), conformance::under_test("compression", table),
        conformance::classification_context());
  }

  // `body(group, rank)` on each of two ranks, on its own thread over gloo; the results in rank
  // order.
  template <class Result>
  std::vector<Result> run_ranks(
      const std::function<Result(const c10::intrusive_ptr<c10d::Backend>&, int)>& body) {
    return conformance::run_gloo_ranks<Result>(
        kRanks, [&](const std::shared_ptr<Communicator>& communicator) {
          Result result = body(communicator->world(), communicator->rank());
          communicator->barrier();
          return result;
        });
  }
};

TEST_P(CompressionConformance, EveryRankHoldsTheSameAverageNearTheExactOne) {
  const BucketShapes shapes = fixture_shapes();
  const auto steps = run_ranks<std::vector<at::Tensor>>(
      [&](const c10::intrusive_ptr<c10d::Backend>& group, int rank) {
        auto compressor = build()->make_compressor(shapes, group);
        std::vector<at::Tensor> out;
        for (int step = 0; step < 4; ++step) {
          out.push_back(reduce_step(*compressor, shapes, step, rank));
        }
        return out;
      });
  for (int step = 0; step < 4; ++step) {
    const at::Tensor& average = steps[0][static_cast<std::size_t>(step)];
    EXPECT_TRUE(at::equal(steps[1][static_cast<std::size_t>(step)], average)) << "step " << step;
    EXPECT_TRUE(average.isfinite().all().item<bool>()) << "step " << step;
  }
  // The third step is the first compressed one where the plugin waits two: no error carried yet.
  const at::Tensor exact = exact_average(shapes, 2);
  const double miss = (steps[0][2] - exact).norm().item<double>();
  EXPECT_LT(miss, exact.norm().item<double>())
      << "the compressed average is further from the exact one than zero is";
}

TEST_P(CompressionConformance, SavedStateResumesExactly) {
  const BucketShapes shapes = fixture_shapes();
  const auto results = run_ranks<std::vector<at::Tensor>>(
      [&](const c10::intrusive_ptr<c10d::Backend>& group, int rank) {
        auto running = build()->make_compressor(shapes, group);
        for (int step = 0; step < 4; ++step) reduce_step(*running, shapes, step, rank);
        StateDict saved;
        running->save_state(saved, "compression.");
        for (const auto& [name, tensor] : saved.tensors) {
          EXPECT_EQ(name.rfind("compression.", 0), 0u) << name << " is outside its prefix";
        }
        auto resumed = build()->make_compressor(shapes, group);
        resumed->load_state(saved, "compression.");
        std::vector<at::Tensor> out;
        for (int step = 4; step < 6; ++step) {
          out.push_back(reduce_step(*running, shapes, step, rank));
          out.push_back(reduce_step(*resumed, shapes, step, rank));
        }
        return out;
      });
  for (const auto& rank : results) {
    EXPECT_TRUE(at::equal(rank[1], rank[0])) << "the first step after resuming differs";
    EXPECT_TRUE(at::equal(rank[3], rank[2])) << "the second step after resuming differs";
  }
}

TEST_P(CompressionConformance, AStateWithoutItsEntriesStartsAfresh) {
  const BucketShapes shapes = fixture_shapes();
  const auto results = run_ranks<std::vector<at::Tensor>>(
      [&](const c10::intrusive_ptr<c10d::Backend>& group, int rank) {
        auto fresh = build()->make_compressor(shapes, group);
        auto loaded = build()->make_compressor(shapes, group);
        StateDict unrelated;
        unrelated.tensors["model.weight"] = at::zeros({3});
        loaded->load_state(unrelated, "compression.");
        std::vector<at::Tensor> out;
        for (int step = 0; step < 4; ++step) {
          out.push_back(reduce_step(*fresh, shapes, step, rank));
          out.push_back(reduce_step(*loaded, shapes, step, rank));
        }
        return out;
      });
  for (const auto& rank : results) {
    for (std::size_t i = 0; i < rank.size(); i += 2) EXPECT_TRUE(at::equal(rank[i + 1], rank[i]));
  }
}

TEST_P(CompressionConformance, AStateOfOtherBucketsIsRefusedInOneLine) {
  const BucketShapes shapes = fixture_shapes();
  BucketShapes other;
  other.buckets = {{{20, 16}, {16}}, {{10, 24}, {10}, {8, 4, 3, 3}}};
  const auto messages =
      run_ranks<std::string>([&](const c10::intrusive_ptr<c10d::Backend>& group, int rank) {
        auto running = build()->make_compressor(shapes, group);
        for (int step = 0; step < 4; ++step) reduce_step(*running, shapes, step, rank);
        StateDict saved;
        running->save_state(saved, "compression.");
        auto mismatched = build()->make_compressor(other, group);
        try {
          mismatched->load_state(saved, "compression.");
        } catch (const Error& error) {
          return std::string(error.what());
        }
        return std::string();
      });
  for (const auto& message : messages) {
    EXPECT_FALSE(message.empty()) << "a state saved for other buckets was accepted";
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(CompressionConformance, "compression");
