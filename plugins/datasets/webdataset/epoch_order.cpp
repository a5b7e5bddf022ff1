#include "epoch_order.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

// Salt of the shard order's seed, so that it draws apart from every sample's augmentation seed.
constexpr std::uint64_t kShardOrderSalt = 0x5348415244530000ULL;  // "SHARDS"

void check_layout(const StreamShard& shard) {
  if (shard.world_size < 1 || shard.rank < 0 || shard.rank >= shard.world_size ||
      shard.workers < 1 || shard.worker < 0 || shard.worker >= shard.workers || shard.epoch < 0) {
    throw Error("webdataset: invalid stream reader (rank " + std::to_string(shard.rank) + " of " +
                std::to_string(shard.world_size) + ", worker " + std::to_string(shard.worker) +
                " of " + std::to_string(shard.workers) + ", epoch " + std::to_string(shard.epoch) +
                ")");
  }
}

}  // namespace

std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t limit = max - (max % n + 1) % n;  // a multiple of n, less one
  std::uint64_t value = rng();
  while (value > limit) value = rng();
  return value % n;
}

EpochOrder::EpochOrder(const ShardIndex& index, const StreamShard& shard, bool permute_shards) {
  check_layout(shard);
  shards_.resize(index.shards.size());
  std::iota(shards_.begin(), shards_.end(), std::int64_t{0});
  if (permute_shards && shards_.size() > 1) {
    // Fisher-Yates with the portable draw above.
    std::mt19937_64 rng(SampleDraws{shard.seed ^ kShardOrderSalt, shard.epoch}.for_sample(0));
    for (std::size_t i = shards_.size() - 1; i > 0; --i) {
      std::swap(shards_[i], shards_[uniform_below(rng, i + 1)]);
    }
  }
  starts_.push_back(0);
  for (const std::int64_t s : shards_) {
    const auto u = static_cast<std::size_t>(s);
    starts_.push_back(starts_.back() + index.first[u + 1] - index.first[u]);
  }
  const std::int64_t size = starts_.back();
  const std::int64_t readers = static_cast<std::int64_t>(shard.world_size) * shard.workers;
  const std::int64_t g = static_cast<std::int64_t>(shard.rank) * shard.workers + shard.worker;
  const std::int64_t base = size / readers;
  const std::int64_t longer = size % readers;  // the first `longer` readers take one more
  begin_ = g * base + std::min(g, longer);
  end_ = begin_ + base + (g < longer ? 1 : 0);
}

EpochOrder::Location EpochOrder::locate(std::int64_t position) const {
  // The last shard starting at or before `position` (empty shards start where the next does).
  const auto after = std::upper_bound(starts_.begin(), starts_.end() - 1, position);
  const auto i = static_cast<std::size_t>(after - starts_.begin()) - 1;
  return {shards_[i], position - starts_[i]};
}

}  // namespace trainyard
