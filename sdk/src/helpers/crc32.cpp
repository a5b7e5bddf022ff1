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
// reflected CRC-32 polynomial 0x04C11DB7, as in Linux's crc32-pclmul and Chromium's zlib. The
// constants for folding by D bits are x^(D+32) and x^(D-32) modulo the polynomial, bit-reflected
// and shifted left by one.
alignas(16) constexpr std::uint64_t kFoldBy512[] = {0x0154442bd4, 0x01c6e41596};
alignas(16) constexpr std::uint64_t kFoldBy128[] = {0x01751997d0, 0x00ccaa009e};
alignas(16) constexpr std::uint64_t kFoldBy2048[] = {0x011542778a, 0x01322d1430};
alignas(16) constexpr std::uint64_t kFoldBy64[] = {0x0163cd6124, 0x0000000000};
alignas(16) constexpr std::uint64_t kBarrett[] = {0x01db710641, 0x01f7011641};

// Four lanes of 16 bytes: the remainder of what is folded so far, the next 64 bytes apart.
struct Lanes {
  __m128i x1, x2, x3, x4;
};

// The first 64 bytes, with the running register `crc` (zlib's value inverted) folded in.
TRAINYARD_CLMUL Lanes first_lanes(const unsigned char* data, std::uint32_t crc) {
  return {_mm_xor_si128(load(data), _mm_cvtsi32_si128(static_cast<int>(crc))), load(data + 16),
          load(data + 32), load(data + 48)};
}

// Folds 64 bytes a round while at least 64 are left.
TRAINYARD_CLMUL void fold_by_64_bytes(Lanes& lanes, const unsigned char*& data,
                                      std::size_t& bytes) {
  const __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(kFoldBy512));
  while (bytes >= 64) {
    lanes.x1 = fold(lanes.x1, k, load(data));
    lanes.x2 = fold(lanes.x2, k, load(data + 16));
    lanes.x3 = fold(lanes.x3, k, load(data + 32));
    lanes.x4 = fold(lanes.x4, k, load(data + 48));
    data += 64;
    bytes -= 64;
  }
}

// The four lanes into one, the remaining 16-byte blocks (fewer than 64 bytes, a multiple of 16),
// then 128 bits to 64 and a Barrett reduction to the 32-bit register.
TRAINYARD_CLMUL std::uint32_t finish_lanes(Lanes lanes, const unsigned char* data,
                                           std::size_t bytes) {
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(kFoldBy128));
  __m128i x1 = fold(lanes.x1, k, lanes.x2);
  x1 = fold(x1, k, lanes.x3);
  x1 = fold(x1, k, lanes.x4);
  while (bytes >= 16) {
    x1 = fold(x1, k, load(data));
    data += 16;
    bytes -= 16;
  }
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i x2 = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kFoldBy64));
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x00), x2);
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(kBarrett));
  x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x10);
  x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, low32), k, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  return static_cast<std::uint32_t>(_mm_extract_epi32(x1, 1));
}

#define TRAINYARD_CLMUL512 __attribute__((target("avx512f,vpclmulqdq,sse4.1,pclmul")))

TRAINYARD_CLMUL512 __m512i load512(const unsigned char* at) { return _mm512_loadu_si512(at); }

// A pair of fold constants in each 16-byte lane.
TRAINYARD_CLMUL512 __m512i broadcast_lanes(const std::uint64_t (&constants)[2]) {
  const auto low = static_cast<long long>(constants[0]);
  const auto high = static_cast<long long>(constants[1]);
  return _mm512_set_epi64(high, low, high, low, high, low, high, low);
}

// fold() on four 16-byte lanes at once.
TRAINYARD_CLMUL512 __m512i fold512(__m512i x, __m512i k, __m512i next) {
  const __m512i low = _mm512_clmulepi64_epi128(x, k, 0x00);
  const __m512i high = _mm512_clmulepi64_epi128(x, k, 0x11);
  return _mm512_ternarylogic_epi64(high, low, next, 0x96);  // high ^ low ^ next
}

// The first 256 bytes or more as four 64-byte registers folded 256 bytes a round, four times the
// 16-byte lanes' width: what is left to fold then is four 16-byte lanes, as if the whole stretch
// had been folded 64 bytes a round. Needs at least 256 bytes.
TRAINYARD_CLMUL512 Lanes fold_by_256_bytes(const unsigned char*& data, std::size_t& bytes,
                                           std::uint32_t crc) {
  __m512i z0 = _mm512_xor_si512(load512(data),
                                _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m512i z1 = load512(data + 64);
  __m512i z2 = load512(data + 128);
  __m512i z3 = load512(data + 192);
  data += 256;
  bytes -= 256;
  __m512i k = broadcast_lanes(kFoldBy2048);
  while (bytes >= 256) {
    z0 = fold512(z0, k, load512(data));
    z1 = fold512(z1, k, load512(data + 64));
    z2 = fold512(z2, k, load512(data + 128));
    z3 = fold512(z3, k, load512(data + 192));
    data += 256;
    bytes -= 256;
  }
  // Each register is 64 bytes ahead of the previous one: folded into it in order.
  k = broadcast_lanes(kFoldBy512);
  z1 = fold512(z0, k, z1);
  z2 = fold512(z1, k, z2);
  z3 = fold512(z2, k, z3);
  alignas(64) __m128i lanes[4];
  _mm512_store_si512(lanes, z3);
  return {lanes[0], lanes[1], lanes[2], lanes[3]};
}

#undef TRAINYARD_CLMUL512

// `crc` is the running register (zlib's value inverted); `bytes` is at least 64 and a multiple of
// 16. `wide`: the CPU folds 64-byte registers.
TRAINYARD_CLMUL std::uint32_t fold_crc32(const unsigned char* data, std::size_t bytes,
                                         std::uint32_t crc, bool wide) {
  Lanes lanes;
  if (wide && bytes >= 256) {
    lanes = fold_by_256_bytes(data, bytes, crc);
  } else {
    lanes = first_lanes(data, crc);
    data += 64;
    bytes -= 64;
  }
  fold_by_64_bytes(lanes, data, bytes);
  return finish_lanes(lanes, data, bytes);
}

bool cpu_folds() {
  static const bool supported =
      __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return supported;
}

bool cpu_folds_wide() {
  static const bool supported =
      cpu_folds() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
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
    crc = ~fold_crc32(next, folded, ~crc, cpu_folds_wide());
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
