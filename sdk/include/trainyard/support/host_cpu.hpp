#pragma once
// The host CPU as a compute device: how busy this process keeps the cores it may use, and which
// dtypes the CPU computes natively (the instruction-set extensions that make them fast).

#include <c10/core/ScalarType.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace trainyard {

// The process's CPU time over the wall time of the cores it may run on (its affinity mask), one
// interval at a time: two threads busy on a two-core mask make 1.0, an idle process 0.
class ProcessCpuUsage {
 public:
  ProcessCpuUsage();  // the first interval starts here
  // The share since the previous call (or construction), and starts the next interval. Empty when
  // no wall time passed or the clocks cannot be read.
  std::optional<double> share_since_last();

 private:
  std::optional<double> cpu_seconds_;  // the process's CPU time at the interval's start
  std::chrono::steady_clock::time_point wall_start_;
};

// The process's CPU time (all threads, user and system), or empty when it cannot be read.
std::optional<double> process_cpu_seconds();

// The dtypes a CPU with these /proc/cpuinfo `flags` computes natively at full speed: float32,
// bfloat16 with AMX-BF16 or AVX512-BF16, float16 with AMX-FP16. (AVX512-FP16 arithmetic is not
// what oneDNN's half matmuls run on, so it does not count.)
std::vector<c10::ScalarType> cpu_fast_dtypes(const std::string& flags);

// This machine's first "flags" and "model name" lines of /proc/cpuinfo (empty when unreadable).
std::string host_cpu_flags();
std::string host_cpu_model_name();

}  // namespace trainyard
