// Collectives on CUDA tensors over c10d's ProcessGroupNCCL. Each rank drives its own GPU
// (cuda:LOCAL_RANK); a collective that does not complete within the recipe's timeout ends the
// process group with an error instead of waiting forever.

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/parallel/c10d_communicator.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/support/libtorch_build.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

// The recipe's NCCL settings and the environment variables NCCL reads them from when its first
// communicator starts (empty or 0: NCCL's own default, or what the environment already says).
struct NcclSetting {
  const char* option;
  const char* variable;
};
constexpr NcclSetting kSettings[] = {{"interface", "NCCL_SOCKET_IFNAME"},
                                     {"algo", "NCCL_ALGO"},
                                     {"proto", "NCCL_PROTO"},
                                     {"buffer_size", "NCCL_BUFFSIZE"},
                                     {"debug", "NCCL_DEBUG"}};

class Nccl final : public C10dCommunicator {
 public:
  explicit Nccl(const Config& options) : high_priority_(options.get_bool("high_priority_stream")) {
    for (const auto& setting : kSettings) {
      std::string value = std::string(setting.option) == "buffer_size"
                              ? std::to_string(options.get_int(setting.option))
                              : options.get_string(setting.option);
      if (value.empty() || value == "0") continue;
      environment_.emplace_back(setting.variable, std::move(value));
    }
  }

  std::vector<std::string> device_types() const override { return {"cuda"}; }
  std::vector<std::string> doctor_report() const override {
    return {std::string("NCCL ") + (libtorch_built_with("USE_NCCL") ? "yes" : "no") +
            " (LibTorch's c10d ProcessGroupNCCL)"};
  }

  void connect(const Rendezvous& rendezvous, const c10::Device& device) override {
    // The recipe wins over the environment; NCCL reads it when the first communicator starts.
    for (const auto& [variable, value] : environment_) ::setenv(variable.c_str(), value.c_str(), 1);
    if (!device.is_cuda()) {
      throw Error("comm 'nccl' needs a CUDA device (run.device = \"cuda\"); this run uses " +
                  device.str() + " (use comm 'gloo' on the CPU)");
    }
    if (c10::cuda::device_count() < 1) throw Error("comm 'nccl': no CUDA device is visible");
    c10::cuda::set_device(device.has_index() ? device.index() : 0);
    C10dCommunicator::connect(rendezvous, device);
  }

 protected:
  c10::intrusive_ptr<c10d::Backend> create_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size) override {
    auto options = c10d::ProcessGroupNCCL::Options::create(high_priority_);
    options->timeout = rendezvous().timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  }

 private:
  bool high_priority_;
  std::vector<std::pair<std::string, std::string>> environment_;
};

void register_components(Registry& registry) {
  registry.add<Communicator>(
      "nccl",
      {option("high_priority_stream", false, "run collectives on a high-priority stream"),
       option("interface", "", "network interface for NCCL's sockets (NCCL_SOCKET_IFNAME)"),
       option("algo", "", "collective algorithms, e.g. Ring, Tree (NCCL_ALGO)"),
       option("proto", "", "protocols, e.g. Simple, LL, LL128 (NCCL_PROTO)"),
       option("buffer_size", 0, "bytes of each channel's buffer (NCCL_BUFFSIZE; 0: NCCL's)")
           .at_least(0),
       option("debug", "", "NCCL's log level (NCCL_DEBUG)")
           .one_of({"", "VERSION", "WARN", "INFO", "TRACE"})},
      "c10d ProcessGroupNCCL: CUDA collectives (one GPU per rank)",
      [](const Config& options, const BuildContext&) { return std::make_unique<Nccl>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("nccl", "1.0.0", trainyard::register_components)
