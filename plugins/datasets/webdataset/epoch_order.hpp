#pragma once
// Which samples a stream reader reads in one epoch, and in what order it reads them.
//
// The epoch's sequence is the split's shards, in an order permuted by (seed, epoch) when
// shuffling (else as listed), each shard's samples in their tar order, concatenated. The G =
// world_size * workers readers (reader g = rank * workers + worker) each own one contiguous range
// of that sequence, the ranges' lengths differing by at most one: together the readers read every
// sample of the split exactly once, each about size / G of them, so the loader's equal lengths
// hold. A reader's range touches only the shards it overlaps, and its first shard it enters where
// its range starts.

#include <cstdint>
#include <random>
#include <vector>

#include "shard_index.hpp"
#include "trainyard/api/dataset.hpp"

namespace trainyard {

// A uniform draw from [0, n) (n >= 1), by rejection, so it is the same on every standard library
// (std::uniform_int_distribution's algorithm is each library's own).
std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n);

class EpochOrder {
 public:
  // Throws Error for a reader outside its layout (rank >= world_size and the like).
  EpochOrder(const ShardIndex& index, const StreamShard& shard, bool permute_shards);

  // The reader's range of the epoch's sequence: [begin, end).
  std::int64_t begin() const { return begin_; }
  std::int64_t end() const { return end_; }

  struct Location {
    std::int64_t shard = 0;   // the index's shard number
    std::int64_t sample = 0;  // the sample's place in that shard
  };
  // Where position `position` of the epoch's sequence is.
  Location locate(std::int64_t position) const;

 private:
  std::vector<std::int64_t> shards_;  // the index's shard numbers, in the epoch's order
  std::vector<std::int64_t> starts_;  // starts_[i]: the position of shards_[i]'s first sample
  std::int64_t begin_ = 0;
  std::int64_t end_ = 0;
};

}  // namespace trainyard
