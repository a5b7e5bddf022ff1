#include "distributed_runtime.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/cpu_binding.hpp"

namespace trainyard {

namespace {

at::Tensor on_device(const at::Tensor& host, const c10::Device& device) { return host.to(device); }

void all_reduce(Communicator& communicator, at::Tensor& tensor, c10d::ReduceOp::RedOpType op) {
  std::vector<at::Tensor> buffer{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  CollectiveWait wait;
  communicator.world()->allreduce(buffer, options)->wait();
  tensor = buffer[0];
}

}  // namespace

DistributedRuntime::DistributedRuntime(const RunOptions& run, const Config& parallel,
                                       bool single_process)
    : stop_signals_(run.stop_signals) {
  if (!single_process) rendezvous_ = rendezvous_from_environment();
  if (rendezvous_ && rendezvous_->world_size <= 1) rendezvous_.reset();
  // Checked before anything connects, so every rank refuses a layout alike and none waits.
  layout_ = MeshLayout::resolve(mesh_request(parallel), rendezvous_ ? rendezvous_->world_size : 1);

  const std::vector<int> allowed = allowed_cpus();
  cores_ = static_cast<unsigned>(std::max<std::size_t>(1, allowed.size()));
  std::int64_t threads = run.threads;
  if (threads == 0 && local_ranks() > 1) {
    // Ranks on one machine share its cores.
    threads = std::max(1, static_cast<int>(cores_) / local_ranks());
  }
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));
  bound_cpus_ =
      cpus_for_rank(run.cpu_binding, allowed, local_rank().value_or(0), local_ranks(),
                    threads > 0 ? static_cast<int>(threads) : static_cast<int>(allowed.size()));
  bind_process_to_cpus(bound_cpus_);
  if (!bound_cpus_.empty()) unbound_cpus_ = allowed;
}

DistributedRuntime::~DistributedRuntime() = default;

std::optional<int> DistributedRuntime::local_rank() const {
  if (!rendezvous_) return std::nullopt;
  return rendezvous_->local_rank;
}

void DistributedRuntime::connect(const Recipe& recipe, const Registry& registry,
                                 const DeviceBackend& backend, const c10::Device& device,
                                 BuildContext& build,
                                 const std::function<void(const std::string&)>& log) {
  device_ = device;
  if (!rendezvous_) {
    mesh_ = std::make_shared<ProcessMesh>();
    build.mesh = mesh_;
    return;
  }
  Rendezvous& meet = *rendezvous_;
  const Config comm = recipe.section("comm");
  // An absent [comm] is not filled in by the recipe's resolution.
  meet.timeout = std::chrono::seconds(comm.has("timeout_s") ? comm.get_int("timeout_s") : 300);
  const std::string device_type = c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  const std::string plugin = comm.has("plugin") ? comm.get_string("plugin") : backend.default_comm();
  if (plugin.empty()) {
    throw Error("the " + device_type + " device backend names no default communicator; name one "
                "in [comm] plugin for a multi-process run");
  }
  communicator_ =
      registry.create<Communicator>(plugin, plugin_options(comm, comm_options()), build);
  const std::vector<std::string> served = communicator_->device_types();
  if (std::find(served.begin(), served.end(), device_type) == served.end()) {
    std::string types;
    for (const auto& type : served) types += (types.empty() ? "" : ", ") + type;
    throw Error("comm '" + plugin + "' serves " + types + " devices, but this run uses " +
                device.str() + " (run.device); name a comm plugin for " + device_type +
                " in [comm] plugin, or leave it out for the device's default");
  }
  {
    // The communicator's threads (and the failure monitor's) move messages: they run on any free
    // core, not on the compute cores the rank is bound to (cpu_binding.hpp).
    const ThreadsStartedUnbound unbound(unbound_cpus_);
    connect_communicator(meet, device, comm, build);
  }
  log("trainyard: rank " + std::to_string(meet.rank) + " of " + std::to_string(meet.world_size) +
      " (local " + std::to_string(meet.local_rank) + " of " +
      std::to_string(meet.local_world_size) + "), store " + meet.master_addr + ":" +
      std::to_string(meet.master_port) + ", comm " + plugin + ", " +
      std::to_string(at::get_num_threads()) + " threads on " + device.str() +
      (bound_cpus_.empty() ? "" : ", bound to cpus " + describe_cpus(allowed_cpus())) + ", mesh " +
      layout_.describe());
  build.rank = meet.rank;
  build.world_size = meet.world_size;
  build.communicator = communicator_;
  build.mesh = mesh_;
}

// Connects the communicator, starts the failure monitor, makes the mesh's groups and records
// the collectives' flights.
void DistributedRuntime::connect_communicator(const Rendezvous& meet, const c10::Device& device,
                                              const Config& comm, const BuildContext& build) {
  communicator_->connect(meet, device);
  const char* agent = std::getenv(kAgentStoreVariable);
  const bool hosts_store = meet.rank == 0 && !(agent && std::string(agent) == "True");
  monitor_ = std::make_unique<FailureMonitor>(communicator_->store(), meet.rank, meet.world_size,
                                              meet.timeout, hosts_store);
  naming_failures([&] { mesh_ = std::make_shared<ProcessMesh>(layout_, *communicator_); });
  if (comm.has("emulated_bandwidth_mb_s")) {
    mesh_->collectives().emulate_link(comm.get_float("emulated_bandwidth_mb_s") * 1e6);
  }
  mesh_->collectives().check_collectives(comm.has("debug") && comm.get_string("debug") == "detail");
  record_flights(comm.has("flight_recorder") ? comm.get_int("flight_recorder") : 2000,
                 build.output_dir);
}

DataParallelPlace DistributedRuntime::data_parallel_place() const {
  return {mesh_->rank(MeshGroup::kData), mesh_->size(MeshGroup::kData)};
}

void DistributedRuntime::record_flights(std::int64_t capacity,
                                        const std::filesystem::path& output_dir) {
  CollectiveCounter& counter = mesh_->collectives();
  counter.record_flights(static_cast<std::size_t>(capacity));
  std::shared_ptr<FlightRecorder> recorder = counter.recorder();
  if (!recorder) return;
  const std::filesystem::path file =
      output_dir / "flight" / ("rank" + std::to_string(rank()) + ".json");
  const int rank = this->rank();
  const int world = world_size();
  set_flight_record_dump([recorder, file, rank, world](const std::string& reason) {
    write_flight_record(file, *recorder, rank, world, reason);
    std::cerr << "trainyard: rank " << rank << ": flight record written to " << file.string()
              << " (" << reason << ")" << std::endl;
  });
  dump_flight_record_on_terminate();
  // SIGUSR2 may be one of the run's stop signals instead.
  if (std::find(stop_signals_.begin(), stop_signals_.end(), SIGUSR2) == stop_signals_.end()) {
    dump_flight_record_on_sigusr2();
  }
}

void DistributedRuntime::before_step(std::int64_t step) {
  if (!monitor_) return;
  test_failure_hook(rank(), step);
  monitor_->set_step(step);
  if (const auto recorder = mesh_->collectives().recorder()) recorder->set_step(step);
}

void DistributedRuntime::finish() {
  if (!monitor_) return;
  finish_stop_agreement();
  monitor_->finish();
  communicator_->barrier();
}

std::vector<double> DistributedRuntime::sum(std::vector<double> values) const {
  if (!communicator_ || values.empty()) return values;
  at::Tensor buffer = on_device(at::tensor(values, at::TensorOptions(at::kDouble)), device_);
  all_reduce(*communicator_, buffer, c10d::ReduceOp::SUM);
  at::Tensor reduced = buffer.cpu();
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = reduced[static_cast<std::int64_t>(i)].item<double>();
  }
  return values;
}

int DistributedRuntime::finish_stop_agreement() {
  if (!stop_agreement_) return 0;
  {
    CollectiveWait wait;
    stop_agreement_->wait();
  }
  stop_agreement_.reset();
  return stop_flag_.front().cpu().item<int>();
}

int DistributedRuntime::agreed_stop_signal(int received) {
  if (!communicator_) return received;
  const int agreed = finish_stop_agreement();
  if (agreed != 0) return agreed;
  // One flag tensor for the whole run: the step allocates nothing for it.
  if (stop_flag_.empty()) {
    stop_flag_ = {on_device(at::zeros({1}, at::TensorOptions(at::kInt)), device_)};
  }
  stop_flag_.front().fill_(received);
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  stop_agreement_ = communicator_->world()->allreduce(stop_flag_, options);
  return 0;
}

std::int64_t DistributedRuntime::max(std::int64_t value) const {
  if (!communicator_) return value;
  at::Tensor buffer = on_device(at::tensor({value}, at::TensorOptions(at::kLong)), device_);
  all_reduce(*communicator_, buffer, c10d::ReduceOp::MAX);
  return buffer.cpu().item<std::int64_t>();
}

std::function<bool(bool)> DistributedRuntime::agreement() const {
  if (!communicator_) return {};
  // A MIN all-reduce of a flag on the world group.
  std::shared_ptr<Communicator> communicator = communicator_;
  const c10::Device device = device_;
  return [communicator, device](bool ok) {
    at::Tensor flag = on_device(at::full({1}, ok ? 1 : 0, at::TensorOptions(at::kInt)), device);
    all_reduce(*communicator, flag, c10d::ReduceOp::MIN);
    return flag.item<int>() == 1;
  };
}

}  // namespace trainyard
