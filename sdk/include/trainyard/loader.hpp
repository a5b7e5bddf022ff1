#pragma once
// The loader: batches of a map-style split, prepared ahead by worker threads, in an order that
// depends only on (seed, epoch) and the data-parallel place.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "trainyard/batch.hpp"
#include "trainyard/dataset.hpp"
#include "trainyard/strategy.hpp"

namespace trainyard {

struct LoaderOptions {
  std::int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = true;   // drop the last incomplete batch
  // Pad each epoch's indices (repeating the first ones) so every data-parallel rank gets the
  // same count, as PyTorch's DistributedSampler does; without it ranks get what divides.
  bool pad = true;
  int workers = 0;         // 0: batches are prepared on the calling thread
  int prefetch = 2;        // batches each worker may hold ready
  std::uint64_t seed = 0;
  DataParallelPlace place;
};

// The indices a rank visits in `epoch`, in order: a permutation seeded with seed + epoch (the
// generator and algorithm of torch.randperm, so PyTorch's DistributedSampler yields the same
// order), padded to a multiple of the rank count and strided by rank.
std::vector<std::int64_t> epoch_indices(std::int64_t dataset_size, const LoaderOptions& options,
                                        std::int64_t epoch);

class Loader {
 public:
  Loader(std::shared_ptr<const MapSource> source, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  std::int64_t batches_per_epoch() const;
  // Begins `epoch` at batch `first_batch` (non-zero when resuming mid-epoch). Batches still in
  // flight from the previous epoch are discarded.
  void start_epoch(std::int64_t epoch, std::int64_t first_batch = 0);
  // The next batch of the epoch, or nullopt at its end. Rethrows a worker's error.
  std::optional<Batch> next();
  std::int64_t epoch() const { return epoch_; }
  // Index of the batch next() returns next.
  std::int64_t position() const;
  const LoaderOptions& options() const { return options_; }

 private:
  struct Workers;
  Batch make_batch(const std::vector<std::int64_t>& indices, std::int64_t batch_index) const;

  std::shared_ptr<const MapSource> source_;
  LoaderOptions options_;
  std::int64_t epoch_ = 0;
  std::shared_ptr<const std::vector<std::int64_t>> indices_;
  std::int64_t num_batches_ = 0;
  std::int64_t next_batch_ = 0;
  std::unique_ptr<Workers> workers_;
};

}  // namespace trainyard
