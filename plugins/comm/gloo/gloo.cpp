// Collectives on CPU tensors over c10d's ProcessGroupGloo (TCP between ranks).

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

#include "trainyard/parallel/c10d_communicator.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/support/libtorch_build.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

bool is_loopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

class Gloo final : public C10dCommunicator {
 public:
  explicit Gloo(const Config& options)
      : threads_(options.get_int("threads")), interface_(options.get_string("interface")) {
    if (threads_ < 1) options.fail("threads", "must be >= 1");
  }

  // CPU tensors first (the conformance suite and the host's default); c10d's Gloo also takes
  // CUDA tensors, copying them through the host.
  std::vector<std::string> device_types() const override { return {"cpu", "cuda"}; }
  std::vector<std::string> doctor_report() const override {
    return {std::string("Gloo ") + (libtorch_built_with("USE_GLOO") ? "yes" : "no") +
            " (LibTorch's c10d ProcessGroupGloo)"};
  }
  // A gloo pair of ranks serializes its sends and receives under one lock: with both ranks' cores
  // computing, a send that met the peer's send waited a scheduler tick (4-5 ms).
  bool one_backend_per_direction() const override { return true; }

 protected:
  c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size) override {
    auto options = c10d::ProcessGroupGloo::Options::create(rendezvous().timeout);
    options->devices.push_back(transport_device());
    options->threads = static_cast<int>(threads_);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  }

 private:
  // Peers connect to the address the transport binds: the recipe's interface, else the one
  // GLOO_SOCKET_IFNAME names, else loopback when the job is on this machine, else the address
  // this host's name resolves to.
  std::shared_ptr<::gloo::transport::Device> transport_device() {
    if (device_) return device_;
    std::string interface = interface_;
    if (const char* named = std::getenv("GLOO_SOCKET_IFNAME"); interface.empty() && named) {
      interface = named;
    }
    if (!interface.empty()) {
      try {
        device_ = c10d::ProcessGroupGloo::createDeviceForInterface(interface);
      } catch (const std::exception& error) {
        throw Error("comm 'gloo': cannot use network interface '" + interface +
                    "' ([comm] interface or GLOO_SOCKET_IFNAME): " + first_line(error.what()));
      }
    } else if (is_loopback(rendezvous().master_addr)) {
      device_ = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    } else {
      device_ = c10d::ProcessGroupGloo::createDefaultDevice();
    }
    return device_;
  }

  std::int64_t threads_;
  std::string interface_;
  std::shared_ptr<::gloo::transport::Device> device_;
};

void register_components(Registry& registry) {
  registry.add<Communicator>(
      "gloo",
      {option("threads", 2, "Gloo worker threads per process group").at_least(1),
       option("interface", "",
              "network interface the ranks connect through (e.g. eth0, ib0; default: "
              "GLOO_SOCKET_IFNAME, else loopback on one machine, else the host name's address)")},
      "c10d ProcessGroupGloo: CPU collectives over TCP",
      [](const Config& options, const BuildContext&) { return std::make_unique<Gloo>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("gloo", "1.0.0", trainyard::register_components)
