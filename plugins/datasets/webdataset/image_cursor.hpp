#pragma once
// Reads samples' image bytes out of an index's shards front to back: a shard is opened when one
// of its samples is first asked for and read on from where the previous read stopped, so a reader
// moving forward through its samples passes over each shard once, skipping the members it does
// not want. Asking for an earlier sample of the open shard opens it again.

#include <cstdint>
#include <memory>
#include <vector>

#include "shard_index.hpp"
#include "tar_reader.hpp"

namespace trainyard {

class ImageCursor {
 public:
  explicit ImageCursor(std::shared_ptr<const ShardIndex> index) : index_(std::move(index)) {}

  // Sample `sample` of shard `shard` (numbers of the index). Throws Error naming the shard and
  // the key when the shard no longer holds the member the index found there.
  std::vector<std::uint8_t> read(std::int64_t shard, std::int64_t sample);
  // Closes the open shard.
  void close();

 private:
  std::shared_ptr<const ShardIndex> index_;
  std::unique_ptr<TarReader> tar_;
  std::int64_t shard_ = -1;
};

}  // namespace trainyard
