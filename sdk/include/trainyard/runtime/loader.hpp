#pragma once
// The loader: batches of a split, prepared ahead by worker threads, in an order that depends
// only on (seed, epoch) and the data-parallel place. Map-style splits are permuted and sharded
// here; streaming splits are read by a StreamLoader (stream_loader.hpp), which this class wraps
// so the engine drives both alike.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/state.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/runtime/loader_worker_times.hpp"

namespace trainyard {

struct LoaderOptions {
  std::int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = true;  // drop the last incomplete batch
  // Pad each epoch's indices (repeating the first ones) so every data-parallel rank gets the
  // same count, as PyTorch's DistributedSampler does; without it ranks get what divides.
  bool pad = true;
  int workers = 0;   // 0: batches are prepared on the calling thread
  int prefetch = 2;  // batches each worker may hold ready
  std::uint64_t seed = 0;
  DataParallelPlace place;
  // Applied by the worker to every batch it has collated, off the training thread. On an
  // accelerator the engine pins the batch and starts its copy to the device here (the device
  // backend's pin and prefetch); unset on the CPU.
  std::function<Batch(Batch)> finish_batch;
};

// The worker count `workers = -1` stands for: a quarter of the cores each rank on this node gets,
// at least 1 and at most 4, and none when a rank gets a single core (batches are prepared by the
// training thread). In-memory and memory-mapped data need little preparation; the cores are the
// step's.
int default_loader_workers(unsigned cores, int local_world_size);

// The indices a rank visits in `epoch`, in order: a permutation seeded with seed + epoch (the
// generator and algorithm of torch.randperm, so PyTorch's DistributedSampler yields the same
// order), padded to a multiple of the rank count and strided by rank.
std::vector<std::int64_t> epoch_indices(std::int64_t dataset_size, const LoaderOptions& options,
                                        std::int64_t epoch);

class StreamLoader;

class Loader {
 public:
  Loader(std::shared_ptr<const MapSource> source, LoaderOptions options);
  // A streaming split; `equal_lengths` as in StreamLoader (every rank the same batch count).
  Loader(std::shared_ptr<const StreamSource> source, LoaderOptions options, bool equal_lengths);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // -1 when unknown: a stream without a size, or one read to its end.
  std::int64_t batches_per_epoch() const;
  bool streaming() const { return stream_ != nullptr; }
  // Begins `epoch` at batch `first_batch` (non-zero when resuming mid-epoch). Batches still in
  // flight from the previous epoch are discarded.
  void start_epoch(std::int64_t epoch, std::int64_t first_batch = 0);
  // The next batch of the epoch, or nullopt at its end. Rethrows a worker's error.
  std::optional<Batch> next();
  std::int64_t epoch() const { return epoch_; }
  // The split's sample indices of the batch next() returns next (empty for a stream or at the
  // end of the epoch): what a run records so that another program can replay its batches.
  std::vector<std::int64_t> next_batch_indices() const;
  // Index of the batch next() returns next.
  std::int64_t position() const;
  const LoaderOptions& options() const { return options_; }
  // Worker threads preparing batches (0: prepared by the caller of next()).
  int workers() const { return options_.workers; }
  // Prepares the rest of the epoch, from position(), with `count` workers instead: batches
  // prepared ahead are dropped and prepared again. The batches and their order stay the same
  // (map-style splits only: a stream's order depends on its worker count, so it refuses).
  void set_workers(int count);
  // The position beyond (epoch, batch), for a checkpoint's per-rank state: a stream's reader
  // states (a map-style split needs none: its order follows from the seed). load_state keeps it
  // for the next start_epoch of the same epoch and batch.
  void save_state(StateDict& out) const;
  void load_state(const StateDict& in);
  // Per thread that prepared batches (slot 0 the caller of next(), slot k worker k - 1): time
  // busy and per stage, since the loader was made.
  std::vector<WorkerTimes> worker_times() const;

 private:
  struct Workers;
  // Batch `batch_index` of `indices`, with the random draws of `epoch`, timed into `slot`.
  Batch make_batch(const std::vector<std::int64_t>& indices, std::int64_t batch_index,
                   std::int64_t epoch, std::size_t slot) const;

  std::shared_ptr<const MapSource> source_;
  LoaderOptions options_;
  std::int64_t epoch_ = 0;
  std::shared_ptr<const std::vector<std::int64_t>> indices_;
  std::int64_t num_batches_ = 0;
  std::int64_t next_batch_ = 0;
  std::unique_ptr<LoaderWorkerTimes> worker_times_ = std::make_unique<LoaderWorkerTimes>();
  std::unique_ptr<Workers> workers_;
  std::unique_ptr<StreamLoader> stream_;
};

}  // namespace trainyard
