#include "tfrecord.hpp"

#include <array>

namespace trainyard::tensorboard {
namespace {

constexpr std::uint32_t kCastagnoliReversed = 0x82f63b78;
constexpr std::uint32_t kMaskDelta = 0xa282ead8;

constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    std::uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kCastagnoliReversed : 0);
    table[byte] = crc;
  }
  return table;
}

constexpr auto kCrcTable = make_crc_table();

void append_little_endian(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::uint32_t crc32c(std::string_view data) {
  std::uint32_t crc = 0xffffffff;
  for (unsigned char byte : data) crc = kCrcTable[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffff;
}

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string tfrecord(std::string_view data) {
  std::string length;
  append_little_endian(length, data.size(), 8);
  std::string out = length;
  out.reserve(8 + 4 + data.size() + 4);
  append_little_endian(out, masked_crc32c(length), 4);
  out.append(data);
  append_little_endian(out, masked_crc32c(data), 4);
  return out;
}

}  // namespace trainyard::tensorboard
