#include "shard_header.hpp"

#include <bit>
#include <cstring>

#include "trainyard/api/error.hpp"

namespace trainyard::token_shards {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian and read in place");

template <typename T>
T load(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

}  // namespace

void check_shard_size(std::uint64_t file_bytes, const std::string& name) {
  if (file_bytes < kHeaderBytes) {
    throw Error("token shard " + name + " is truncated: " + std::to_string(file_bytes) +
                " bytes, shorter than its " + std::to_string(kHeaderBytes) + "-byte header");
  }
}

ShardHeader read_shard_header(std::span<const unsigned char> file, const std::string& name) {
  check_shard_size(file.size(), name);
  const unsigned char* data = file.data();
  auto fail = [&](const std::string& message) {
    throw Error("token shard " + name + " " + message);
  };
  if (std::memcmp(data, kMagic, 8) != 0) {
    std::string seen;
    for (int i = 0; i < 8; ++i) {
      const unsigned char c = data[i];
      seen += c >= 32 && c < 127 ? static_cast<char>(c) : '?';
    }
    fail("is not a token shard: magic '" + seen + "' at offset 0, expected 'TYTOKENS'");
  }
  if (auto version = load<std::uint32_t>(data + 8); version != kVersion) {
    fail("has format version " + std::to_string(version) + " at offset 8; this reader knows " +
         std::to_string(kVersion));
  }
  ShardHeader header;
  header.token_bytes = load<std::uint32_t>(data + 12);
  if (header.token_bytes != 2 && header.token_bytes != 4) {
    fail("declares " + std::to_string(header.token_bytes) +
         " bytes per token at offset 12; expected 2 (uint16) or 4 (uint32)");
  }
  const auto declared = load<std::uint64_t>(data + 16);
  header.vocab_size = load<std::uint32_t>(data + 24);
  // Reserved for a later version of the format, whose reader would give it a meaning this one
  // cannot honour; a corrupt header shows here too.
  if (auto reserved = load<std::uint32_t>(data + 28); reserved != 0) {
    fail("has " + std::to_string(reserved) + " in its reserved field at offset 28; version " +
         std::to_string(kVersion) + " shards hold 0 there");
  }
  const std::size_t payload = file.size() - kHeaderBytes;
  if (declared > payload / header.token_bytes) {
    fail("is truncated: its header (offset 16) declares " + std::to_string(declared) +
         " tokens, but the file holds only " + std::to_string(payload) + " bytes of tokens (" +
         std::to_string(payload / header.token_bytes) + " tokens)");
  }
  if (declared * header.token_bytes != payload) {
    fail("has a header (offset 16) that declares " + std::to_string(declared) +
         " tokens, but the file holds " + std::to_string(payload) +
         " bytes of tokens after its header: " +
         std::to_string(payload - declared * header.token_bytes) + " bytes more than declared");
  }
  header.tokens = static_cast<std::int64_t>(declared);
  return header;
}

std::array<unsigned char, kHeaderBytes> shard_header_bytes(const ShardHeader& header) {
  std::array<unsigned char, kHeaderBytes> bytes{};
  const std::uint32_t version = kVersion;
  const auto count = static_cast<std::uint64_t>(header.tokens);
  std::memcpy(bytes.data(), kMagic, 8);
  std::memcpy(bytes.data() + 8, &version, 4);
  std::memcpy(bytes.data() + 12, &header.token_bytes, 4);
  std::memcpy(bytes.data() + 16, &count, 8);
  std::memcpy(bytes.data() + 24, &header.vocab_size, 4);
  return bytes;
}

}  // namespace trainyard::token_shards
