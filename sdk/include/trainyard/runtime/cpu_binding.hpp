#pragma once
// Binding each rank of a machine to its own CPUs. Ranks that share every CPU of a machine let
// the scheduler move their compute threads between cores and run one rank's communication
// threads on another rank's core, where they preempt its compute; a rank kept on its own cores
// keeps its caches warm and preempts only itself.

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

// "0-3,6": CPU numbers with consecutive runs folded.
std::string describe_cpus(const std::vector<int>& cpus);

}  // namespace trainyard
