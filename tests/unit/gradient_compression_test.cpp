// The compression plugins' own behaviour, beyond agreement with PyTorch (powersgd_test.cpp):
// error feedback loses nothing (what the steps applied plus what the ranks still hold equals
// the sum of the exact averages), top-k sends only its share and at ratio 1 is the plain
// average, and settings that cannot work are refused in one line.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compressed_reduction.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard::testing {
namespace {

constexpr int kSteps = 12;

// Each rank's remaining error, laid out as the buckets are, averaged over the ranks.
at::Tensor mean_error(const std::vector<Reduced>& ranks) {
  std::vector<at::Tensor> buckets;
  for (std::size_t b = 0; b < ranks[0].buckets.size(); ++b) {
    const std::string name = "compression.bucket" + std::to_string(b) + ".error";
    at::Tensor sum;
    for (const auto& rank : ranks) {
      const at::Tensor& error = rank.state.tensors.at(name);
      sum = sum.defined() ? sum + error : error.clone();
    }
    buckets.push_back(sum / static_cast<double>(ranks.size()));
  }
  return at::cat(buckets);
}

void expect_nothing_lost(const ReductionSetting& setting) {
  const std::vector<Reduced> ranks = reduce(setting);
  const std::int64_t per_step = ranks[0].averaged.numel() / setting.steps;
  const at::Tensor applied = ranks[0].averaged.view({setting.steps, per_step}).sum(0);
  const at::Tensor exact =
      exact_means(setting.ranks, setting.steps, ranks[0].buckets).view({setting.steps, per_step});
  const at::Tensor held = mean_error(ranks);
  EXPECT_TRUE(at::allclose(applied + held, exact.sum(0), 1e-5, 1e-4))
      << setting.compression << ": applied + held differs from the exact sum by up to "
      << (applied + held - exact.sum(0)).abs().max().item<double>();
  // Not trivially: the compression did leave something behind.
  EXPECT_GT(held.abs().max().item<double>(), 0.1) << setting.compression;
}

TEST(CompressionErrorFeedback, PowerSgdLosesNothing) {
  expect_nothing_lost({2, kSteps, 0.002, "powersgd", "rank = 2\nstart_step = 2"});
}

TEST(CompressionErrorFeedback, TopkLosesNothing) {
  expect_nothing_lost({2, kSteps, 0.002, "topk", "ratio = 0.05"});
}

TEST(Topk, SendsOnlyItsShareOfEachBucket) {
  const std::vector<Reduced> ranks = reduce({2, 1, 0.002, "topk", "ratio = 0.05"});
  std::int64_t offset = 0;
  for (const auto& bucket : ranks[0].buckets) {
    std::int64_t numel = 0;
    for (std::size_t i : bucket) numel += at::zeros(kCompressedShapes[i]).numel();
    const auto share = static_cast<std::int64_t>(std::ceil(0.05 * static_cast<double>(numel)));
    const std::int64_t nonzero =
        ranks[0].averaged.narrow(0, offset, numel).ne(0).sum().item<std::int64_t>();
    // Each rank sends `share` entries; where they coincide the sum holds fewer.
    EXPECT_LE(nonzero, 2 * share);
    EXPECT_GE(nonzero, share);
    offset += numel;
  }
}

TEST(Topk, RatioOneIsThePlainAverage) {
  const ReductionSetting setting{2, 3, 25, "topk", "ratio = 1.0"};
  const std::vector<Reduced> ranks = reduce(setting);
  const at::Tensor exact = exact_means(2, setting.steps, ranks[0].buckets);
  EXPECT_TRUE(at::allclose(ranks[0].averaged, exact, 1.3e-6, 1e-5));
  EXPECT_TRUE(at::equal(ranks[1].averaged, ranks[0].averaged));
  EXPECT_EQ(mean_error(ranks).abs().max().item<double>(), 0.0);
}

void expect_one_line_error(const std::function<void()>& body, const std::string& expected) {
  try {
    body();
    ADD_FAILURE() << "accepted; expected an error saying " << expected;
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

std::shared_ptr<GradientCompression> compression(const std::string& name,
                                                 const std::string& options) {
  return bundled_registry().create<GradientCompression>(
      name, options_section("compression", options), BuildContext{});
}

TEST(CompressionSettings, APowerSgdRankAboveEveryMatrixIsRefused) {
  BucketShapes shapes;
  shapes.buckets = {{{10, 784}, {10}}, {{32, 10}}};
  expect_one_line_error(
      [&] { compression("powersgd", "rank = 64\nstart_step = 2")->make_compressor(shapes, {}); },
      "rank 64 is above the smaller dimension of every gradient matrix (the largest is 10 x "
      "784)");
  // A rank some matrix can take is fine.
  EXPECT_NE(compression("powersgd", "rank = 10\nstart_step = 2")->make_compressor(shapes, {}),
            nullptr);
}

TEST(CompressionSettings, ATopkRatioOutsideZeroToOneIsRefused) {
  expect_one_line_error([] { compression("topk", "ratio = 0.0"); }, "ratio");
  expect_one_line_error([] { compression("topk", "ratio = 1.5"); }, "ratio");
}

TEST(CompressionSettings, PowerSgdNeedsPlainStepsBeforeItsStateStarts) {
  expect_one_line_error([] { compression("powersgd", "start_step = 1"); },
                        "must be above 1 with error_feedback or warm_start");
  EXPECT_NE(compression("powersgd", "start_step = 0\nerror_feedback = false\nwarm_start = false"),
            nullptr);
}

TEST(CompressionSettings, FsdpRefusesCompression) {
  HarnessOptions options;
  options.strategy = "fsdp";
  options.compression = "powersgd";
  expect_one_line_error([&] { StepHarness harness(options); },
                        "fsdp: [compression] replaces all-reduces of gradients, and fsdp "
                        "reduce-scatters them");
}

TEST(CompressionSettings, PipelineWithShardedStagesRefusesCompression) {
  HarnessOptions options;
  options.strategy = "pipeline";
  options.strategy_options = "dp_sharding = \"full\"";
  options.compression = "topk";
  expect_one_line_error([&] { StepHarness harness(options); },
                        "pipeline: [compression] replaces all-reduces of gradients");
}

TEST(CompressionSettings, DdpRefusesCompressionBesideAWireDtype) {
  const auto errors = run_threaded_ranks<std::string>(2, [](int rank, int port) {
    HarnessOptions options;
    options.strategy = "ddp";
    options.strategy_options = "compression = \"bf16\"";
    options.compression = "topk";
    options.as_rank(rank, 2, port);
    try {
      StepHarness harness(options);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string();
  });
  for (const auto& message : errors) {
    EXPECT_NE(message.find("ddp: [compression] replaces the all-reduce that "
                           "strategy.compression narrows"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace trainyard::testing
