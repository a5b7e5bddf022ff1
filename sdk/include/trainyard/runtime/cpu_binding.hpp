#pragma once
// Binding each rank of a machine to its own CPUs. Ranks that share every CPU of a machine let
// the scheduler move their compute threads between cores; a rank whose compute is kept on its
// own cores keeps its caches warm. Its communication threads are not bound (ThreadsStartedUnbound):
// a collective's transfer runs whenever a message arrives, on whichever core is free then, rather
// than waiting for the scheduler to take its own rank's core from the compute (on 2 ranks of 2
// cores, a bound rank's small all-reduce took 5 ms as often as not, against 1 ms unbound).

#include <string>
#include <vector>

namespace trainyard {

enum class CpuBinding {
  Automatic,  // bind when the machine's ranks, with their threads, fill exactly its CPUs
  Cores,      // always bind (an error when there are not enough CPUs)
  None,
};

// "auto", "cores" or "none"; throws Error naming `where` for anything else.
CpuBinding parse_cpu_binding(const std::string& text, const std::string& where);

// The CPUs for local rank `local_rank` of `local_world_size`, `threads` each, taken in order
// from `allowed` (the CPUs this process may use); empty when not binding. Throws Error when
// `binding` is Cores and `allowed` has too few CPUs.
std::vector<int> cpus_for_rank(CpuBinding binding, const std::vector<int>& allowed, int local_rank,
                               int local_world_size, int threads);

// The CPUs this process may run on (its affinity mask).
std::vector<int> allowed_cpus();

// Restricts every thread of this process, and the threads it starts later, to `cpus`.
void bind_process_to_cpus(const std::vector<int>& cpus);

// While one lives, the threads the calling thread starts may run on `cpus` (the CPUs the process
// could use before bind_process_to_cpus: a communicator's threads, made as it connects); the
// calling thread's own binding is restored when it ends. Empty `cpus`: nothing changes.
class ThreadsStartedUnbound {
 public:
  explicit ThreadsStartedUnbound(const std::vector<int>& cpus);
  ~ThreadsStartedUnbound();
  ThreadsStartedUnbound(const ThreadsStartedUnbound&) = delete;
  ThreadsStartedUnbound& operator=(const ThreadsStartedUnbound&) = delete;

 private:
  std::vector<int> bound_;  // the calling thread's CPUs to restore (empty: nothing to restore)
};

// "0-3,6": CPU numbers with consecutive runs folded.
std::string describe_cpus(const std::vector<int>& cpus);

}  // namespace trainyard
