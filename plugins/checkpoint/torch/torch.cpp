// Checkpoint files in LibTorch's archive format (readable from Python with torch.jit.load).

#include <torch/serialize/archive.h>

#include <filesystem>

#include "trainyard/checkpoint.hpp"
#include "trainyard/error.hpp"
#include "trainyard/plugin.hpp"

namespace trainyard {
namespace {

constexpr const char* kMetadataPrefix = "__metadata__/";

class TorchArchive final : public CheckpointBackend {
 public:
  std::string extension() const override { return ".pt"; }

  void write(const std::filesystem::path& file, const StateDict& state) const override {
    torch::serialize::OutputArchive archive;
    for (const auto& [name, tensor] : state.tensors) {
      archive.write(name, c10::IValue(tensor.detach().cpu()));
    }
    for (const auto& [key, value] : state.metadata) {
      archive.write(kMetadataPrefix + key, c10::IValue(value));
    }
    try {
      archive.save_to(file.string());
    } catch (const c10::Error& error) {
      throw Error("cannot write checkpoint file " + file.string() + ": " +
                  error.what_without_backtrace());
    }
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
