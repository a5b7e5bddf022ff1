#include "trainyard/support/host_cpu.hpp"

#include <time.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

#include "trainyard/runtime/cpu_binding.hpp"

namespace trainyard {
namespace {

// The value of the first /proc/cpuinfo line whose key is `key`.
std::string cpuinfo_value(const std::string& key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(name.find_last_not_of(" \t") + 1);
    if (name != key) continue;
    const auto start = line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

}  // namespace

std::optional<double> process_cpu_seconds() {
  timespec now{};
  if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now) != 0) return std::nullopt;
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

ProcessCpuUsage::ProcessCpuUsage()
    : cpu_seconds_(process_cpu_seconds()), wall_start_(std::chrono::steady_clock::now()) {}

std::optional<double> ProcessCpuUsage::share_since_last() {
  const std::optional<double> cpu_now = process_cpu_seconds();
  const auto wall_now = std::chrono::steady_clock::now();
  const double wall_s = std::chrono::duration<double>(wall_now - wall_start_).count();
  std::optional<double> share;
  // The mask is read each time: the engine binds ranks to their cores after start-up.
  const auto cores = static_cast<double>(std::max<std::size_t>(1, allowed_cpus().size()));
  // At most every allowed core: the kernel adds another thread's run time to the process clock
  // when that thread is next accounted, so a window of a few milliseconds can receive time the
  // threads ran before it began.
  if (cpu_now && cpu_seconds_ && wall_s > 0) {
    share = std::min(1.0, (*cpu_now - *cpu_seconds_) / (wall_s * cores));
  }
  cpu_seconds_ = cpu_now;
  wall_start_ = wall_now;
  return share;
}

std::vector<c10::ScalarType> cpu_fast_dtypes(const std::string& flags) {
  std::istringstream words(flags);
  std::vector<std::string> present{std::istream_iterator<std::string>(words), {}};
  auto has = [&](const char* flag) {
    return std::find(present.begin(), present.end(), flag) != present.end();
  };
  std::vector<c10::ScalarType> fast{c10::kFloat};
  if (has("amx_bf16") || has("avx512_bf16")) fast.push_back(c10::kBFloat16);
  if (has("amx_fp16")) fast.push_back(c10::kHalf);
  return fast;
}

std::string host_cpu_flags() { return cpuinfo_value("flags"); }
std::string host_cpu_model_name() { return cpuinfo_value("model name"); }

}  // namespace trainyard
