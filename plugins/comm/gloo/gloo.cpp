// Collectives on CPU tensors over c10d's ProcessGroupGloo (TCP between ranks).

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

#include "trainyard/c10d_communicator.hpp"
#include "trainyard/error.hpp"
#include "trainyard/plugin.hpp"

namespace trainyard {
namespace {

bool is_loopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

class Gloo final : public C10dCommunicator {
 public:
  explicit Gloo(const Config& options) : threads_(options.get_int("threads")) {
    if (threads_ < 1) options.fail("threads", "must be >= 1");
  }

 protected:
  c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size) override {
    auto options = c10d::ProcessGroupGloo::Options::create(rendezvous().timeout);
    options->devices.push_back(transport_device());
    options->threads = static_cast<int>(threads_);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  }

 private:
  // Peers connect to the address the transport binds: loopback when the job is on this machine,
  // else the interface GLOO_SOCKET_IFNAME names, else the address this host's name resolves to.
  std::shared_ptr<::gloo::transport::Device> transport_device() {
    if (device_) return device_;
    if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
      device_ = c10d::ProcessGroupGloo::createDeviceForInterface(interface);
    } else if (is_loopback(rendezvous().master_addr)) {
      device_ = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    } else {
      device_ = c10d::ProcessGroupGloo::createDefaultDevice();
    }
    return device_;
  }

  std::int64_t threads_;
  std::shared_ptr<::gloo::transport::Device> device_;
};

void register_components(Registry& registry) {
  registry.add<Communicator>(
      "gloo", {option("threads", 2, "Gloo worker threads per process group")},
      "c10d ProcessGroupGloo: CPU collectives over TCP",
      [](const Config& options, const BuildContext&) { return std::make_unique<Gloo>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("gloo", "1.0.0", trainyard::register_components)
