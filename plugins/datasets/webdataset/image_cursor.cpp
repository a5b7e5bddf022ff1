#include "image_cursor.hpp"

#include "trainyard/api/error.hpp"

namespace trainyard {

void ImageCursor::close() {
  tar_.reset();
  shard_ = -1;
}

std::vector<std::uint8_t> ImageCursor::read(std::int64_t shard, std::int64_t sample) {
  const IndexedShard& indexed = index_->shards.at(static_cast<std::size_t>(shard));
  const IndexedSample& wanted = indexed.samples.at(static_cast<std::size_t>(sample));
  if (!tar_ || shard_ != shard || tar_->member() >= wanted.member) {
    tar_.reset();
    tar_ = std::make_unique<TarReader>(indexed.path);
    shard_ = shard;
  }
  while (tar_->member() < wanted.member) {
    if (!tar_->next()) break;
  }
  if (tar_->member() != wanted.member || tar_->name() != wanted.image) {
    throw Error(indexed.path.string() + ": " + wanted.key +
                ": the shard has changed since it was "
                "indexed at the start (member " +
                std::to_string(wanted.member) + " is no longer '" + wanted.image + "')");
  }
  return tar_->read();
}

}  // namespace trainyard
