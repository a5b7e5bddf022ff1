#pragma once
// CRC-32 as zlib computes it (the checksum in checkpoint manifests), at memory speed.

#include <cstddef>
#include <cstdint>

namespace trainyard {

// zlib's crc32(crc, data, bytes): the CRC-32 of bytes that follow those `crc` was computed over
// (0 for the first). Folds with carry-less multiplication where the CPU has it: 256 bytes a round
// in 64-byte registers with AVX-512's VPCLMULQDQ (about 90 GB/s on bytes in cache), else 64 bytes
// a round with PCLMULQDQ (about 29 GB/s); zlib's table elsewhere.
std::uint32_t update_crc32(std::uint32_t crc, const void* data, std::size_t bytes);

}  // namespace trainyard
