// Checkpoint files in the safetensors format, readable by Python's safetensors and transformers:
// an 8-byte little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and
// byte range in the data section, then the raw row-major little-endian data. Metadata strings
// go in the header's "__metadata__" object.
//
// Reading trusts nothing: the whole layout is checked (trainyard/support/safetensors_layout.hpp)
// before a byte of data is used.

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>

#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/support/json_quote.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/support/mapped_file.hpp"
#include "trainyard/support/safetensors_dtype.hpp"
#include "trainyard/support/safetensors_layout.hpp"

namespace trainyard {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; this host is not little-endian");

using safetensors::kMaxHeaderBytes;
using safetensors::kMetadataKey;
using safetensors::dtype_name;

class Safetensors final : public CheckpointBackend {
 public:
  std::string extension() const override { return ".safetensors"; }

  void write_to(CheckpointFileWriter& out, const StateDict& state) const override {
    const std::filesystem::path& file = out.path();
    // Entries in name order (TensorMap is ordered), data packed back to back.
    std::vector<at::Tensor> contiguous;
    std::string header = "{";
    if (!state.metadata.empty()) {
      header += json_quote(kMetadataKey) + ":{";
      bool first = true;
      for (const auto& [key, value] : state.metadata) {
        if (!first) header += ',';
        header += json_quote(key) + ":" + json_quote(value);
        first = false;
      }
      header += "}";
    }
    std::uint64_t offset = 0;
    for (const auto& [name, tensor] : state.tensors) {
      if (name == kMetadataKey) throw Error("a tensor may not be called " + std::string(kMetadataKey));
      at::Tensor data = tensor.detach().to(at::kCPU).contiguous();
      const auto bytes = static_cast<std::uint64_t>(data.nbytes());
      if (header.size() > 1) header += ",";
      header += json_quote(name) + ":{\"dtype\":\"" + dtype_name(data.scalar_type(), name) +
                "\",\"shape\":[";
      for (std::int64_t d = 0; d < data.dim(); ++d) {
        if (d) header += ',';
        header += std::to_string(data.size(d));
      }
      header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
                std::to_string(offset + bytes) + "]}";
      offset += bytes;
      contiguous.push_back(std::move(data));
    }
    header += "}";
    // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
    header.append((8 - header.size() % 8) % 8, ' ');
    if (header.size() > kMaxHeaderBytes) {
      throw Error("safetensors header of " + file.string() + " would exceed 100 MB");
    }

    std::uint64_t length = header.size();
    unsigned char prefix[8];
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(length >> (8 * i));
    out.append(prefix, 8);
    out.append(header);
    // Each tensor's bytes from its own memory; small tensors are gathered with their neighbours.
    for (const auto& data : contiguous) out.append(data.const_data_ptr(), data.nbytes());
  }

  StateDict read(const std::filesystem::path& file) const override {
    try {
      return read_checked(file);
    } catch (const Error& error) {
      const std::string message = error.what();
      if (message.find(file.string()) != std::string::npos) throw;
      throw Error("safetensors file " + file.string() + ": " + message);
    }
  }

 private:
  static StateDict read_checked(const std::filesystem::path& file) {
    MappedFile mapped(file, "checkpoint file");
    const safetensors::Layout layout = safetensors::read_layout(
        std::span<const std::uint8_t>(mapped.data(), mapped.size()), file.string());
    StateDict state;
    state.metadata = layout.metadata;
    for (const auto& entry : layout.tensors) {
      at::Tensor tensor = at::empty(entry.shape, at::TensorOptions().dtype(safetensors::scalar_type(entry.dtype)));
      if (entry.end > entry.begin) {
        std::memcpy(tensor.data_ptr(), mapped.data() + layout.data_start + entry.begin,
                    entry.end - entry.begin);
      }
      state.tensors.emplace(entry.name, std::move(tensor));
    }
    return state;
  }
};

void register_components(Registry& registry) {
  registry.add<CheckpointBackend>(
      "safetensors", {}, "safetensors files (.safetensors), readable by Python's safetensors",
      [](const Config&, const BuildContext&) { return std::make_unique<Safetensors>(); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("safetensors_checkpoint", "1.0.0", trainyard::register_components)
