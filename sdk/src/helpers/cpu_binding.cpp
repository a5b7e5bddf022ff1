#include "trainyard/runtime/cpu_binding.hpp"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "trainyard/api/error.hpp"

namespace trainyard {

CpuBinding parse_cpu_binding(const std::string& text, const std::string& where) {
  if (text == "auto") return CpuBinding::Automatic;
  if (text == "cores") return CpuBinding::Cores;
  if (text == "none") return CpuBinding::None;
  throw Error(where + ": expected auto, cores or none, got '" + text + "'");
}

std::vector<int> cpus_for_rank(CpuBinding binding, const std::vector<int>& allowed, int local_rank,
                               int local_world_size, int threads) {
  if (binding == CpuBinding::None || threads < 1) return {};
  const auto needed =
      static_cast<std::size_t>(local_world_size) * static_cast<std::size_t>(threads);
  if (binding == CpuBinding::Automatic) {
    // Binding one job's ranks is safe when the job fills the machine: another job beside it
    // would oversubscribe the cores bound or not. With fewer ranks than that, unbound ranks let
    // the scheduler spread several jobs; with one rank there is nothing to keep apart.
    if (local_world_size < 2 || needed != allowed.size()) return {};
  } else if (needed > allowed.size()) {
    throw Error("run.cpu_binding = \"cores\" needs " + std::to_string(needed) + " CPUs (" +
                std::to_string(local_world_size) + " local ranks x " + std::to_string(threads) +
                " threads) but this process may use " + std::to_string(allowed.size()));
  }
  const auto first = static_cast<std::size_t>(local_rank) * static_cast<std::size_t>(threads);
  return std::vector<int>(
      allowed.begin() + static_cast<std::ptrdiff_t>(first),
      allowed.begin() + static_cast<std::ptrdiff_t>(first + static_cast<std::size_t>(threads)));
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
  }
  return out;
}

namespace {

cpu_set_t set_of(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  return set;
}

}  // namespace

void bind_process_to_cpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  const cpu_set_t set = set_of(cpus);
  // A thread's mask is its own: threads started from here on inherit the caller's, and those
  // already running (LibTorch's and the loader's pools) are set one by one.
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    const auto tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    if (sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH) {
      throw Error("cannot bind to CPUs " + describe_cpus(cpus) + ": " + std::strerror(errno));
    }
  }
}

ThreadsStartedUnbound::ThreadsStartedUnbound(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  bound_ = allowed_cpus();
  const cpu_set_t set = set_of(cpus);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) bound_.clear();
}

ThreadsStartedUnbound::~ThreadsStartedUnbound() {
  if (bound_.empty()) return;
  const cpu_set_t set = set_of(bound_);
  sched_setaffinity(0, sizeof(set), &set);
}

std::string describe_cpus(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t end = i;
    while (end + 1 < cpus.size() && cpus[end + 1] == cpus[end] + 1) ++end;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (end > i) out += "-" + std::to_string(cpus[end]);
    i = end + 1;
  }
  return out;
}

}  // namespace trainyard
