// Communicator conformance: ranks (threads of this process, or a child process for a peer that
// dies) meet over loopback through the store and must get PyTorch's results from point-to-point
// transfers, every collective the strategies use, sub-groups of some ranks and the groups of a
// device mesh. Ranks run on the device types the plugin declares it serves
// (Communicator::device_types), through the device plugins of those types; a plugin is skipped,
// with a message, where no type it serves has a device for each rank.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "conformance.hpp"
#include "test_support.hpp"
#include "trainyard/parallel/collective_counter.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/process_mesh.hpp"

namespace {

using trainyard::Communicator;
using trainyard::MeshGroup;
using trainyard::MeshLayout;
using trainyard::MeshRequest;
using trainyard::ProcessMesh;
using trainyard::Rendezvous;

// Set in the child process of PeerThatDiesMidCollectiveEndsTheOthersWithAnError: the store's
// port, telling the test that it runs as the peer that is killed.
constexpr const char* kDyingPeerPortVariable = "TRAINYARD_COMM_CONFORMANCE_DYING_PEER_PORT";

// Long enough for ranks to start on a loaded machine, short enough that a rank left waiting by
// a failed peer ends the test in reasonable time.
constexpr std::chrono::seconds kCollectiveTimeout{30};

struct RankResult {
  double world_sum = 0;
  double broadcast = 0;
  bool in_group = false;
  double group_sum = 0;
  int group_size = 0;
};

// c10d logs a failed connection or collective, with the exception's call stack, before it
// throws; a test that provokes one checks the exception instead of printing that log.
class QuietC10dLog {
 public:
  QuietC10dLog() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = c10::GLOG_FATAL; }
  ~QuietC10dLog() { FLAGS_caffe2_log_level = saved_; }
  QuietC10dLog(const QuietC10dLog&) = delete;
  QuietC10dLog& operator=(const QuietC10dLog&) = delete;

 private:
  int saved_;
};

// The first line of an exception's message (c10's messages go on with a call stack).
std::string first_line(const std::exception& error) {
  std::string message = error.what();
  return message.substr(0, message.find('\n'));
}

// 2^rank: a sum of these over any set of ranks names exactly the ranks it added.
double rank_bit(int rank) { return static_cast<double>(1 << rank); }

double sum_of_rank_bits(const std::vector<int>& ranks) {
  double sum = 0;
  for (int rank : ranks) sum += rank_bit(rank);
  return sum;
}

::testing::AssertionResult equal_on_host(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor host = actual.cpu();
  if (host.scalar_type() == expected.scalar_type() && host.sizes() == expected.sizes() &&
      at::equal(host, expected)) {
    return ::testing::AssertionSuccess();
  }
  std::ostringstream out;
  out << "got " << host.scalar_type() << host.sizes() << " " << host.flatten().to(at::kDouble)
      << "\nexpected " << expected.scalar_type() << expected.sizes() << " "
      << expected.flatten().to(at::kDouble);
  return ::testing::AssertionFailure() << out.str();
}

class CommConformance : public ::testing::TestWithParam<std::string> {
 protected:
  // The device types the plugin serves, in its order of preference.
  std::vector<std::string> served_types() const {
    auto comm = trainyard::conformance::registry().create<Communicator>(
        GetParam(), trainyard::conformance::under_test("comm"),
        trainyard::conformance::classification_context());
    return comm->device_types();
  }

  // The device of each of `world_size` ranks here, on the first type the plugin serves whose
  // device plugin is loaded and has a device for every rank (each rank's own where the backend
  // gives each local rank one); nullopt when no served type has enough.
  std::optional<std::vector<c10::Device>> devices_for(int world_size) const {
    const auto& registry = trainyard::conformance::registry();
    for (const auto& type : served_types()) {
      if (!registry.contains("device", type)) continue;
      auto backend = registry.create<trainyard::DeviceBackend>(
          type, trainyard::Config({}, "device"), trainyard::BuildContext{});
      if (!backend->available()) continue;
      std::vector<c10::Device> out;
      for (int rank = 0; rank < world_size; ++rank) {
        const int index = backend->device_for_local_rank(rank).value_or(0);
        if (index >= backend->device_count()) break;
        out.push_back(backend->device(index));
      }
      if (static_cast<int>(out.size()) == world_size) return out;
    }
    return std::nullopt;
  }

  std::string missing_devices(int world_size) const {
    std::string types;
    for (const auto& type : served_types()) types += (types.empty() ? "" : ", ") + type;
    return "comm '" + GetParam() + "' serves " + types + " devices; none has a device for each of " +
           std::to_string(world_size) + " ranks here";
  }

  std::optional<c10::Device> device_for(int rank) {
    auto devices = devices_for(2);
    if (!devices) return std::nullopt;
    return (*devices)[static_cast<std::size_t>(rank)];
  }

  // A peer that dies while rank 0 waits on it ends the wait with an error (defined below).
  void expect_dying_peer_reported(
      const std::vector<c10::Device>& devices,
      const std::function<void(Communicator&, const c10::Device&)>& wait_for_peer);

  std::shared_ptr<Communicator> connect(int rank, int world_size, int port, c10::Device device,
                                        std::chrono::milliseconds timeout = kCollectiveTimeout) {
    std::shared_ptr<Communicator> comm = trainyard::conformance::registry().create<Communicator>(
        GetParam(), trainyard::conformance::under_test("comm"),
        trainyard::conformance::classification_context());
    Rendezvous meet;
    meet.rank = rank;
    meet.world_size = world_size;
    meet.local_rank = rank;
    meet.local_world_size = world_size;
    meet.master_addr = "127.0.0.1";
    meet.master_port = port;
    meet.timeout = timeout;
    comm->connect(meet, device);
    return comm;
  }

  // Runs `body` for every rank, each on its own thread with its own connected communicator.
  void run_ranks(const std::vector<c10::Device>& devices,
                 const std::function<void(Communicator&, c10::Device)>& body) {
    const int world_size = static_cast<int>(devices.size());
    const int port = trainyard::testing::free_loopback_port();
    std::vector<std::future<void>> ranks;
    for (int rank = 0; rank < world_size; ++rank) {
      ranks.push_back(std::async(std::launch::async, [&, rank] {
        auto comm = connect(rank, world_size, port, devices[static_cast<std::size_t>(rank)]);
        body(*comm, devices[static_cast<std::size_t>(rank)]);
      }));
    }
    for (auto& rank : ranks) rank.get();
  }

  // Checks every group of `mesh` against `expected` (the groups of each kind that has more than
  // one rank; kinds left out have one), then all-reduces 2^rank over each group, so a group
  // with a wrong member sums to another number.
  static void check_mesh_groups(const ProcessMesh& mesh, Communicator& comm,
                                const std::map<MeshGroup, std::vector<std::vector<int>>>& expected,
                                c10::Device device) {
    const int rank = comm.rank();
    for (MeshGroup kind : {MeshGroup::kPipeline, MeshGroup::kData, MeshGroup::kDataReplicate,
                           MeshGroup::kDataShard, MeshGroup::kTensor}) {
      const std::string label =
          std::string(trainyard::mesh_group_name(kind)) + " group of rank " + std::to_string(rank);
      auto groups = expected.find(kind);
      if (groups == expected.end()) {
        EXPECT_EQ(mesh.size(kind), 1) << label;
        EXPECT_EQ(mesh.group_ranks(kind), std::vector<int>{rank}) << label;
        EXPECT_FALSE(mesh.group(kind)) << label << ": one rank needs no backend";
        continue;
      }
      std::vector<int> members;
      for (const auto& group : groups->second) {
        if (std::find(group.begin(), group.end(), rank) != group.end()) members = group;
      }
      const auto position = std::find(members.begin(), members.end(), rank) - members.begin();
      EXPECT_EQ(mesh.group_ranks(kind), members) << label;
      EXPECT_EQ(mesh.size(kind), static_cast<int>(members.size())) << label;
      EXPECT_EQ(mesh.rank(kind), position) << label;
      auto backend = mesh.group(kind);
      if (!backend) {
        ADD_FAILURE() << label << " has no backend";
        continue;
      }
      EXPECT_EQ(backend->getSize(), static_cast<int>(members.size())) << label;
      EXPECT_EQ(backend->getRank(), position) << label;
      std::vector<at::Tensor> value{at::full({2}, rank_bit(rank), at::TensorOptions(device))};
      backend->allreduce(value)->wait();
      EXPECT_TRUE(equal_on_host(value[0], at::full({2}, sum_of_rank_bits(members))))
          << label << ": the all-reduce must add exactly the values of ranks "
          << ::testing::PrintToString(members);
    }
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
    auto comm = connect(rank, 2, port, device, std::chrono::seconds(60));
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
  if (!device0) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(2);
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

// What a pipeline sends between stages: activations and gradients of several shapes and dtypes,
// both ways, every transfer posted before any is waited for.
TEST_P(CommConformance, SendAndReceiveBothWaysWithOverlappingWorks) {
  auto devices = devices_for(2);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(2);
  struct Payload {
    std::vector<std::int64_t> shape;
    at::ScalarType dtype;
  };
  const std::vector<Payload> payloads = {{{5}, at::kFloat},      {{2, 3}, at::kDouble},
                                         {{4, 1, 2}, at::kLong}, {{3, 2}, at::kBFloat16},
                                         {{7}, at::kByte},       {{2, 2, 2}, at::kInt}};
  // Distinct contents per sender and payload (small integers, exact in every dtype).
  auto contents = [&](int sender, std::size_t index) {
    const Payload& payload = payloads[index];
    std::int64_t count = 1;
    for (std::int64_t size : payload.shape) count *= size;
    return (at::arange(count, at::kDouble) * (sender + 1) + 10.0 * static_cast<double>(index))
        .reshape(payload.shape)
        .to(payload.dtype);
  };
  // Tags tell the transfers apart; every rank posts them in the same order, which backends
  // that ignore tags (NCCL) need to match them.
  auto tag = [](int sender, std::size_t index) {
    return 100 * sender + static_cast<int>(index) + 1;
  };
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    const int rank = comm.rank();
    const int peer = 1 - rank;
    std::vector<std::vector<at::Tensor>> outgoing, incoming;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    auto post_sends = [&] {
      for (std::size_t i = 0; i < payloads.size(); ++i) {
        outgoing.push_back({contents(rank, i).to(device)});
        works.push_back(comm.world()->send(outgoing.back(), peer, tag(rank, i)));
      }
    };
    auto post_receives = [&] {
      for (std::size_t i = 0; i < payloads.size(); ++i) {
        incoming.push_back(
            {at::full(payloads[i].shape, 99, at::TensorOptions(device).dtype(payloads[i].dtype))});
        works.push_back(comm.world()->recv(incoming.back(), peer, tag(peer, i)));
      }
    };
    outgoing.reserve(payloads.size());
    incoming.reserve(payloads.size());
    // Rank 0 sends first and rank 1 receives first, so each transfer meets its match in order.
    if (rank == 0) {
      post_sends();
      post_receives();
    } else {
      post_receives();
      post_sends();
    }
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    for (std::size_t i = 0; i < payloads.size(); ++i) {
      EXPECT_TRUE(equal_on_host(incoming[i][0], contents(peer, i)))
          << "rank " << rank << " received payload " << i << " from rank " << peer;
      EXPECT_TRUE(equal_on_host(outgoing[i][0], contents(rank, i)))
          << "rank " << rank << ": sending changed payload " << i;
    }
  });
}

TEST_P(CommConformance, BroadcastFromNonZeroRoots) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    for (int root : {1, 3}) {
      const at::Tensor sent = at::arange(6, at::kFloat).reshape({2, 3}) * (root + 1);
      std::vector<at::Tensor> tensor{comm.rank() == root ? sent.clone().to(device)
                                                         : at::full({2, 3}, -1.0f).to(device)};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      comm.world()->broadcast(tensor, options)->wait();
      EXPECT_TRUE(equal_on_host(tensor[0], sent))
          << "rank " << comm.rank() << ", broadcast from rank " << root;
    }
  });
}

TEST_P(CommConformance, AllGatherIntoTensorsAndIntoOneFlatTensor) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    const int world_size = comm.world_size();
    auto contribution = [](int rank, at::ScalarType dtype) {
      return (at::arange(6, at::kFloat).reshape({2, 3}) + 10.0f * static_cast<float>(rank))
          .to(dtype);
    };
    std::vector<at::Tensor> input{contribution(comm.rank(), at::kFloat).to(device)};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int r = 0; r < world_size; ++r) output[0].push_back(at::empty_like(input[0]).fill_(-1));
    comm.world()->allgather(output, input)->wait();
    for (int r = 0; r < world_size; ++r) {
      EXPECT_TRUE(
          equal_on_host(output[0][static_cast<std::size_t>(r)], contribution(r, at::kFloat)))
          << "allgather on rank " << comm.rank() << ", slot of rank " << r;
    }

    // fsdp gathers shards of its flat parameters in fp32, and in bf16 under autocast.
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      at::Tensor shard = contribution(comm.rank(), dtype).flatten().to(device);
      at::Tensor flat =
          at::full({world_size * shard.numel()}, -1, at::TensorOptions(device).dtype(dtype));
      comm.world()->_allgather_base(flat, shard)->wait();
      std::vector<at::Tensor> expected;
      for (int r = 0; r < world_size; ++r) expected.push_back(contribution(r, dtype).flatten());
      EXPECT_TRUE(equal_on_host(flat, at::cat(expected)))
          << "_allgather_base of " << dtype << " on rank " << comm.rank();
    }
  });
}

// Each rank sends chunk j = (j + 1) * 2^rank + [0, 1, 2]: rank j receives the sum over ranks,
// (j + 1) * 15 + 4 * [0, 1, 2], or its mean.
TEST_P(CommConformance, ReduceScatterSumsAndAveragesEachRanksChunk) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  std::atomic<int> list_average_refusals{0}, flat_average_refusals{0};
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    const int world_size = comm.world_size();
    const int rank = comm.rank();
    for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG}) {
      const std::string label = std::string(op == c10d::ReduceOp::SUM ? "sum" : "average") +
                                " on rank " + std::to_string(rank);
      at::Tensor expected =
          at::arange(3, at::kFloat) * world_size + (rank + 1) * sum_of_rank_bits({0, 1, 2, 3});
      if (op == c10d::ReduceOp::AVG) expected /= world_size;
      c10d::ReduceScatterOptions options;
      options.reduceOp = op;
      // Averaging is optional for a backend, summing is not. A backend that refuses to average
      // refuses on every rank, before anything is sent.
      auto run = [&](const std::string& what, const auto& collective, const at::Tensor& result,
                     std::atomic<int>& refusals) {
        try {
          collective()->wait();
        } catch (const std::exception&) {
          if (op == c10d::ReduceOp::SUM) throw;
          ++refusals;
          return;
        }
        EXPECT_TRUE(equal_on_host(result, expected)) << what << " (" << label << ")";
      };

      std::vector<std::vector<at::Tensor>> chunks(1);
      for (int j = 0; j < world_size; ++j) {
        chunks[0].push_back((at::arange(3, at::kFloat) + (j + 1) * rank_bit(rank)).to(device));
      }
      std::vector<at::Tensor> output{at::full({3}, -1.0f).to(device)};
      run(
          "reduce_scatter", [&] { return comm.world()->reduce_scatter(output, chunks, options); },
          output[0], list_average_refusals);

      at::Tensor flat_input = at::cat(chunks[0]);
      at::Tensor flat_output = at::full({3}, -1.0f).to(device);
      run(
          "_reduce_scatter_base",
          [&] { return comm.world()->_reduce_scatter_base(flat_output, flat_input, options); },
          flat_output, flat_average_refusals);
    }
  });
  for (auto [what, refusals] : {std::pair{"reduce_scatter", list_average_refusals.load()},
                                std::pair{"_reduce_scatter_base", flat_average_refusals.load()}}) {
    EXPECT_TRUE(refusals == 0 || refusals == 4)
        << refusals << " of 4 ranks refused to average with " << what;
    if (refusals > 0) {
      RecordProperty(std::string(what) + "_average", "not supported by comm '" + GetParam() + "'");
    }
  }
}

TEST_P(CommConformance, AllReduceSumMaxAndMin) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    const int rank = comm.rank();
    for (at::ScalarType dtype : {at::kFloat, at::kLong}) {
      std::vector<at::Tensor> sum{
          (at::arange(1, 4, at::kDouble) * rank_bit(rank)).to(dtype).to(device)};
      comm.world()->allreduce(sum)->wait();
      EXPECT_TRUE(equal_on_host(sum[0], (at::arange(1, 4, at::kDouble) * 15).to(dtype)))
          << "sum of " << dtype << " on rank " << rank;
    }
    // Every element's extreme comes from a different rank.
    const at::Tensor values =
        at::tensor({static_cast<float>(rank), -static_cast<float>(rank), rank == 2 ? 9.0f : 0.5f});
    for (auto [op, expected] : {std::pair{c10d::ReduceOp::MAX, at::tensor({3.0f, 0.0f, 9.0f})},
                                std::pair{c10d::ReduceOp::MIN, at::tensor({0.0f, -3.0f, 0.5f})}}) {
      std::vector<at::Tensor> tensor{values.clone().to(device)};
      c10d::AllreduceOptions options;
      options.reduceOp = op;
      comm.world()->allreduce(tensor, options)->wait();
      EXPECT_TRUE(equal_on_host(tensor[0], expected))
          << (op == c10d::ReduceOp::MAX ? "max" : "min") << " on rank " << rank;
    }
  });
}

// Many collectives in flight at once, waited in reverse order: one larger than a backend's
// staging buffers would be (12 MB), one strided, several dtypes and reductions, a broadcast from
// a non-zero root among them, and more small ones than a backend might track at once. Then a
// batch that is only polled (isCompleted) until done: polling alone must finish it.
TEST_P(CommConformance, CollectivesInFlightOfEverySizeFinishInAnyOrder) {
  auto devices = devices_for(2);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(2);
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    const int rank = comm.rank();
    const auto on_device = at::TensorOptions(device);
    struct Expected {
      std::string what;
      at::Tensor tensor;
      at::Tensor value;
      c10::intrusive_ptr<c10d::Work> work;
    };
    std::vector<Expected> launched;
    auto all_reduce = [&](std::string what, at::Tensor tensor, at::Tensor value,
                          c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM) {
      std::vector<at::Tensor> tensors{tensor};
      c10d::AllreduceOptions options;
      options.reduceOp = op;
      auto work = comm.world()->allreduce(tensors, options);
      launched.push_back({std::move(what), tensor, std::move(value), std::move(work)});
    };
    const at::Tensor pattern = at::arange(3'000'000, at::kFloat).remainder(1000);
    all_reduce("12 MB of float", (pattern * (rank + 1)).to(device), pattern * 3);
    // A transposed view: the all-reduce writes the sums through its strides.
    at::Tensor grid = at::arange(64 * 48, at::kDouble).reshape({64, 48}) * (rank + 1);
    all_reduce("strided double", grid.to(device).t(),
               (at::arange(64 * 48, at::kDouble).reshape({64, 48}) * 3).t());
    all_reduce("bfloat16", at::full({1000}, 0.5 * (rank + 1), on_device.dtype(at::kBFloat16)),
               at::full({1000}, 1.5, at::kBFloat16));
    all_reduce("int64 product", at::full({7}, rank + 2, on_device.dtype(at::kLong)),
               at::full({7}, 6, at::kLong), c10d::ReduceOp::PRODUCT);
    all_reduce("max of bool", at::full({5}, rank == 1, on_device.dtype(at::kBool)),
               at::ones({5}, at::kBool), c10d::ReduceOp::MAX);
    std::vector<at::Tensor> message{at::full({33}, rank == 1 ? 7 : 0, on_device.dtype(at::kByte))};
    c10d::BroadcastOptions from_one;
    from_one.rootRank = 1;
    launched.push_back({"broadcast from rank 1", message[0], at::full({33}, 7, at::kByte),
                        comm.world()->broadcast(message, from_one)});
    for (int i = 0; i < 80; ++i) {
      all_reduce("small " + std::to_string(i), at::full({3}, i + rank, on_device.dtype(at::kFloat)),
                 at::full({3}, 2 * i + 1, at::kFloat));
    }
    for (auto it = launched.rbegin(); it != launched.rend(); ++it) it->work->wait();
    for (const auto& expected : launched) {
      EXPECT_TRUE(equal_on_host(expected.tensor, expected.value))
          << expected.what << " on rank " << rank;
    }

    launched.clear();
    for (int i = 0; i < 10; ++i) {
      all_reduce("polled " + std::to_string(i),
                 at::full({100'000}, i * (rank + 1), on_device.dtype(at::kFloat)),
                 at::full({100'000}, 3 * i, at::kFloat));
    }
    const auto deadline = std::chrono::steady_clock::now() + kCollectiveTimeout;
    for (auto& expected : launched) {
      while (!expected.work->isCompleted() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      EXPECT_TRUE(expected.work->isCompleted()) << expected.what << " never completed";
      EXPECT_TRUE(equal_on_host(expected.tensor, expected.value))
          << expected.what << " on rank " << rank;
    }
  });
}

TEST_P(CommConformance, BarrierReturnsOnlyWhenEveryRankHasArrived) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  std::atomic<int> arrived{0};
  run_ranks(*devices, [&](Communicator& comm, c10::Device) {
    // Later ranks arrive later: rank 0 waits longest.
    std::this_thread::sleep_for(std::chrono::milliseconds(60 * comm.rank()));
    ++arrived;
    comm.barrier();
    EXPECT_EQ(arrived.load(), comm.world_size()) << "rank " << comm.rank() << " left early";
  });
}

TEST_P(CommConformance, SubGroupsOfSomeRanks) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    const int rank = comm.rank();
    auto sum_in = [&](const c10::intrusive_ptr<c10d::Backend>& group) {
      std::vector<at::Tensor> value{at::full({1}, rank_bit(rank), at::TensorOptions(device))};
      group->allreduce(value)->wait();
      return value[0].cpu().item<double>();
    };
    // Created by every rank in the same order; a rank outside a group gets no backend.
    auto odd = comm.new_group({3, 1});
    auto low = comm.new_group({0, 1});
    auto high = comm.new_group({2, 3});
    auto shuffled = comm.new_group({2, 0, 3, 1});
    EXPECT_EQ(static_cast<bool>(odd), rank == 1 || rank == 3) << "rank " << rank;
    EXPECT_EQ(static_cast<bool>(low), rank < 2) << "rank " << rank;
    EXPECT_EQ(static_cast<bool>(high), rank >= 2) << "rank " << rank;
    ASSERT_TRUE(shuffled);

    // A member's group rank is its position in the list.
    if (odd) {
      EXPECT_EQ(odd->getSize(), 2);
      EXPECT_EQ(odd->getRank(), rank == 3 ? 0 : 1);
      EXPECT_EQ(sum_in(odd), sum_of_rank_bits({1, 3})) << "rank " << rank;
      odd->barrier()->wait();
    }
    // Disjoint groups work at the same time.
    auto& mine = rank < 2 ? low : high;
    EXPECT_EQ(sum_in(mine), sum_of_rank_bits(rank < 2 ? std::vector{0, 1} : std::vector{2, 3}))
        << "rank " << rank;

    const std::vector<int> order = {2, 0, 3, 1};
    EXPECT_EQ(shuffled->getRank(), std::find(order.begin(), order.end(), rank) - order.begin());
    // Group rank 0 is world rank 2: its value reaches everyone.
    std::vector<at::Tensor> root{at::full({1}, rank_bit(rank), at::TensorOptions(device))};
    shuffled->broadcast(root)->wait();
    EXPECT_EQ(root[0].cpu().item<double>(), rank_bit(2)) << "rank " << rank;
  });
}

// Rank = pp * 2 + dp_shard: pipeline peers are 2 apart, data-parallel peers neighbours.
TEST_P(CommConformance, MeshGroupsOfPipelineByDataShard) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    ProcessMesh mesh(MeshLayout::resolve(MeshRequest{.pp = 2, .dp_shard = 2}, 4), comm);
    EXPECT_EQ(mesh.rank(), comm.rank());
    check_mesh_groups(mesh, comm,
                      {{MeshGroup::kPipeline, {{0, 2}, {1, 3}}},
                       {MeshGroup::kData, {{0, 1}, {2, 3}}},
                       {MeshGroup::kDataShard, {{0, 1}, {2, 3}}}},
                      device);
    // dp is dp_shard when nothing is replicated: one backend for both.
    EXPECT_EQ(mesh.group(MeshGroup::kData).get(), mesh.group(MeshGroup::kDataShard).get());
    // The gradients' way back: a backend of its own beside the pipeline group's where the
    // communicator asks for one per direction (the same backend otherwise); a gradient sent back
    // over it arrives.
    const auto back = mesh.pipeline_return_group();
    ASSERT_TRUE(back);
    if (comm.one_backend_per_direction()) {
      EXPECT_NE(back.get(), mesh.group(MeshGroup::kPipeline).get());
    } else {
      EXPECT_EQ(back.get(), mesh.group(MeshGroup::kPipeline).get());
    }
    EXPECT_EQ(back->getSize(), 2);
    const int stage = mesh.rank(MeshGroup::kPipeline);
    std::vector<at::Tensor> gradient{
        at::full({3}, stage == 1 ? 7.0 + comm.rank() : 0.0, at::TensorOptions(device))};
    if (stage == 1) {
      back->send(gradient, 0, 5)->wait();
    } else {
      back->recv(gradient, 1, 5)->wait();
      EXPECT_TRUE(equal_on_host(gradient[0], at::full({3}, 9.0 + comm.rank())))
          << "rank " << comm.rank() << " received its gradient from pp rank 1";
    }
  });
}

// Rank = dp_shard * 2 + tp: tensor-parallel peers are neighbours.
TEST_P(CommConformance, MeshGroupsOfDataShardByTensor) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    ProcessMesh mesh(MeshLayout::resolve(MeshRequest{.dp_shard = 2, .tp = 2}, 4), comm);
    EXPECT_FALSE(mesh.pipeline_return_group()) << "a pipeline of one rank sends nothing back";
    check_mesh_groups(mesh, comm,
                      {{MeshGroup::kData, {{0, 2}, {1, 3}}},
                       {MeshGroup::kDataShard, {{0, 2}, {1, 3}}},
                       {MeshGroup::kTensor, {{0, 1}, {2, 3}}}},
                      device);
  });
}

TEST_P(CommConformance, MeshDimensionSpanningTheWorldUsesTheWorldGroup) {
  auto devices = devices_for(4);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(4);
  run_ranks(*devices, [&](Communicator& comm, c10::Device device) {
    for (const ProcessMesh& mesh :
         {ProcessMesh(comm), ProcessMesh(MeshLayout::resolve(MeshRequest{.tp = 4}, 4), comm)}) {
      const bool data_parallel = mesh.size(MeshGroup::kData) == 4;
      const std::vector<MeshGroup> spanning =
          data_parallel ? std::vector{MeshGroup::kData, MeshGroup::kDataShard}
                        : std::vector{MeshGroup::kTensor};
      for (MeshGroup kind : spanning) {
        // The mesh counts its collectives through a wrapper around the world group.
        EXPECT_EQ(trainyard::uncounted(mesh.group(kind)).get(), comm.world().get())
            << trainyard::mesh_group_name(kind) << " of " << mesh.layout().describe();
      }
      check_mesh_groups(
          mesh, comm,
          data_parallel ? std::map<MeshGroup, std::vector<std::vector<int>>>{{MeshGroup::kData,
                                                                              {{0, 1, 2, 3}}},
                                                                             {MeshGroup::kDataShard,
                                                                              {{0, 1, 2, 3}}}}
                        : std::map<MeshGroup, std::vector<std::vector<int>>>{{MeshGroup::kTensor,
                                                                              {{0, 1, 2, 3}}}},
          device);
    }
  });
}

// Rank 0 runs here, rank 1 in a child process (this test again, told by the environment), which
// is killed while rank 0 waits on `wait_for_peer` (an operation rank 1 never joins): rank 0 must
// get an error, and soon, not hang. Both ranks all-reduce once first, so that every connection
// (and any shared memory) is set up.
void CommConformance::expect_dying_peer_reported(
    const std::vector<c10::Device>& devices,
    const std::function<void(Communicator&, const c10::Device&)>& wait_for_peer) {
  // The child needs time to start and load the plugins before it joins.
  const std::chrono::seconds timeout(60);
  if (const char* port = std::getenv(kDyingPeerPortVariable)) {
    auto comm = connect(1, 2, std::atoi(port), devices[1], timeout);
    std::vector<at::Tensor> value{at::ones({4}, at::TensorOptions(devices[1]))};
    comm->world()->allreduce(value)->wait();
    // Killed here, while rank 0 waits.
    std::this_thread::sleep_for(2 * timeout);
    return;
  }

  QuietC10dLog quiet;
  const int port = trainyard::testing::free_loopback_port();
  using Clock = std::chrono::steady_clock;
  std::atomic<Clock::rep> waiting_since{0};
  auto rank0 = std::async(std::launch::async, [&]() -> std::optional<Clock::time_point> {
    auto comm = connect(0, 2, port, devices[0], timeout);
    std::vector<at::Tensor> value{at::ones({4}, at::TensorOptions(devices[0]))};
    comm->world()->allreduce(value)->wait();
    waiting_since = Clock::now().time_since_epoch().count();
    try {
      wait_for_peer(*comm, devices[0]);
    } catch (const std::exception& error) {
      EXPECT_FALSE(first_line(error).empty());
      return Clock::now();
    }
    ADD_FAILURE() << "rank 0's wait completed without its peer";
    return std::nullopt;
  });

  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::optional<Clock::time_point> killed_at;
  std::vector<std::string> peer_command = {std::filesystem::read_symlink("/proc/self/exe").string(),
                                           std::string("--gtest_filter=") +
                                               test->test_suite_name() + "." + test->name()};
  const std::vector<std::string> runner = trainyard::conformance::runner_arguments();
  peer_command.insert(peer_command.end(), runner.begin(), runner.end());
  auto peer = trainyard::testing::run_command(
      peer_command,
      {}, /*timeout_s=*/180, {std::string(kDyingPeerPortVariable) + "=" + std::to_string(port)},
      [&] {
        const auto since = waiting_since.load();
        if (since == 0) return false;
        if (Clock::now() - Clock::time_point(Clock::duration(since)) <
            std::chrono::milliseconds(300)) {
          return false;
        }
        killed_at = Clock::now();
        return true;
      });
  ASSERT_TRUE(peer.killed) << "the peer ended before it was killed: "
                           << trainyard::testing::describe(peer);
  ASSERT_EQ(rank0.wait_for(timeout + std::chrono::seconds(10)), std::future_status::ready)
      << "rank 0 still waits, " << (timeout + std::chrono::seconds(10)).count()
      << " s after its peer was killed";
  std::optional<Clock::time_point> failed_at = rank0.get();
  ASSERT_TRUE(failed_at && killed_at);
  EXPECT_LT(*failed_at - *killed_at, timeout) << "the error must come within the timeout";
}

TEST_P(CommConformance, PeerThatDiesMidCollectiveEndsTheOthersWithAnError) {
  auto devices = devices_for(2);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(2);
  expect_dying_peer_reported(*devices, [](Communicator& comm, const c10::Device& device) {
    std::vector<at::Tensor> value{at::ones({4}, at::TensorOptions(device))};
    comm.world()->allreduce(value)->wait();
  });
}

// A pipeline stage waiting for its neighbour's activations when the neighbour dies.
TEST_P(CommConformance, PeerThatDiesBeforeSendingEndsTheReceiveWithAnError) {
  auto devices = devices_for(2);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(2);
  expect_dying_peer_reported(*devices, [](Communicator& comm, const c10::Device& device) {
    std::vector<at::Tensor> message{at::empty({1000}, at::TensorOptions(device))};
    comm.world()->recv(message, 1, 3)->wait();
  });
}

TEST_P(CommConformance, CollectivesOnOneRank) {
  // A world of one runs wherever one device is: the path a single GPU can check.
  auto devices = devices_for(1);
  if (!devices) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(1);
  const c10::Device device = devices->front();
  auto comm = trainyard::conformance::registry().create<Communicator>(
      GetParam(), trainyard::conformance::under_test("comm"),
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
      GetParam(), trainyard::conformance::under_test("comm"),
      trainyard::conformance::classification_context());
  auto device = device_for(1);
  if (!device) TRAINYARD_SKIP_WITHOUT_GPU() << missing_devices(2);
  QuietC10dLog quiet;
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
