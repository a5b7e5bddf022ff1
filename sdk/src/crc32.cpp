#include "trainyard/runtime/crc32.hpp"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trainyard {

namespace {

#if defined(__x86_64__)

#define TRAINYARD_CLMUL __attribute__((target("sse4.1,pclmul")))

TRAINYARD_CLMUL __m128i load(const unsigned char* at) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
}

// Folds the running remainder `x` into the next block: x * k (both halves) ^ next.
TRAINYARD_CLMUL __m128i fold(__m128i x, __m128i k, __m128i next) {
  const __m128i low = _mm_clmulepi64_si128(x, k, 0x00);
  const __m128i high = _mm_clmulepi64_si128(x, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(high, low), next);
}

// The folding of Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" for the
// reflected CRC-32 polynomial 0x04C11DB7, as in Linux's crc32-pclmul and Chromium's zlib. `crc`
// is the running register (zlib's value inverted); `bytes` is at least 64 and a multiple of 16.
TRAINYARD_CLMUL std::uint32_t fold_crc32(const unsigned char* data, std::size_t bytes,
                                         std::uint32_t crc) {
  alignas(16) static const std::uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};
  alignas(16) static const std::uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};
  alignas(16) static const std::uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};
  alignas(16) static const std::uint64_t poly[] = {0x01db710641, 0x01f7011641};
  __m128i x1 = _mm_xor_si128(load(data), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load(data + 16);
  __m128i x3 = load(data + 32);
  __m128i x4 = load(data + 48);
  data += 64;
  bytes -= 64;
  // Four lanes of 16 bytes, 64 bytes a round.
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  while (bytes >= 64) {
    x1 = fold(x1, k, load(data));
    x2 = fold(x2, k, load(data + 16));
    x3 = fold(x3, k, load(data + 32));
    x4 = fold(x4, k, load(data + 48));
    data += 64;
    bytes -= 64;
  }
  // The four lanes into one, then the remaining 16-byte blocks.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x1 = fold(x1, k, x2);
  x1 = fold(x1, k, x3);
  x1 = fold(x1, k, x4);
  while (bytes >= 16) {
    x1 = fold(x1, k, load(data));
    data += 16;
    bytes -= 16;
  }
  // 128 bits to 64, then Barrett reduction to 32.
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i x2r = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2r);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x2r = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x00), x2r);
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  x2r = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x10);
  x2r = _mm_clmulepi64_si128(_mm_and_si128(x2r, low32), k, 0x00);
  x1 = _mm_xor_si128(x1, x2r);
  return static_cast<std::uint32_t>(_mm_extract_epi32(x1, 1));
}

bool cpu_folds() {
  static const bool supported =
      __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return supported;
}

#undef TRAINYARD_CLMUL

#endif

}  // namespace

std::uint32_t update_crc32(std::uint32_t crc, const void* data, std::size_t bytes) {
  const auto* next = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (bytes >= 64 && cpu_folds()) {
    const std::size_t folded = bytes & ~std::size_t{15};
    crc = ~fold_crc32(next, folded, ~crc);
    next += folded;
    bytes -= folded;
  }
#endif
  // zlib takes at most 4 GiB a call.
  while (bytes > 0) {
    const std::size_t piece = bytes < (std::size_t{1} << 30) ? bytes : (std::size_t{1} << 30);
    crc = static_cast<std::uint32_t>(crc32(crc, next, static_cast<uInt>(piece)));
    next += piece;
    bytes -= piece;
  }
  return crc;
}

}  // namespace trainyard
