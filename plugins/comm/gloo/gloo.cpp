// Collectives on CPU tensors over c10d's ProcessGroupGloo (TCP between ranks), with the
// all-reduces, broadcasts and point-to-point messages of ranks that share a host through shared
// memory.

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <cstdlib>

#include "shared_memory_allreduce.hpp"
#include "shared_memory_mailbox.hpp"
#include "shared_memory_segment.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/parallel/c10d_communicator.hpp"
#include "trainyard/support/libtorch_build.hpp"

namespace trainyard {
namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

bool is_loopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

// The group's store, once this rank has named its host and process in it (announce_host).
const c10::intrusive_ptr<c10d::Store>& with_host_announced(
    const c10::intrusive_ptr<c10d::Store>& store, int rank) {
  announce_host(*store, rank);
  return store;
}

// Gloo's process group whose all-reduces and broadcasts of CPU tensors go through shared memory
// when every rank of the group is on this host (the first one asks the peers, through the
// group's store, whether they can map a segment of this one's, and all the group's collectives
// stay on TCP when any cannot), and whose sends and receives between two ranks of one host go
// through a mailbox of the sender's.
class GlooWithSharedMemory final : public c10d::ProcessGroupGloo {
 public:
  GlooWithSharedMemory(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       c10::intrusive_ptr<Options> options, std::int64_t staging_bytes,
                       std::chrono::microseconds spin)
      : ProcessGroupGloo(with_host_announced(store, rank), rank, size, options),
        store_(store),
        staging_bytes_(staging_bytes),
        timeout_(options->timeout),
        spin_(spin) {}

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& options) override {
    if (SharedMemoryAllreduce::handles(tensors, options) && shared() && !shared()->over_tcp()) {
      return shared()->allreduce(tensors.front(), options.reduceOp);
    }
    return ProcessGroupGloo::allreduce(tensors, options);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& options) override {
    if (SharedMemoryAllreduce::handles(tensors, options) && shared() && !shared()->over_tcp()) {
      return shared()->broadcast(tensors.front(), static_cast<int>(options.rootRank));
    }
    return ProcessGroupGloo::broadcast(tensors, options);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int peer,
                                      int tag) override {
    if (SharedMemoryMailboxes::handles(tensors) && mailboxes()) {
      return mailboxes()->send(tensors.front(), peer, tag);
    }
    return ProcessGroupGloo::send(tensors, peer, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int peer,
                                      int tag) override {
    if (SharedMemoryMailboxes::handles(tensors) && mailboxes()) {
      return mailboxes()->recv(tensors.front(), peer, tag);
    }
    return ProcessGroupGloo::recv(tensors, peer, tag);
  }

 private:
  // Made at the first message: setting up a mailbox takes only its two ranks.
  SharedMemoryMailboxes* mailboxes() {
    if (staging_bytes_ == 0 || getSize() == 1) return nullptr;
    if (!mailboxes_) {
      SharedMemoryMailboxes::Tcp tcp{[this](std::vector<at::Tensor>& tensors, int peer, int tag) {
                                       return ProcessGroupGloo::send(tensors, peer, tag);
                                     },
                                     [this](std::vector<at::Tensor>& tensors, int peer, int tag) {
                                       return ProcessGroupGloo::recv(tensors, peer, tag);
                                     }};
      mailboxes_ = std::make_unique<SharedMemoryMailboxes>(store_, getRank(), staging_bytes_,
                                                           timeout_, spin_, std::move(tcp));
    }
    return mailboxes_.get();
  }

  // The group's shared memory, made at its first collective that can use it (every rank issues
  // the same ones in the same order; the ranks' answers are collected as it progresses); null
  // when turned off. Where the ranks cannot share memory its collectives go to Gloo's own.
  SharedMemoryAllreduce* shared() {
    if (staging_bytes_ == 0 || getSize() == 1) return nullptr;
    if (!shared_) {
      bool all_on_this_host = true;
      for (int peer = 0; peer < getSize(); ++peer) {
        if (peer != getRank()) all_on_this_host &= announced_rank(*store_, peer).on_this_host;
      }
      SharedMemoryAllreduce::Tcp tcp{[this](at::Tensor& tensor, c10d::ReduceOp::RedOpType op) {
                                       std::vector<at::Tensor> tensors{tensor};
                                       c10d::AllreduceOptions options;
                                       options.reduceOp = op;
                                       return ProcessGroupGloo::allreduce(tensors, options);
                                     },
                                     [this](at::Tensor& tensor, int root) {
                                       std::vector<at::Tensor> tensors{tensor};
                                       c10d::BroadcastOptions options;
                                       options.rootRank = root;
                                       return ProcessGroupGloo::broadcast(tensors, options);
                                     }};
      shared_ = std::make_unique<SharedMemoryAllreduce>(
          store_, getRank(), getSize(), all_on_this_host, staging_bytes_, timeout_, std::move(tcp));
    }
    return shared_.get();
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::int64_t staging_bytes_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_;
  std::unique_ptr<SharedMemoryAllreduce> shared_;
  std::unique_ptr<SharedMemoryMailboxes> mailboxes_;
};

class Gloo final : public C10dCommunicator {
 public:
  explicit Gloo(const Config& options)
      : threads_(options.get_int("threads")),
        interface_(options.get_string("interface")),
        shared_memory_mb_(options.get_int("shared_memory_mb")) {
    if (threads_ < 1) options.fail("threads", "must be >= 1");
    if (shared_memory_mb_ < 0) options.fail("shared_memory_mb", "must be >= 0");
  }

  // CPU tensors first (the conformance suite and the host's default); c10d's Gloo also takes
  // CUDA tensors, copying them through the host.
  std::vector<std::string> device_types() const override { return {"cpu", "cuda"}; }
  std::vector<std::string> doctor_report() const override {
    return {std::string("Gloo ") + (libtorch_built_with("USE_GLOO") ? "yes" : "no") +
                " (LibTorch's c10d ProcessGroupGloo)",
            "all-reduces, broadcasts, sends and receives among ranks of one host: " +
                (shared_memory_mb_ > 0 ? "shared memory (" + std::to_string(shared_memory_mb_) +
                                             " MiB staged per rank)"
                                       : std::string("TCP (shared_memory_mb = 0)"))};
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
    return c10::make_intrusive<GlooWithSharedMemory>(store, rank, size, options,
                                                     shared_memory_mb_ << 20, message_spin());
  }

 private:
  // How long a rank waiting for a message spins before it sleeps: long where each of this
  // host's ranks has a core, briefly where they share cores (the sender may need this one's).
  std::chrono::microseconds message_spin() const {
    return std::chrono::microseconds(rendezvous().local_world_size <= usable_cores() ? 1000 : 20);
  }

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
  std::int64_t shared_memory_mb_;
  std::shared_ptr<::gloo::transport::Device> device_;
};

void register_components(Registry& registry) {
  registry.add<Communicator>(
      "gloo",
      {option("threads", 2, "Gloo worker threads per process group").at_least(1),
       option("interface", "",
              "network interface the ranks connect through (e.g. eth0, ib0; default: "
              "GLOO_SOCKET_IFNAME, else loopback on one machine, else the host name's address)"),
       option("shared_memory_mb", 8,
              "MiB each rank stages its all-reduces in, and each mailbox of messages between two "
              "ranks holds, where ranks share a host (larger all-reduces go in pieces, messages "
              "that do not fit over TCP); 0: everything over TCP")
           .at_least(0)},
      "c10d ProcessGroupGloo: CPU collectives over TCP",
      [](const Config& options, const BuildContext&) { return std::make_unique<Gloo>(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("gloo", "1.0.0", trainyard::register_components)
