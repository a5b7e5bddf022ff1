// Fuzzes the token shard header reader on whole files, and checks that a header it accepts
// describes the file exactly and is written back to the same bytes.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "shard_header.hpp"
#include "trainyard/api/error.hpp"

namespace ts = trainyard::token_shards;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ts::ShardHeader header;
  try {
    header = ts::read_shard_header(std::span<const unsigned char>(data, size), "fuzz.bin");
  } catch (const trainyard::Error&) {
    return 0;
  }
  const bool fills_file =
      header.tokens >= 0 && (header.token_bytes == 2 || header.token_bytes == 4) &&
      ts::kHeaderBytes + static_cast<std::uint64_t>(header.tokens) * header.token_bytes == size;
  if (!fills_file) {
    std::fprintf(stderr, "accepted a header of %lld tokens of %u bytes for a %zu-byte file\n",
                 static_cast<long long>(header.tokens), header.token_bytes, size);
    std::abort();
  }
  // Bytes 28..31 are reserved and not read.
  const auto written = ts::shard_header_bytes(header);
  if (std::memcmp(written.data(), data, 28) != 0) {
    std::fprintf(stderr, "the header is written back differently\n");
    std::abort();
  }
  return 0;
}
