#include "trainyard/support/safetensors_layout.hpp"

#include <algorithm>
#include <limits>

#include "trainyard/api/error.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard::safetensors {
namespace {

constexpr DtypeSize kDtypes[] = {
    {"F32", 4}, {"F64", 8}, {"F16", 2}, {"BF16", 2},    {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},      {"BOOL", 1},
    {"U16", 2}, {"U32", 4}, {"U64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
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

const DtypeSize* find_dtype(const std::string& name) {
  for (const auto& entry : kDtypes) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

// A tensor's dimensions and element count. The count as if every zero dimension were one must
// fit in 64 signed bits too: it is the outermost stride of the tensor being made.
std::vector<std::int64_t> read_shape(const nlohmann::json& shape, const std::string& what,
                                     std::uint64_t& numel) {
  constexpr auto kLargest = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::vector<std::int64_t> sizes;
  numel = 1;
  std::uint64_t extent = 1;
  for (const auto& dimension : shape) {
    const std::uint64_t d = to_u64(dimension, what + " shape entry");
    const std::uint64_t nonzero = std::max<std::uint64_t>(d, 1);
    if (d > kLargest || extent > kLargest / nonzero) throw Error(what + " has an impossible shape");
    extent *= nonzero;
    numel *= d;
    sizes.push_back(static_cast<std::int64_t>(d));
  }
  return sizes;
}

TensorEntry read_entry(const std::string& name, const nlohmann::json& entry,
                       std::uint64_t data_start, std::uint64_t data_size) {
  const std::string what = "tensor '" + name + "'";
  if (!entry.is_object()) throw Error(what + " lacks a valid dtype, shape or data_offsets");
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || shape == entry.end() || offsets == entry.end() ||
      !dtype->is_string() || !shape->is_array() || !offsets->is_array() || offsets->size() != 2) {
    throw Error(what + " lacks a valid dtype, shape or data_offsets");
  }
  TensorEntry out;
  out.name = name;
  out.dtype = dtype->get<std::string>();
  const DtypeSize* type = find_dtype(out.dtype);
  if (!type) throw Error(what + " has unknown dtype '" + out.dtype + "'");
  std::uint64_t numel = 0;
  out.shape = read_shape(*shape, what, numel);
  out.begin = to_u64((*offsets)[0], what + " data offset");
  out.end = to_u64((*offsets)[1], what + " data offset");
  if (out.begin > out.end || out.end > data_size) {
    throw Error(what + " claims bytes [" + std::to_string(out.begin) + ", " +
                std::to_string(out.end) + ") of a " + std::to_string(data_size) +
                "-byte data section (at file offset " + std::to_string(data_start + out.begin) +
                "; truncated or lying header)");
  }
  if (numel > std::numeric_limits<std::uint64_t>::max() / type->bytes ||
      out.end - out.begin != numel * type->bytes) {
    throw Error(what + " has " + std::to_string(out.end - out.begin) +
                " bytes of data but its shape and dtype need " +
                (numel > std::numeric_limits<std::uint64_t>::max() / type->bytes
                     ? std::string("more than 2^64")
                     : std::to_string(numel * type->bytes)));
  }
  return out;
}

// The ranges must cover [0, data_size) exactly, each byte once.
void check_tiling(std::vector<const TensorEntry*> entries, std::uint64_t data_size) {
  std::sort(entries.begin(), entries.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
  std::uint64_t expected = 0;
  for (const TensorEntry* entry : entries) {
    if (entry->begin != expected) {
      throw Error("tensor '" + entry->name + "' starts at data byte " +
                  std::to_string(entry->begin) + ", expected " + std::to_string(expected) +
                  " (overlapping or gapped data)");
    }
    expected = entry->end;
  }
  if (expected != data_size) {
    throw Error("the data section has " + std::to_string(data_size) + " bytes but the tensors " +
                "cover " + std::to_string(expected) + " (trailing bytes)");
  }
}

}  // namespace

std::span<const DtypeSize> known_dtypes() { return kDtypes; }

Layout read_layout(std::span<const std::uint8_t> file, const std::string& source) {
  if (file.size() < 8) {
    throw Error("truncated: " + std::to_string(file.size()) +
                " bytes, shorter than the 8-byte header length");
  }
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | file[i];
  if (header_length > kMaxHeaderBytes) {
    throw Error("header length " + std::to_string(header_length) + " exceeds the 100 MB bound");
  }
  if (header_length > file.size() - 8) {
    throw Error("header length " + std::to_string(header_length) + " runs past the end of the " +
                std::to_string(file.size()) + "-byte file (truncated?)");
  }
  std::string_view header_text(reinterpret_cast<const char*>(file.data() + 8), header_length);
  // The strict reader refuses repeated names (a tensor or metadata key given twice) and bounds
  // the nesting.
  const nlohmann::json header = parse_strict_json(header_text, "safetensors header of " + source);
  if (!header.is_object()) throw Error("header is not a JSON object");

  Layout layout;
  layout.data_start = 8 + header_length;
  const std::uint64_t data_size = file.size() - layout.data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) throw Error("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) throw Error("__metadata__ entry '" + key + "' is not a string");
        layout.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    layout.tensors.push_back(read_entry(name, entry, layout.data_start, data_size));
  }
  std::vector<const TensorEntry*> entries;
  for (const auto& entry : layout.tensors) entries.push_back(&entry);
  check_tiling(std::move(entries), data_size);
  return layout;
}

}  // namespace trainyard::safetensors
