// Collectives on CUDA tensors over c10d's ProcessGroupNCCL. Each rank drives its own GPU
// (cuda:LOCAL_RANK); a collective that does not complete within the recipe's timeout ends the
// process group with an error instead of waiting forever.

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "trainyard/c10d_communicator.hpp"
#include "trainyard/error.hpp"
#include "trainyard/plugin.hpp"

namespace trainyard {
namespace {

class Nccl final : public C10dCommunicator {
 public:
  explicit Nccl(const Config& options) : high_priority_(options.get_bool("high_priority_stream")) {}

  void connect(const Rendezvous& rendezvous, const c10::Device& device) override {
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
};

void register_components(Registry& registry) {
  registry.add<Communicator>(
      "nccl", {option("high_priority_stream", false, "run collectives on a high-priority stream")},
      "c10d ProcessGroupNCCL: CUDA collectives (one GPU per rank)",
      [](const Config& options, const BuildContext&) { return std::make_unique<Nccl>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("nccl", "1.0.0", trainyard::register_components)
