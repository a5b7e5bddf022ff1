#pragma once
// The layout of a safetensors file, read from its header alone: an 8-byte little-endian header
// length N, N bytes of JSON naming each tensor's dtype, shape and byte range in the data section,
// then the data. Nothing in the header is trusted: its length is bounded, every entry's dtype,
// shape and offsets are checked against the file, and the ranges must tile the data section
// exactly (no gaps, no overlaps), as the reference implementation requires. No LibTorch here, so
// the checks can be exercised on their own.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard::safetensors {

inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's
inline constexpr const char* kMetadataKey = "__metadata__";

// A dtype name of the format and the bytes of one element.
struct DtypeSize {
  const char* name;
  std::uint64_t bytes;
};
// Every dtype the reader accepts.
std::span<const DtypeSize> known_dtypes();

struct TensorEntry {
  std::string name;
  std::string dtype;  // one of known_dtypes()
  std::vector<std::int64_t> shape;
  // Bytes [begin, end) of the data section.
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

struct Layout {
  std::uint64_t data_start = 0;  // file offset of the data section
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> tensors;  // in the header's order
};

// Reads the layout of `file`, the whole file's bytes. Throws Error with the reason (`source`
// names the file in JSON syntax errors) for a truncated file, an oversized or malformed header,
// an unknown dtype, an impossible shape, a range outside the data section or disagreeing with
// its shape and dtype, and ranges that do not tile the data section.
Layout read_layout(std::span<const std::uint8_t> file, const std::string& source);

}  // namespace trainyard::safetensors
