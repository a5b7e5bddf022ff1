#pragma once
// The 32-byte header of a token shard (format in token_shards.hpp) and its checks against the
// file's size. No LibTorch here, so the checks can be exercised on their own.

#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace trainyard::token_shards {

inline constexpr char kMagic[8] = {'T', 'Y', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 32;

struct ShardHeader {
  std::uint32_t token_bytes = 2;  // 2 (uint16) or 4 (uint32)
  std::int64_t tokens = 0;
  std::uint32_t vocab_size = 0;  // 0: not recorded
};

// Throws Error "token shard <name> is truncated: ..." when a file of `file_bytes` bytes cannot
// hold a header.
void check_shard_size(std::uint64_t file_bytes, const std::string& name);

// The header of `file`, the whole shard's bytes, checked: the size, the magic, the version, the
// token size, and a token count that fills the file exactly. Throws Error "token shard <name>
// <reason>" naming the offset of the field at fault.
ShardHeader read_shard_header(std::span<const unsigned char> file, const std::string& name);

// The header's bytes as a shard stores them.
std::array<unsigned char, kHeaderBytes> shard_header_bytes(const ShardHeader& header);

}  // namespace trainyard::token_shards
