// Communicator conformance: two ranks (threads of this process) meet through the store, and the
// world group, a sub-group and the barrier give PyTorch's collective results. A plugin that
// needs CUDA is skipped, with a message, where no GPU is visible.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>

#include "conformance.hpp"
#include "test_support.hpp"
#include "trainyard/communicator.hpp"
#include "trainyard/distributed.hpp"
#include "trainyard/error.hpp"

namespace {

using trainyard::Communicator;
using trainyard::Rendezvous;

struct RankResult {
  double world_sum = 0;
  double broadcast = 0;
  bool in_group = false;
  double group_sum = 0;
  int group_size = 0;
};

class CommConformance : public ::testing::TestWithParam<std::string> {
 protected:
  // The device of `rank` here: the CPU, or a GPU per rank for a plugin that drives CUDA
  // (nullopt when there are not enough).
  std::optional<c10::Device> device_for(int rank) {
    const auto& help = trainyard::conformance::registry().info("comm", GetParam()).help;
    if (help.find("CUDA") == std::string::npos) return c10::Device(c10::kCPU);
    if (!at::hasCUDA() || at::getNumGPUs() < 2) return std::nullopt;
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank));
  }

  // Local addresses listening on `port`, from /proc/net/tcp and tcp6 (hex, as the kernel shows).
  static std::vector<std::string> listening_addresses(int port) {
    std::vector<std::string> out;
    char wanted[8];
    std::snprintf(wanted, sizeof wanted, "%04X", port);
    for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
      std::ifstream in(table);
      std::string line;
      std::getline(in, line);
      while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string slot, local, remote, state;
        fields >> slot >> local >> remote >> state;
        auto colon = local.find(':');
        if (state == "0A" && local.substr(colon + 1) == wanted)
          out.push_back(local.substr(0, colon));
      }
    }
    return out;
  }

  RankResult run_rank(int rank, int port, c10::Device device) {
    auto comm = trainyard::conformance::registry().create<Communicator>(
        GetParam(), trainyard::conformance::section("comm"),
        trainyard::conformance::classification_context());
    Rendezvous meet;
    meet.rank = rank;
    meet.world_size = 2;
    meet.local_rank = rank;
    meet.local_world_size = 2;
    meet.master_addr = "127.0.0.1";
    meet.master_port = port;
    meet.timeout = std::chrono::seconds(60);
    comm->connect(meet, device);
    RankResult result;
    EXPECT_EQ(comm->rank(), rank);
    EXPECT_EQ(comm->world_size(), 2);
    EXPECT_TRUE(comm->store());

    std::vector<at::Tensor> value{at::full({3}, rank + 1.0, at::TensorOptions(device))};
    comm->world()->allreduce(value)->wait();
    result.world_sum = value[0].cpu()[2].item<double>();

    std::vector<at::Tensor> root{at::full({2}, rank == 0 ? 7.0 : -1.0, at::TensorOptions(device))};
    comm->world()->broadcast(root)->wait();
    result.broadcast = root[0].cpu()[1].item<double>();

    // Sub-groups are created by every rank in the same order; non-members get none.
    auto only_one = comm->new_group({1});
    auto both = comm->new_group({1, 0});
    result.in_group = static_cast<bool>(only_one);
    if (only_one) result.group_size = only_one->getSize();
    std::vector<at::Tensor> group_value{
        at::full({1}, 10.0 * (rank + 1), at::TensorOptions(device))};
    both->allreduce(group_value)->wait();
    result.group_sum = group_value[0].cpu().item<double>();
    EXPECT_EQ(both->getRank(), rank == 1 ? 0 : 1);
    comm->barrier();
    return result;
  }
};

TEST_P(CommConformance, CollectivesAndSubGroupsAcrossTwoRanks) {
  auto device0 = device_for(0);
  if (!device0) GTEST_SKIP() << "comm '" << GetParam() << "' needs two CUDA devices; none here";
  auto device1 = *device_for(1);
  const int port = trainyard::testing::free_loopback_port();
  auto rank1 = std::async(std::launch::async, [&] { return run_rank(1, port, device1); });
  RankResult zero = run_rank(0, port, *device0);
  RankResult one = rank1.get();
  for (const auto& result : {zero, one}) {
    EXPECT_EQ(result.world_sum, 3.0);
    EXPECT_EQ(result.broadcast, 7.0);
    EXPECT_EQ(result.group_sum, 30.0);
  }
  EXPECT_FALSE(zero.in_group);
  EXPECT_TRUE(one.in_group);
  EXPECT_EQ(one.group_size, 1);
}

TEST_P(CommConformance, CollectivesOnOneRank) {
  // A world of one runs wherever one device is: the path a single GPU can check.
  const auto& help = trainyard::conformance::registry().info("comm", GetParam()).help;
  c10::Device device(c10::kCPU);
  if (help.find("CUDA") != std::string::npos) {
    if (!at::hasCUDA() || at::getNumGPUs() < 1) {
      GTEST_SKIP() << "comm '" << GetParam() << "' needs a CUDA device; none here";
    }
    device = c10::Device(c10::kCUDA, 0);
  }
  auto comm = trainyard::conformance::registry().create<Communicator>(
      GetParam(), trainyard::conformance::section("comm"),
      trainyard::conformance::classification_context());
  Rendezvous meet;
  meet.master_port = trainyard::testing::free_loopback_port();
  meet.timeout = std::chrono::seconds(60);
  comm->connect(meet, device);
  std::vector<at::Tensor> value{at::full({4}, 2.5, at::TensorOptions(device))};
  comm->world()->allreduce(value)->wait();
  EXPECT_EQ(value[0].cpu()[3].item<double>(), 2.5);
  auto group = comm->new_group({0});
  ASSERT_TRUE(group);
  EXPECT_EQ(group->getSize(), 1);
  std::vector<at::Tensor> root{at::full({2}, 4.0, at::TensorOptions(device))};
  group->broadcast(root)->wait();
  EXPECT_EQ(root[0].cpu()[1].item<double>(), 4.0);
  comm->barrier();
}

TEST_P(CommConformance, StoreListensOnTheMasterAddressOnly) {
  // c10d's own server would listen on every interface; ours listens on 127.0.0.1 alone.
  Rendezvous meet;
  meet.master_addr = "127.0.0.1";
  meet.master_port = trainyard::testing::free_loopback_port();
  meet.timeout = std::chrono::seconds(10);
  auto store = trainyard::open_store(meet, /*host=*/true);
  EXPECT_EQ(listening_addresses(meet.master_port), std::vector<std::string>{"0100007F"});
}

TEST_P(CommConformance, UnreachableStoreFailsWithinTheTimeout) {
  auto comm = trainyard::conformance::registry().create<Communicator>(
      GetParam(), trainyard::conformance::section("comm"),
      trainyard::conformance::classification_context());
  auto device = device_for(1);
  if (!device) GTEST_SKIP() << "comm '" << GetParam() << "' needs CUDA devices; none here";
  Rendezvous meet;
  meet.rank = 1;
  meet.world_size = 2;
  meet.master_port = trainyard::testing::free_loopback_port();
  meet.timeout = std::chrono::seconds(3);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(comm->connect(meet, *device), std::exception);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TRAINYARD_CONFORMANCE_SUITE(CommConformance, "comm");

}  // namespace
