// Checkpoint files in the safetensors format, readable by Python's safetensors and transformers:
// an 8-byte little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and
// byte range in the data section, then the raw row-major little-endian data. Metadata strings
// go in the header's "__metadata__" object.
//
// Reading trusts nothing: the header size is bounded, every entry's dtype, shape and offsets are
// checked against the file before a byte of data is used, and ranges must tile the data section
// exactly (no gaps, no overlaps), as the reference implementation requires.

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "trainyard/checkpoint.hpp"
#include "trainyard/error.hpp"
#include "trainyard/json_quote.hpp"
#include "trainyard/plugin.hpp"
#include "trainyard/strict_json.hpp"

namespace trainyard {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; this host is not little-endian");

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's bound
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeName {
  at::ScalarType type;
  const char* name;
};

constexpr DtypeName kDtypes[] = {
    {at::kFloat, "F32"},    {at::kDouble, "F64"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},     {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},      {at::kBool, "BOOL"},  {at::kUInt16, "U16"}, {at::kUInt32, "U32"},
    {at::kUInt64, "U64"},   {at::kFloat8_e4m3fn, "F8_E4M3"}, {at::kFloat8_e5m2, "F8_E5M2"},
};

const char* dtype_name(at::ScalarType type, const std::string& tensor) {
  for (const auto& entry : kDtypes) {
    if (entry.type == type) return entry.name;
  }
  throw Error("tensor '" + tensor + "' has dtype " + std::string(c10::toString(type)) +
              ", which safetensors cannot store");
}

std::optional<at::ScalarType> dtype_of(const std::string& name) {
  for (const auto& entry : kDtypes) {
    if (name == entry.name) return entry.type;
  }
  return std::nullopt;
}

// A read-only mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& file) {
    fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error("cannot open checkpoint file " + file.string());
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      ::close(fd_);
      throw Error("cannot stat checkpoint file " + file.string());
    }
    size_ = static_cast<std::uint64_t>(info.st_size);
    if (size_ > 0) {
      void* address = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (address == MAP_FAILED) {
        ::close(fd_);
        throw Error("cannot map checkpoint file " + file.string());
      }
      data_ = static_cast<const std::uint8_t*>(address);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// Offsets and sizes exactly as written: the strict reader keeps integers up to 2^64 - 1 as
// unsigned 64-bit numbers; negative ones, fractions, exponents and larger values are refused.
std::uint64_t to_u64(const nlohmann::json& value, const std::string& what) {
  if (!value.is_number()) throw Error(what + " is not a number");
  if (!value.is_number_unsigned()) {
    throw Error(what + " is not a non-negative integer: " + value.dump());
  }
  return value.get<std::uint64_t>();
}

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
        header += (first ? "" : ",") + json_quote(key) + ":" + json_quote(value);
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
        header += (d ? "," : "") + std::to_string(data.size(d));
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
    MappedFile mapped(file);
    if (mapped.size() < 8) {
      throw Error("truncated: " + std::to_string(mapped.size()) +
                  " bytes, shorter than the 8-byte header length");
    }
    std::uint64_t header_length = 0;
    for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | mapped.data()[i];
    if (header_length > kMaxHeaderBytes) {
      throw Error("header length " + std::to_string(header_length) + " exceeds the 100 MB bound");
    }
    if (header_length > mapped.size() - 8) {
      throw Error("header length " + std::to_string(header_length) + " runs past the end of the " +
                  std::to_string(mapped.size()) + "-byte file (truncated?)");
    }
    std::string_view header_text(reinterpret_cast<const char*>(mapped.data() + 8), header_length);
    // The strict reader refuses repeated names (a tensor or metadata key given twice) and
    // bounds the nesting.
    const nlohmann::json header =
        parse_strict_json(header_text, "safetensors header of " + file.string());
    if (!header.is_object()) throw Error("header is not a JSON object");

    const std::uint64_t data_start = 8 + header_length;
    const std::uint64_t data_size = mapped.size() - data_start;
    StateDict state;
    struct Range {
      std::uint64_t begin, end;
      std::string name;
    };
    std::vector<Range> ranges;
    for (const auto& [name, entry] : header.items()) {
      if (name == kMetadataKey) {
        if (!entry.is_object()) throw Error("__metadata__ is not an object");
        for (const auto& [key, value] : entry.items()) {
          if (!value.is_string()) {
            throw Error("__metadata__ entry '" + key + "' is not a string");
          }
          state.metadata[key] = value.get<std::string>();
        }
        continue;
      }
      const std::string what = "tensor '" + name + "'";
      if (!entry.is_object()) throw Error(what + " lacks a valid dtype, shape or data_offsets");
      const auto dtype = entry.find("dtype");
      const auto shape = entry.find("shape");
      const auto offsets = entry.find("data_offsets");
      if (dtype == entry.end() || shape == entry.end() || offsets == entry.end() ||
          !dtype->is_string() || !shape->is_array() || !offsets->is_array() ||
          offsets->size() != 2) {
        throw Error(what + " lacks a valid dtype, shape or data_offsets");
      }
      const std::string& dtype_text = dtype->get_ref<const std::string&>();
      auto type = dtype_of(dtype_text);
      if (!type) throw Error(what + " has unknown dtype '" + dtype_text + "'");
      std::vector<std::int64_t> sizes;
      std::uint64_t numel = 1;
      for (const auto& dimension : *shape) {
        std::uint64_t d = to_u64(dimension, what + " shape entry");
        if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
            (d != 0 && numel > std::numeric_limits<std::uint64_t>::max() / d)) {
          throw Error(what + " has an impossible shape");
        }
        numel *= d;
        sizes.push_back(static_cast<std::int64_t>(d));
      }
      const std::uint64_t begin = to_u64((*offsets)[0], what + " data offset");
      const std::uint64_t end = to_u64((*offsets)[1], what + " data offset");
      const std::uint64_t element = c10::elementSize(*type);
      if (begin > end || end > data_size) {
        throw Error(what + " claims bytes [" + std::to_string(begin) + ", " + std::to_string(end) +
                    ") of a " + std::to_string(data_size) + "-byte data section (at file offset " +
                    std::to_string(data_start + begin) + "; truncated or lying header)");
      }
      if (numel > std::numeric_limits<std::uint64_t>::max() / element ||
          end - begin != numel * element) {
        throw Error(what + " has " + std::to_string(end - begin) + " bytes of data but its shape " +
                    "and dtype need " + std::to_string(numel * element));
      }
      ranges.push_back({begin, end, name});
      at::Tensor tensor = at::empty(sizes, at::TensorOptions().dtype(*type));
      if (end > begin) std::memcpy(tensor.data_ptr(), mapped.data() + data_start + begin, end - begin);
      state.tensors.emplace(name, std::move(tensor));
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
    std::uint64_t expected = 0;
    for (const auto& range : ranges) {
      if (range.begin != expected) {
        throw Error("tensor '" + range.name + "' starts at data byte " +
                    std::to_string(range.begin) + ", expected " + std::to_string(expected) +
                    " (overlapping or gapped data)");
      }
      expected = range.end;
    }
    if (expected != data_size) {
      throw Error("the data section has " + std::to_string(data_size) + " bytes but the tensors " +
                  "cover " + std::to_string(expected) + " (trailing bytes)");
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
