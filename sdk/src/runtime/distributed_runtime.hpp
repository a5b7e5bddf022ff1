#pragma once
// The multi-process side of a run: where this rank meets the others, its share of the machine's
// CPUs, the communicator, the failure monitor and the device mesh, and the few collectives the
// engine makes itself. A single process has a mesh of one rank and collectives that return
// their input.

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "run_options.hpp"
#include "stop_signals.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

class DistributedRuntime {
 public:
  // Reads the rendezvous from the environment and resolves the recipe's [parallel] layout
  // against the world size (an Error with the reason when they disagree), then sets this rank's
  // intra-op threads and binds it to its CPUs: before the communicator and the loader start
  // their threads, which inherit the binding.
  // `single_process`: the launcher's variables are ignored (the run is this process alone).
  DistributedRuntime(const RunOptions& run, const Config& parallel, bool single_process = false);
  ~DistributedRuntime();
  DistributedRuntime(const DistributedRuntime&) = delete;
  DistributedRuntime& operator=(const DistributedRuntime&) = delete;

  // In a multi-process run: connects the communicator ([comm], by default the one `backend`
  // names; it must serve `device`'s type), starts the failure monitor,
  // builds the mesh's groups (collective) and logs the startup line. Sets build's rank, world
  // size, communicator and mesh; a single process gets the mesh of one rank.
  void connect(const Recipe& recipe, const Registry& registry, const DeviceBackend& backend,
               const c10::Device& device, BuildContext& build,
               const std::function<void(const std::string&)>& log);

  bool multi_process() const { return rendezvous_.has_value(); }
  int rank() const { return rendezvous_ ? rendezvous_->rank : 0; }
  int world_size() const { return layout_.world_size(); }
  // This rank's place among the machine's ranks; nullopt in a single process.
  std::optional<int> local_rank() const;
  int local_ranks() const { return rendezvous_ ? rendezvous_->local_world_size : 1; }
  // The CPUs the process may use (counted before binding), at least 1.
  unsigned cores() const { return cores_; }
  const std::shared_ptr<Communicator>& communicator() const { return communicator_; }
  // Set by connect().
  const std::shared_ptr<ProcessMesh>& mesh() const { return mesh_; }
  // The slice of the data this rank reads: its place in the mesh's data-parallel group.
  DataParallelPlace data_parallel_place() const;

  // Runs `body`; in a multi-process run an exception leaving it becomes an Error naming the rank
  // that failed (this one's failure is recorded for the others).
  template <typename Body>
  decltype(auto) naming_failures(Body&& body) {
    if (!monitor_) return body();
    try {
      return body();
    } catch (...) {
      // Once a rank fails the launcher sends the others SIGTERM: a rank that has failed too
      // finishes its report (the rank it names, its flight record) first, within the launcher's
      // grace period, instead of ending silently.
      const StopSignals held_while_reporting(stop_signals_);
      rethrow_naming_failed_rank(*monitor_, rank());
    }
  }
  // Before each optimizer step: the failure tests' hook, and the step the heartbeat reports.
  void before_step(std::int64_t step);
  // The run ended on this rank. Rank 0 may host the store, so every rank leaves together, after
  // the others stop watching it.
  void finish();

  // Collectives over the world, called by every rank alike; in a single process they return
  // their input.
  std::vector<double> sum(std::vector<double> values) const;
  std::int64_t max(std::int64_t value) const;
  // Whether `ok` holds on every rank; null in a single process, which needs no agreement.
  std::function<bool(bool ok)> agreement() const;

  // After each optimizer step, with the stop signal this rank received (0: none): the signal the
  // ranks agree to stop on, or 0. Every rank gets the same answer at the same step, one step
  // after the signal arrived: the agreement (a MAX all-reduce) runs in the background during
  // the next step instead of holding this one. A single process stops at once.
  int agreed_stop_signal(int received);

 private:
  // Waits for the agreement in flight, if any, and returns its result.
  int finish_stop_agreement();
  // [comm] flight_recorder: the mesh's groups record into a ring of `capacity` collectives,
  // dumped to <output_dir>/flight/rank<k>.json on a failure or SIGUSR2.
  void record_flights(std::int64_t capacity, const std::filesystem::path& output_dir);
  // connect's part that starts threads talking to the other ranks.
  void connect_communicator(const Rendezvous& meet, const c10::Device& device, const Config& comm,
                            const BuildContext& build);

  std::vector<int> stop_signals_;
  std::optional<Rendezvous> rendezvous_;
  MeshLayout layout_;
  unsigned cores_ = 1;
  std::vector<int> bound_cpus_;
  // The CPUs the process could use before it was bound (empty when it is not bound): where the
  // threads that talk to the other ranks run.
  std::vector<int> unbound_cpus_;
  c10::Device device_ = c10::Device(c10::kCPU);
  std::shared_ptr<Communicator> communicator_;
  std::unique_ptr<FailureMonitor> monitor_;
  std::shared_ptr<ProcessMesh> mesh_;
  c10::intrusive_ptr<c10d::Work> stop_agreement_;
  std::vector<at::Tensor> stop_flag_;
};

}  // namespace trainyard
