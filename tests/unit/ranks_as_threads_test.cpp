// Ranks as threads of one test process: process groups of different ranks start collectives at
// the same moment, which is the pattern that corrupts PyTorch's flight recorder (one per process,
// registering each group outside its lock). The test main turns the recorder off; with
// TORCH_FR_BUFFER_SIZE=2000 in the environment this test crashes within a few rounds.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "step_harness.hpp"

namespace trainyard::testing {
namespace {

constexpr int kThreads = 8;
constexpr int kRounds = 30;

// A communicator of its own one-rank job, its store on a port the system picks.
std::shared_ptr<Communicator> lone_rank() {
  BuildContext build;
  auto communicator =
      bundled_registry().create<Communicator>("gloo", options_section("comm", ""), build);
  Rendezvous meet;
  meet.master_port = 0;
  meet.timeout = std::chrono::seconds(60);
  communicator->connect(meet, c10::Device(c10::kCPU));
  return communicator;
}

TEST(RanksAsThreads, GroupsStartingTheirFirstCollectivesAtOnceDoNotInterfere) {
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::shared_ptr<Communicator>> ranks;
    for (int t = 0; t < kThreads; ++t) ranks.push_back(lone_rank());
    std::latch start(kThreads);
    std::vector<at::Tensor> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<at::Tensor> tensors{at::full({4}, static_cast<double>(t))};
        start.arrive_and_wait();
        ranks[static_cast<std::size_t>(t)]->world()->allreduce(tensors)->wait();
        results[static_cast<std::size_t>(t)] = tensors[0];
      });
    }
    for (auto& thread : threads) thread.join();
    // A one-rank all-reduce leaves each thread's own values.
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_TRUE(
          at::equal(results[static_cast<std::size_t>(t)], at::full({4}, static_cast<double>(t))))
          << "round " << round << ", thread " << t;
    }
  }
}

}  // namespace
}  // namespace trainyard::testing
