// Bytes each rank holds between steps (parameters + gradients + optimizer state), measured by
// Strategy::held_bytes on the tensors themselves: four ranks as threads of this process over
// gloo, fsdp in each sharding mode against ddp on the same model and optimizer.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <iostream>

#include "step_harness.hpp"
#include "trainyard/communicator.hpp"
#include "trainyard/distributed.hpp"

namespace trainyard::testing {
namespace {

constexpr int kRanks = 4;
const std::vector<std::int64_t> kShape = {1, 8, 8};
constexpr std::int64_t kClasses = 10;

struct Held {
  HeldBytes bytes;
  double loss = 0;
};

// One rank: a cnn with AdamW under `strategy` (its options in TOML), two steps, then what it
// holds.
Held run_rank(int rank, int port, const std::string& strategy, const std::string& options) {
  Registry& registry = bundled_registry();
  BuildContext build;
  build.seed = 11;
  build.rank = rank;
  build.world_size = kRanks;
  build.data.input_shape = kShape;
  build.data.num_classes = kClasses;
  auto comm = registry.create<Communicator>("gloo", options_section("comm", ""), build);
  Rendezvous meet;
  meet.rank = rank;
  meet.world_size = kRanks;
  meet.local_rank = rank;
  meet.local_world_size = kRanks;
  meet.master_port = port;
  meet.timeout = std::chrono::seconds(120);
  comm->connect(meet, c10::Device(c10::kCPU));

  StrategyContext context;
  context.build = build;
  context.communicator = comm;
  context.optimizer = registry.create<Optimizer>(
      "adamw", options_section("optimizer", "lr = 0.01\nweight_decay = 0.01"), build);
  context.precision = registry.create<Precision>("fp32", options_section("precision", ""), build);
  context.device_backend = registry.create<DeviceBackend>("cpu", options_section("device", ""), build);
  const Config model_section =
      options_section("model", "channels = [8, 16]\nhidden = 64\nbatch_norm = false");
  context.make_model = [model_section](const BuildContext& context) {
    return bundled_registry().create<Model>("cnn", model_section, context);
  };
  auto instance =
      registry.create<Strategy>(strategy, options_section("strategy", options), build);
  instance->setup(context);
  Held held;
  for (std::uint64_t step = 0; step < 2; ++step) {
    Batch batch = random_batch(8, kShape, kClasses, 100 * step + static_cast<std::uint64_t>(rank));
    held.loss = instance->train_step(std::span<const Batch>(&batch, 1)).loss.item<double>();
  }
  held.bytes = instance->held_bytes();
  comm->barrier();
  return held;
}

// Rank 0's bytes (every rank holds the same amount, up to one unit's padding).
std::vector<Held> run_ranks(const std::string& strategy, const std::string& options) {
  ListeningSocket socket = listen_on("127.0.0.1", 0);
  ::close(socket.fd);
  std::vector<std::future<Held>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(std::async(std::launch::async, [r, port = socket.port, strategy, options] {
      return run_rank(r, port, strategy, options);
    }));
  }
  std::vector<Held> out;
  for (auto& rank : ranks) out.push_back(rank.get());
  return out;
}

TEST(FsdpMemory, FullShardHoldsAQuarterOfDdpOnFourRanks) {
  at::set_num_threads(1);
  // ddp at its leanest: gradients are views into the all-reduce buckets, nothing held twice.
  auto ddp = run_ranks("ddp", "gradient_as_bucket_view = true");
  auto ddp_copies = run_ranks("ddp", "");
  const double reference = static_cast<double>(ddp[0].bytes.total());
  ASSERT_GT(reference, 0);
  EXPECT_GT(ddp[0].bytes.optimizer_state, 0);
  // zero1 shards only the optimizer state (and keeps a master copy of its slice).
  auto zero1 = run_ranks("ddp", "gradient_as_bucket_view = true\nzero1 = true");
  const double zero1_ratio = static_cast<double>(zero1[0].bytes.total()) / reference;
  std::cout << "ddp zero1 rank 0 holds " << zero1_ratio << " of ddp with bucket views"
            << std::endl;
  // Parameters and gradients whole (2 units), AdamW's 2 units and the master copy in quarters.
  EXPECT_NEAR(zero1_ratio, (2.0 + 3.0 / kRanks) / 4.0, 0.02);
  for (const std::string sharding : {"full", "grad_op", "none"}) {
    auto fsdp = run_ranks("fsdp", "sharding = \"" + sharding + "\"");
    for (int r = 0; r < kRanks; ++r) {
      const double ratio = static_cast<double>(fsdp[static_cast<std::size_t>(r)].bytes.total()) /
                           reference;
      if (r == 0) {
        const auto& b = fsdp[0].bytes;
        std::cout << "fsdp " << sharding << " rank 0 holds " << b.parameters << " + "
                  << b.gradients << " + " << b.optimizer_state << " bytes (parameters + "
                  << "gradients + optimizer): " << ratio
                  << " of ddp with bucket views, "
                  << static_cast<double>(b.total()) /
                         static_cast<double>(ddp_copies[0].bytes.total())
                  << " of ddp with bucket copies" << std::endl;
      }
      if (sharding == "none") {
        EXPECT_NEAR(ratio, 1.0, 0.01) << "rank " << r;  // replicated, as ddp
      } else {
        EXPECT_LE(ratio, 0.25 + 0.05) << sharding << " rank " << r;
        EXPECT_GE(ratio, 0.25 - 0.05) << sharding << " rank " << r;  // it does hold its shard
      }
    }
  }
}

}  // namespace
}  // namespace trainyard::testing
