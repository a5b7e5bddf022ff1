// [comm] settings reach the communication backend: the values are read back from the backend
// (Gloo's process group) or from the environment NCCL reads at start, and recorded in the run's
// run_info.toml and by `trainyard doctor`.

#include <c10/core/Device.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <ATen/ATen.h>

#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "parity_runs.hpp"
#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// The `name` communicator with `settings` (and the defaults), as the engine creates it.
std::shared_ptr<Communicator> communicator(Registry& registry, const std::string& name,
                                           const std::shared_ptr<Table>& settings) {
  return registry.create<Communicator>(name, Config(settings, "comm"), BuildContext{});
}

// One rank on its own: it hosts the store, so nothing else is needed to create its groups.
Rendezvous alone() {
  Rendezvous meet;
  meet.master_addr = "127.0.0.1";
  meet.master_port = free_loopback_port();
  meet.timeout = std::chrono::seconds(30);
  return meet;
}

TEST(CommSettings, GlooThreadsAndInterfaceReachTheProcessGroup) {
  Registry registry;
  load_bundled_plugins(registry);
  auto settings = std::make_shared<Table>();
  settings->set("threads", Value(3));
  settings->set("interface", Value("lo"));
  auto comm = communicator(registry, "gloo", settings);
  comm->connect(alone(), c10::Device(c10::kCPU));
  auto* gloo = dynamic_cast<c10d::ProcessGroupGloo*>(comm->world().get());
  ASSERT_NE(gloo, nullptr);
  EXPECT_EQ(gloo->getNumThreads(), 3);
  // One transport device, created for the interface (a missing one is refused, below).
  EXPECT_EQ(gloo->getOptions()->devices.size(), 1u);
}

// Two ranks on threads of this process, each with its own gloo communicator with `settings`,
// running `body`.
void run_two_gloo_ranks(const std::shared_ptr<Table>& settings,
                        const std::function<void(Communicator&)>& body) {
  Registry registry;
  load_bundled_plugins(registry);
  const int port = free_loopback_port();
  std::vector<std::future<void>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(std::async(std::launch::async, [&, rank] {
      auto comm = communicator(registry, "gloo", settings);
      Rendezvous meet = alone();
      meet.rank = rank;
      meet.world_size = 2;
      meet.master_port = port;
      comm->connect(meet, c10::Device(c10::kCPU));
      body(*comm);
    }));
  }
  for (auto& rank : ranks) rank.get();
}

// This process's mappings of trainyard's shared-memory segments.
int shared_memory_mappings() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    count += line.find("/dev/shm/trainyard-") != std::string::npos ? 1 : 0;
  }
  return count;
}

TEST(CommSettings, GlooAllReducesOfOneHostGoThroughSharedMemoryUnlessTurnedOff) {
  for (int staging_mb : {0, 8}) {
    auto settings = std::make_shared<Table>();
    settings->set("shared_memory_mb", Value(staging_mb));
    run_two_gloo_ranks(settings, [&](Communicator& comm) {
      std::vector<at::Tensor> value{at::full({1000}, comm.rank() + 1.0)};
      comm.world()->allreduce(value)->wait();
      EXPECT_EQ(value[0][999].item<double>(), 3.0) << "shared_memory_mb = " << staging_mb;
      comm.barrier();  // both ranks have mapped the segment, or not
      // Each rank (a thread here) maps the group's segment once.
      EXPECT_EQ(shared_memory_mappings(), staging_mb == 0 ? 0 : 2)
          << "shared_memory_mb = " << staging_mb;
      comm.barrier();
    });
  }
  EXPECT_EQ(shared_memory_mappings(), 0) << "the segments go with their communicators";
  // The name is removed once every rank has mapped the segment: a run that is killed leaves
  // nothing in /dev/shm.
  const std::string ours = "trainyard-" + std::to_string(getpid()) + "-";
  for (const auto& entry : fs::directory_iterator("/dev/shm")) {
    EXPECT_NE(entry.path().filename().string().rfind(ours, 0), 0u) << entry.path();
  }
}

// A rank 0 killed between making its segment and its peers mapping it leaves the name behind: a
// later group's rank 0 removes such names of processes that have ended, an hour on.
TEST(CommSettings, GlooRemovesTheSharedMemoryNamesOfEndedProcesses) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const fs::path stale = fs::path("/dev/shm") / ("trainyard-" + std::to_string(child) + "-0");
  const fs::path recent = fs::path("/dev/shm") / ("trainyard-" + std::to_string(child) + "-1");
  std::ofstream(stale).put('x');
  std::ofstream(recent).put('x');
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(2));
  run_two_gloo_ranks(std::make_shared<Table>(), [&](Communicator& comm) {
    std::vector<at::Tensor> value{at::ones({4})};
    comm.world()->allreduce(value)->wait();
  });
  EXPECT_FALSE(fs::exists(stale)) << "an ended process's name two hours old stays";
  EXPECT_TRUE(fs::exists(recent)) << "a name less than an hour old is left to its maker";
  fs::remove(recent);
}

TEST(CommSettings, GlooSharedMemoryAllReducesOfDifferentSizesFailWithAnError) {
  run_two_gloo_ranks(std::make_shared<Table>(), [&](Communicator& comm) {
    std::vector<at::Tensor> value{at::ones({comm.rank() == 0 ? 4 : 5})};
    try {
      comm.world()->allreduce(value)->wait();
      ADD_FAILURE() << "rank " << comm.rank() << " all-reduced tensors of different sizes";
    } catch (const std::exception& error) {
      const std::string message = error.what();
      EXPECT_HAS(message.substr(0, message.find('\n')), "of the same size in the same order");
    }
  });
}

// A message from rank 0 to rank 1 in the mailbox test.
struct Message {
  int tag;
  at::Tensor value;
};

// Small messages; one of 12 MB, more than a mailbox holds (it goes over TCP); three of 3 MB sent
// before any is read (the third finds no room: TCP too); doubles; an empty one; and two with one
// tag, which receives take in the order they were sent.
std::vector<Message> mailbox_test_messages() {
  std::vector<Message> out;
  for (int i = 0; i < 40; ++i) out.push_back({100 + i, at::full({i + 1}, 1.0 * i)});
  out.push_back({200, at::arange(3'000'000, at::kFloat)});
  for (int i = 0; i < 3; ++i) out.push_back({300 + i, at::full({750'000}, 1.0 * i)});
  out.push_back({400, at::arange(64 * 48, at::kDouble).reshape({64, 48})});
  out.push_back({500, at::empty({0})});
  out.push_back({600, at::full({5}, 1.0)});
  out.push_back({600, at::full({5}, 2.0)});
  return out;
}

TEST(CommSettings, GlooMessagesOfOneHostGoThroughMailboxesMatchedByTagUnlessTurnedOff) {
  const std::vector<Message> messages = mailbox_test_messages();
  const std::size_t count = messages.size();
  for (int staging_mb : {0, 8}) {
    auto settings = std::make_shared<Table>();
    settings->set("shared_memory_mb", Value(staging_mb));
    run_two_gloo_ranks(settings, [&](Communicator& comm) {
      if (comm.rank() == 0) {
        std::vector<c10::intrusive_ptr<c10d::Work>> sent;
        for (const auto& message : messages) {
          std::vector<at::Tensor> tensors{message.value};
          sent.push_back(comm.world()->send(tensors, 1, message.tag));
        }
        for (auto& work : sent) work->wait();
      } else {
        // Posted in the reverse order, but for the two of one tag; waited for in reverse.
        std::vector<std::size_t> order = {count - 2, count - 1};
        for (std::size_t k = count - 2; k-- > 0;) order.push_back(k);
        std::vector<at::Tensor> received(count);
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        for (std::size_t k : order) {
          received[k] = at::full(messages[k].value.sizes(), -1.0, messages[k].value.options());
          std::vector<at::Tensor> tensors{received[k]};
          works.push_back(comm.world()->recv(tensors, 0, messages[k].tag));
        }
        for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
        for (std::size_t k = 0; k < count; ++k) {
          EXPECT_TRUE(received[k].equal(messages[k].value))
              << "message " << k << " (tag " << messages[k].tag
              << "), shared_memory_mb = " << staging_mb;
        }
      }
      comm.barrier();
      // Each rank (a thread here) maps the mailbox rank 0 made.
      EXPECT_EQ(shared_memory_mappings(), staging_mb == 0 ? 0 : 2)
          << "shared_memory_mb = " << staging_mb;
      comm.barrier();
    });
  }
  // The receiver removes the mailbox's name once it has mapped it.
  const std::string ours = "trainyard-" + std::to_string(getpid()) + "-";
  for (const auto& entry : fs::directory_iterator("/dev/shm")) {
    EXPECT_NE(entry.path().filename().string().rfind(ours, 0), 0u) << entry.path();
  }
}

TEST(CommSettings, GlooMessageOfAnotherSizeThanItsReceiveFailsWithAnError) {
  run_two_gloo_ranks(std::make_shared<Table>(), [&](Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<at::Tensor> message{at::ones({4})};
      comm.world()->send(message, 1, 9)->wait();
      return;
    }
    std::vector<at::Tensor> message{at::ones({5})};
    const std::string error = error_of([&] { comm.world()->recv(message, 0, 9)->wait(); });
    EXPECT_HAS(error, "rank 0 sent 16 bytes with tag 9 where this rank receives 20");
  });
}

// Groups are independent: ranks may launch, and wait for, their collectives on two groups in
// different orders. A group's first collective sets its segment up as the collectives progress,
// so no rank waits inside a launch for its peers to reach theirs; and a rank waiting in one
// group's collective moves the other's on, which its peer waits in.
TEST(CommSettings, GlooCollectivesOfTwoGroupsLaunchedInEitherOrderFinish) {
  run_two_gloo_ranks(std::make_shared<Table>(), [&](Communicator& comm) {
    auto first = comm.new_group({0, 1});
    auto second = comm.new_group({0, 1});
    std::vector<at::Tensor> a{at::full({100}, comm.rank() + 1.0)};
    std::vector<at::Tensor> b{at::full({100}, 10.0 * (comm.rank() + 1))};
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    if (comm.rank() == 0) {
      works.push_back(first->allreduce(a));
      works.push_back(second->allreduce(b));
    } else {
      works.push_back(second->allreduce(b));
      works.push_back(first->allreduce(a));
    }
    for (auto& work : works) work->wait();
    EXPECT_EQ(a[0][99].item<double>(), 3.0);
    EXPECT_EQ(b[0][99].item<double>(), 30.0);
  });
}

// A segment that cannot be made (more than /dev/shm holds): the group's collectives, those
// launched before the ranks knew included, and its messages go over TCP, with the same results.
TEST(CommSettings, GlooGroupsWhoseSegmentCannotBeMadeGoOverTcp) {
  auto settings = std::make_shared<Table>();
  settings->set("shared_memory_mb", Value(std::int64_t{1} << 30));  // 1 PiB
  run_two_gloo_ranks(settings, [&](Communicator& comm) {
    std::vector<std::vector<at::Tensor>> values;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int i = 0; i < 5; ++i) {
      values.push_back({at::full({1000}, 1.0 * i * (comm.rank() + 1))});
      works.push_back(comm.world()->allreduce(values.back()));
    }
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    for (int i = 0; i < 5; ++i) EXPECT_EQ(values[i][0][999].item<double>(), 3.0 * i) << i;
    std::vector<at::Tensor> message{at::full({10}, comm.rank() == 0 ? 7.0 : 0.0)};
    if (comm.rank() == 0) {
      comm.world()->send(message, 1, 4)->wait();
    } else {
      comm.world()->recv(message, 0, 4)->wait();
      EXPECT_EQ(message[0][9].item<double>(), 7.0);
    }
    comm.barrier();
    EXPECT_EQ(shared_memory_mappings(), 0);
    comm.barrier();
  });
}

TEST(CommSettings, GlooRefusesAMissingInterfaceWithItsName) {
  Registry registry;
  load_bundled_plugins(registry);
  auto settings = std::make_shared<Table>();
  settings->set("interface", Value("nosuchif0"));
  auto comm = communicator(registry, "gloo", settings);
  std::string message = error_of([&] { comm->connect(alone(), c10::Device(c10::kCPU)); });
  EXPECT_HAS(message, "cannot use network interface 'nosuchif0'");
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(CommSettings, NcclSettingsAreTheEnvironmentNcclStartsWith) {
  Registry registry;
  load_bundled_plugins(registry);
  auto settings = std::make_shared<Table>();
  settings->set("interface", Value("lo"));
  settings->set("algo", Value("Ring"));
  settings->set("proto", Value("Simple"));
  settings->set("buffer_size", Value(std::int64_t{8} << 20));
  settings->set("debug", Value("WARN"));
  auto comm = communicator(registry, "nccl", settings);
  // Set before anything else connect() does: here the CPU device is refused right after.
  std::string message = error_of([&] { comm->connect(alone(), c10::Device(c10::kCPU)); });
  EXPECT_HAS(message, "needs a CUDA device");
  const std::pair<const char*, const char*> expected[] = {{"NCCL_SOCKET_IFNAME", "lo"},
                                                          {"NCCL_ALGO", "Ring"},
                                                          {"NCCL_PROTO", "Simple"},
                                                          {"NCCL_BUFFSIZE", "8388608"},
                                                          {"NCCL_DEBUG", "WARN"}};
  for (const auto& [variable, value] : expected) {
    const char* set = std::getenv(variable);
    ASSERT_NE(set, nullptr) << variable;
    EXPECT_EQ(std::string(set), value) << variable;
    ::unsetenv(variable);
  }
}

TEST(CommSettings, NcclRefusesAnUnknownDebugLevel) {
  Registry registry;
  load_bundled_plugins(registry);
  auto settings = std::make_shared<Table>();
  settings->set("debug", Value("LOUD"));
  std::string message = error_of([&] { communicator(registry, "nccl", settings); });
  EXPECT_HAS(message, "debug");
  EXPECT_HAS(message, "LOUD");
}

TEST(CommSettings, RecordedInTheRunInfoAndByDoctor) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", R"([run]
max_steps = 2
eval = false
[loader]
workers = 0
batch_size = 8
[dataset]
plugin = "synthetic"
samples = 64
input_shape = [1, 8, 8]
[model]
plugin = "mlp"
hidden = [16]
[optimizer]
plugin = "sgd"
[strategy]
plugin = "ddp"
[comm]
plugin = "gloo"
threads = 3
interface = "lo"
timeout_s = 60
)");
  auto run = run_launched(2, recipe, dir / "out", {});
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string info =
        read_text(dir / "out" / ("run_info.rank" + std::to_string(rank) + ".toml"));
    EXPECT_HAS(info, "[comm]");
    EXPECT_HAS(info, "interface = \"lo\"");
    EXPECT_HAS(info, "threads = 3");
    EXPECT_HAS(info, "timeout_s = 60");
  }
  auto doctor = run_host({"doctor", recipe.string()});
  EXPECT_HAS(doctor.out, "recipe [comm]: ");
  EXPECT_HAS(doctor.out, "interface = \"lo\"");
  EXPECT_HAS(doctor.out, "threads = 3");
}

}  // namespace
}  // namespace trainyard::testing
