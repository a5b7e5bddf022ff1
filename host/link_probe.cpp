#include "link_probe.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/runtime/peak_flops.hpp"
#include "trainyard/runtime/plugin_loader.hpp"

namespace trainyard {

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

constexpr std::int64_t kSmallElements = 256;        // 1 KiB of float32
constexpr std::int64_t kLargeElements = 1LL << 20;  // 4 MiB of float32
constexpr int kWarmUp = 5;
constexpr int kTimed = 60;

// A port nothing listens on now, for rank 0's store.
int free_port() {
  const ListeningSocket socket = listen_on("127.0.0.1", 0);
  ::close(socket.fd);
  return socket.port;
}

// The mean of the middle 90% of `seconds`: a step pays for every collective, and on a loaded
// loopback a call takes one of two times several-fold apart, of which a median picks one.
double trimmed_mean(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  const std::size_t cut = seconds.size() / 20;
  double sum = 0;
  for (std::size_t i = cut; i < seconds.size() - cut; ++i) sum += seconds[i];
  return sum / static_cast<double>(seconds.size() - 2 * cut);
}

// The mean seconds of the collectives a probe rank times: all-gathers and all-reduces of a
// small and of a large tensor, and a message of each size from one rank to another.
struct ProbeTimes {
  double gather_small = 0;
  double gather_large = 0;
  double reduce_small = 0;
  double reduce_large = 0;
  double message_small = 0;
  double message_large = 0;
};

// A message to the partner rank and its answer back: rank 2k and 2k + 1 are partners; a last
// odd rank sits it out.
void ping_pong(Communicator& communicator, at::Tensor& message) {
  const int rank = communicator.rank();
  const int partner = rank ^ 1;
  if (partner >= communicator.world_size()) return;
  std::vector<at::Tensor> tensors{message};
  constexpr int kTag = 7;
  if (rank % 2 == 0) {
    communicator.world()->send(tensors, partner, kTag)->wait();
    communicator.world()->recv(tensors, partner, kTag)->wait();
  } else {
    communicator.world()->recv(tensors, partner, kTag)->wait();
    communicator.world()->send(tensors, partner, kTag)->wait();
  }
}

// All-gathers of `small` and of `large` float32 values from each rank, and all-reduces of as
// many, alternated so that a busy moment slows all alike, after a warm-up (every rank runs the
// same sequence, so each call starts within one collective of the others). A step's collectives
// follow compute, which leaves the caches holding its data and the peers' communication threads
// asleep: each call here follows about a millisecond of matrix products too. An all-gather
// crosses the link as every collective can; an all-reduce, or a message (timed there and back,
// halved), may take a faster path.
ProbeTimes timed_collectives(Communicator& communicator, std::int64_t small, std::int64_t large) {
  std::vector<double> seconds[6];
  const at::Tensor operand = at::ones({256, 256});
  for (int repetition = 0; repetition < kWarmUp + kTimed; ++repetition) {
    for (int kind = 0; kind < 6; ++kind) {
      const bool gather = kind < 2;
      const bool message = kind >= 4;
      const std::int64_t elements = kind % 2 == 0 ? small : large;
      at::Tensor input = at::ones({elements});
      at::Tensor gathered = at::empty({elements * communicator.world_size()});
      for (int product = 0; product < 4; ++product) input.add_(at::mm(operand, operand).sum());
      std::vector<at::Tensor> reduced{input};
      const auto start = std::chrono::steady_clock::now();
      if (gather) {
        communicator.world()->_allgather_base(gathered, input)->wait();
      } else if (message) {
        ping_pong(communicator, input);
      } else {
        communicator.world()->allreduce(reduced)->wait();
      }
      if (repetition < kWarmUp) continue;
      const double taken =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      seconds[kind].push_back(message ? taken / 2 : taken);
    }
  }
  return {trimmed_mean(seconds[0]), trimmed_mean(seconds[1]), trimmed_mean(seconds[2]),
          trimmed_mean(seconds[3]), trimmed_mean(seconds[4]), trimmed_mean(seconds[5])};
}

// A call's fixed time and the seconds per byte from the times of a small and a large call,
// each rank moving `share` times the bytes of its tensor.
std::pair<double, double> fit_link(double small, double large, double share) {
  const double moved = share * 4.0 * static_cast<double>(kLargeElements - kSmallElements);
  double seconds_per_byte = (large - small) / moved;
  if (!(seconds_per_byte > 0)) {
    // Noise hid the difference: the large tensor's time alone bounds the cost per byte.
    seconds_per_byte = large / (share * 4.0 * static_cast<double>(kLargeElements));
  }
  return {std::max(0.0, small - seconds_per_byte * share * 4.0 * kSmallElements), seconds_per_byte};
}

fs::path entry_file(const fs::path& folder, const std::string& plugin, int ranks) {
  return folder / (cache_host_name() + "-" + plugin + "-" + std::to_string(ranks) +
                   "-processes-gather-reduce-send.txt");
}

// The first line a failed probe rank wrote, for the error that reports it.
std::string first_line_of(const fs::path& log) {
  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  return line.empty() ? "no output" : line;
}

// How a probe rank ended, when not with exit status 0: its log's first line, or its signal.
std::string how_it_failed(int status, const fs::path& log) {
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  }
  return first_line_of(log);
}

// Waits for every probe rank and returns how the first to fail failed ("rank 1: ..."), or ""
// when all succeeded. The others cannot finish a collective without it, so once one fails the
// rest are stopped rather than left to wait out the store's timeout.
std::string first_failed_rank(const std::vector<pid_t>& children, const fs::path& folder) {
  std::string failure;
  std::vector<bool> done(children.size(), false);
  while (std::find(done.begin(), done.end(), false) != done.end()) {
    bool reaped = false;
    for (std::size_t rank = 0; rank < children.size(); ++rank) {
      if (done[rank]) continue;
      int status = 0;
      const pid_t result = ::waitpid(children[rank], &status, WNOHANG);
      const bool lost = result < 0 && errno == ECHILD;  // reaped elsewhere: no status to read
      if (result != children[rank] && !lost) continue;
      done[rank] = reaped = true;
      const bool succeeded = !lost && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!failure.empty() || succeeded) continue;
      failure = "rank " + std::to_string(rank) + ": " +
                (lost ? std::string("its exit status was lost")
                      : how_it_failed(status, folder / ("rank" + std::to_string(rank) + ".log")));
      for (std::size_t other = 0; other < children.size(); ++other) {
        if (!done[other]) ::kill(children[other], SIGKILL);
      }
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return failure;
}

}  // namespace

fs::path link_cache_folder() {
  // Beside the peak FLOP/s probes: the same cache root.
  return peak_cache_folder().parent_path() / "links";
}

LinkCost measure_link(const Registry& registry, const std::string& plugin, int ranks) {
  if (ranks < 2) throw Error("a link needs at least 2 ranks, not " + std::to_string(ranks));
  // Each rank is a process of its own, as in a run: threads of one process share its memory and
  // scheduling, and measured collectives several times faster than processes' on the loopback.
  const ComponentInfo& info = registry.info("comm", plugin);
  const fs::path folder =
      fs::temp_directory_path() / ("trainyard-link-" + std::to_string(::getpid()));
  fs::create_directories(folder);
  const fs::path result = folder / "rank0.txt";
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> args = {
        "--plugin", plugin, "--ranks", std::to_string(ranks), "--rank", std::to_string(r),
        "--port",   port,   "--out",   result.string()};
    // The communicator's own library, alone: the probe needs nothing else.
    if (!info.library_path.empty()) {
      args.insert(args.end(), {"--no-default-plugins", "--plugin-path", info.library_path});
    }
    args.insert(args.begin(), "link-probe");
    children.push_back(start_this_binary(args, folder / ("rank" + std::to_string(r) + ".log"),
                                         "plan: link probe"));
  }
  const std::string failure = first_failed_rank(children, folder);
  ProbeTimes times;
  std::ifstream in(result);
  const bool read =
      static_cast<bool>(in >> times.gather_small >> times.gather_large >> times.reduce_small >>
                        times.reduce_large >> times.message_small >> times.message_large);
  std::error_code ignored;
  fs::remove_all(folder, ignored);
  if (!failure.empty() || !read) {
    throw Error("plan: the link probe over " + std::to_string(ranks) + " processes of '" + plugin +
                "' failed (" + (failure.empty() ? "rank 0 wrote no timing" : failure) + ")");
  }
  LinkCost cost;
  cost.ranks = ranks;
  // A ring all-gather moves the n-1 other ranks' pieces through each rank, a ring all-reduce
  // 2 (n-1)/n of its tensor.
  std::tie(cost.latency_seconds, cost.seconds_per_byte) =
      fit_link(times.gather_small, times.gather_large, ranks - 1.0);
  std::tie(cost.reduce_latency_seconds, cost.reduce_seconds_per_byte) =
      fit_link(times.reduce_small, times.reduce_large, 2.0 * (ranks - 1) / ranks);
  std::tie(cost.message_latency_seconds, cost.message_seconds_per_byte) =
      fit_link(times.message_small, times.message_large, 1.0);
  return cost;
}

LinkCost cached_or_measured_link(const Registry& registry, const std::string& plugin, int ranks,
                                 const fs::path& folder,
                                 const std::function<void(const std::string&)>& warn) {
  const fs::path file = entry_file(folder, plugin, ranks);
  LinkCost cost;
  if (std::ifstream in(file); in &&
                              in >> cost.latency_seconds >> cost.seconds_per_byte >>
                                  cost.reduce_latency_seconds >> cost.reduce_seconds_per_byte >>
                                  cost.message_latency_seconds >> cost.message_seconds_per_byte &&
                              cost.seconds_per_byte > 0 && cost.reduce_seconds_per_byte > 0 &&
                              cost.message_seconds_per_byte > 0) {
    cost.ranks = ranks;
    cost.cached = true;
    cost.cache_file = file;
    return cost;
  }
  cost = measure_link(registry, plugin, ranks);
  std::error_code error;
  fs::create_directories(folder, error);
  const fs::path partial = file.string() + ".partial." + std::to_string(::getpid());
  {
    std::ofstream out(partial);
    out.precision(17);
    out << cost.latency_seconds << " " << cost.seconds_per_byte << " "
        << cost.reduce_latency_seconds << " " << cost.reduce_seconds_per_byte << " "
        << cost.message_latency_seconds << " " << cost.message_seconds_per_byte << "\n";
  }
  fs::rename(partial, file, error);
  if (error) {
    fs::remove(partial, error);
    warn("trainyard: note: the link cost could not be cached in " + folder.string());
  } else {
    cost.cache_file = file;
  }
  return cost;
}

int command_link_probe(const std::vector<std::string>& args, Registry& registry) {
  std::string plugin;
  int ranks = 0;
  int rank = 0;
  int port = 0;
  std::string out;
  CommonOptions common;
  po::options_description options("link-probe options");
  options.add_options()("plugin", po::value(&plugin)->required(), "communicator plugin")(
      "ranks", po::value(&ranks)->required(), "ranks of the link")(
      "rank", po::value(&rank)->required(), "this process's rank")(
      "port", po::value(&port)->required(), "rank 0's store port")(
      "out", po::value(&out)->required(), "where rank 0 writes its timings");
  add_common(options, common);
  if (!parse(args, options, {}, "usage: trainyard link-probe (started by plan)")) return 0;
  PluginLoader loader(registry);
  load_plugins(loader, common);
  // One compute thread, as a run of as many ranks as cores gives each.
  at::set_num_threads(1);
  auto communicator = registry.create<Communicator>(plugin, Config({}, "comm"), BuildContext{});
  Rendezvous meet;
  meet.rank = meet.local_rank = rank;
  meet.world_size = meet.local_world_size = ranks;
  meet.master_port = port;
  meet.timeout = std::chrono::seconds(60);
  communicator->connect(meet, c10::Device(c10::kCPU));
  // For the tests of plan's failure path: this rank dies once connected, as a crashed peer would.
  if (const char* dying = std::getenv("TRAINYARD_TEST_LINK_PROBE_KILL_RANK");
      dying != nullptr && std::to_string(rank) == dying) {
    ::raise(SIGKILL);
  }
  const ProbeTimes times = timed_collectives(*communicator, kSmallElements, kLargeElements);
  if (rank == 0) {
    std::ofstream file(out);
    file.precision(17);
    file << times.gather_small << " " << times.gather_large << " " << times.reduce_small << " "
         << times.reduce_large << " " << times.message_small << " " << times.message_large << "\n";
    if (!file) throw Error("link-probe: cannot write " + out);
  }
  return 0;
}

}  // namespace trainyard
