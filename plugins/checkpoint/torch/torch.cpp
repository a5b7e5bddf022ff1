// Checkpoint files in LibTorch's archive format (readable from Python with torch.jit.load).
//
// Written as torch::serialize::OutputArchive writes them (a module holding each entry as an
// attribute, exported as a zip container), with two differences that keep the write at disk
// speed: the container streams into the checkpoint file, each tensor's storage written straight
// from its memory, and its records carry no zip CRC-32 (LibTorch's readers do not check it; the
// checkpoint's manifest holds a checksum of the whole file, verified before a load).

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/serialize/archive.h>
#include <c10/util/strides.h>

#include <exception>
#include <filesystem>
#include <unordered_set>

#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

constexpr const char* kMetadataPrefix = "__metadata__/";

// `tensor` on the host in memory of its own. The archive writes a tensor's whole storage, once
// for every entry that shares it, so a view into a larger tensor (a piece of a flat shard, which
// strategies hand over without a copy) or a second name of one tensor is copied out first: the
// file is the same whether its entries were views of the live state or copies of it.
at::Tensor own_storage(const at::Tensor& tensor, std::unordered_set<const void*>& storages) {
  at::Tensor host = tensor.detach().cpu();
  const bool alone = host.storage_offset() == 0 &&
                     host.strides() == c10::IntArrayRef(c10::contiguous_strides(host.sizes())) &&
                     host.storage().nbytes() == host.nbytes() &&
                     storages.insert(host.storage().unsafeGetStorageImpl()).second;
  return alone ? host : host.clone(at::MemoryFormat::Contiguous);
}

class TorchArchive final : public CheckpointBackend {
 public:
  std::string extension() const override { return ".pt"; }

  void write_to(CheckpointFileWriter& out, const StateDict& state) const override {
    torch::jit::Module archive("__torch__.Module", std::make_shared<torch::jit::CompilationUnit>());
    auto add = [&](const std::string& key, const c10::IValue& value) {
      archive.register_attribute(key, value.type(), value);
    };
    std::unordered_set<const void*> storages;
    for (const auto& [name, tensor] : state.tensors) {
      add(name, c10::IValue(own_storage(tensor, storages)));
    }
    for (const auto& [key, value] : state.metadata) add(kMetadataPrefix + key, c10::IValue(value));

    // The container calls its writer from C code, which an exception must not cross: a failed
    // write is reported as a short one, and its reason rethrown below.
    std::exception_ptr write_error;
    caffe2::serialize::PyTorchStreamWriter container(
        [&out, &write_error](const void* data, std::size_t bytes) -> std::size_t {
          if (write_error) return 0;
          try {
            out.append(data, bytes);
            return bytes;
          } catch (...) {
            write_error = std::current_exception();
            return 0;
          }
        },
        /*compute_crc32=*/false);
    try {
      torch::jit::ScriptModuleSerializer serializer(container);
      serializer.serialize(archive, {}, /*bytecode_format=*/false,
                           /*save_mobile_debug_info=*/false);
      container.writeEndOfFile();
    } catch (const c10::Error& error) {
      // The container's destructor would finish an unfinished archive and throw again, which
      // ends the process; it is finished here, its failure ignored.
      if (!container.finalized()) {
        try {
          container.writeEndOfFile();
        } catch (const c10::Error&) {
        }
      }
      if (write_error) std::rethrow_exception(write_error);
      throw Error("cannot write checkpoint file " + out.path().string() + ": " +
                  error.what_without_backtrace());
    }
    if (write_error) std::rethrow_exception(write_error);
  }

  StateDict read(const std::filesystem::path& file) const override {
    StateDict state;
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(file.string());
      const std::string prefix = kMetadataPrefix;
      for (const auto& key : archive.keys()) {
        c10::IValue value;
        archive.read(key, value);
        if (key.rfind(prefix, 0) == 0 && value.isString()) {
          state.metadata[key.substr(prefix.size())] = value.toStringRef();
        } else if (value.isTensor()) {
          state.tensors[key] = value.toTensor();
        } else {
          throw Error("unexpected entry '" + key + "'");
        }
      }
    } catch (const c10::Error& error) {
      std::string message = error.what_without_backtrace();
      throw Error("cannot read checkpoint file " + file.string() + ": " +
                  message.substr(0, message.find('\n')));
    } catch (const Error& error) {
      throw Error("cannot read checkpoint file " + file.string() + ": " + error.what());
    }
    return state;
  }
};

void register_components(Registry& registry) {
  registry.add<CheckpointBackend>("torch", {}, "LibTorch archive files (.pt)",
                                  [](const Config&, const BuildContext&) {
                                    return std::make_unique<TorchArchive>();
                                  });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("torch_checkpoint", "1.0.0", trainyard::register_components)
