#pragma once
// CRC-32 as zlib computes it (the checksum in checkpoint manifests), at memory speed.

#include <cstddef>
#include <cstdint>

namespace trainyard {

// zlib's crc32(crc, data, bytes): the CRC-32 of bytes that follow those `crc` was computed over
// (0 for the first). Folds 64 bytes at a time with carry-less multiplication where the CPU has
// it (x86-64 PCLMULQDQ), several times faster than zlib's table; zlib elsewhere.
std::uint32_t update_crc32(std::uint32_t crc, const void* data, std::size_t bytes);

}  // namespace trainyard
