#include "link_probe.hpp"

#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "trainyard/api/build_context.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/runtime/median.hpp"
#include "trainyard/runtime/peak_flops.hpp"

namespace trainyard {

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kSmallElements = 256;        // 1 KiB of float32
constexpr std::int64_t kLargeElements = 1LL << 20;  // 4 MiB of float32
constexpr int kWarmUp = 5;
constexpr int kTimed = 31;

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

// A port nothing listens on now, for rank 0's store.
int free_port() {
  const ListeningSocket socket = listen_on("127.0.0.1", 0);
  ::close(socket.fd);
  return socket.port;
}

// The median seconds of an all-reduce of `small` and of `large` float32 values, alternated so
// that a busy moment slows both alike, after a warm-up (every rank runs the same sequence, so
// each call starts within one collective of the others).
std::pair<double, double> timed_all_reduces(Communicator& communicator, std::int64_t small,
                                            std::int64_t large) {
  std::vector<double> at_small;
  std::vector<double> at_large;
  for (int repetition = 0; repetition < kWarmUp + kTimed; ++repetition) {
    for (const std::int64_t elements : {small, large}) {
      std::vector<at::Tensor> tensors{at::ones({elements})};
      const auto start = std::chrono::steady_clock::now();
      communicator.world()->allreduce(tensors)->wait();
      if (repetition < kWarmUp) continue;
      (elements == small ? at_small : at_large)
          .push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  return {median(at_small), median(at_large)};
}

fs::path entry_file(const fs::path& folder, const std::string& plugin, int ranks) {
  return folder / (host_name() + "-" + plugin + "-" + std::to_string(ranks) + ".txt");
}

}  // namespace

fs::path link_cache_folder() {
  // Beside the peak FLOP/s probes: the same cache root.
  return peak_cache_folder().parent_path() / "links";
}

LinkCost measure_link(const Registry& registry, const std::string& plugin, int ranks) {
  if (ranks < 2) throw Error("a link needs at least 2 ranks, not " + std::to_string(ranks));
  // LibTorch's intra-op workers spin for a while after the last parallel region (a probe's
  // compute): let them settle so that they do not take the cores the ranks' threads need.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int port = free_port();
  std::vector<std::shared_ptr<Communicator>> communicators;
  for (int r = 0; r < ranks; ++r) {
    communicators.push_back(
        registry.create<Communicator>(plugin, Config({}, "comm"), BuildContext{}));
  }
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(ranks));
  double small = 0;
  double large = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        Rendezvous meet;
        meet.rank = meet.local_rank = r;
        meet.world_size = meet.local_world_size = ranks;
        meet.master_port = port;
        meet.timeout = std::chrono::seconds(60);
        Communicator& communicator = *communicators[static_cast<std::size_t>(r)];
        communicator.connect(meet, c10::Device(c10::kCPU));
        const auto [at_small, at_large] =
            timed_all_reduces(communicator, kSmallElements, kLargeElements);
        if (r == 0) {
          small = at_small;
          large = at_large;
        }
      } catch (...) {
        failures[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  // A ring all-reduce moves 2 (n-1)/n of its tensor per rank.
  const double share = 2.0 * (ranks - 1) / ranks;
  const double moved = share * 4.0 * static_cast<double>(kLargeElements - kSmallElements);
  LinkCost cost;
  cost.ranks = ranks;
  cost.seconds_per_byte = (large - small) / moved;
  if (!(cost.seconds_per_byte > 0)) {
    // Noise hid the difference: the large tensor's time alone bounds the cost per byte.
    cost.seconds_per_byte = large / (share * 4.0 * static_cast<double>(kLargeElements));
  }
  cost.latency_seconds =
      std::max(0.0, small - cost.seconds_per_byte * share * 4.0 * kSmallElements);
  return cost;
}

LinkCost cached_or_measured_link(const Registry& registry, const std::string& plugin, int ranks,
                                 const fs::path& folder,
                                 const std::function<void(const std::string&)>& warn) {
  const fs::path file = entry_file(folder, plugin, ranks);
  LinkCost cost;
  if (std::ifstream in(file);
      in && in >> cost.latency_seconds >> cost.seconds_per_byte && cost.seconds_per_byte > 0) {
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
    out << cost.latency_seconds << " " << cost.seconds_per_byte << "\n";
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

}  // namespace trainyard
