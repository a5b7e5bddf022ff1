// The `sim` communication plugin: c10d process groups over sim tensors, carried between processes
// by Gloo's TCP transport (sim memory is host memory, so no staging copy is needed).

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "sim_process_group.hpp"
#include "trainyard/parallel/c10d_communicator.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

bool is_loopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

class SimComm final : public C10dCommunicator {
 public:
  std::vector<std::string> device_types() const override { return {"sim"}; }

 protected:
  c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size) override {
    auto options = c10d::ProcessGroupGloo::Options::create(rendezvous().timeout);
    options->devices.push_back(is_loopback(rendezvous().master_addr)
                                   ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    auto host = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
    return c10::make_intrusive<sim::SimProcessGroup>(std::move(host));
  }
};

void register_components(Registry& registry) {
  registry.add<Communicator>(
      "sim", {}, "collectives on sim tensors (Gloo transport)",
      [](const Config&, const BuildContext&) { return std::make_unique<SimComm>(); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("sim_comm", "1.0.0", trainyard::register_components)
