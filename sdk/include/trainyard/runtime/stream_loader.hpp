#pragma once
// The streaming loader: batches of a streaming split, read by persistent worker threads, one
// SampleStream per (rank, worker), in an order that depends only on (seed, epoch, rank).
//
// Order and partition. A rank opens R = max(1, workers) readers, reader w with
// StreamShard{rank, world_size, w, R, seed, epoch}. Each reader collates its own samples into
// batches of batch_size; the loader takes batches from the readers in a fixed round robin
// (reader 0, 1, ..., R-1, 0, ...), skipping readers that have ended. So the batch sequence is a
// function of (seed, epoch, rank, world_size, R) and never of timing.
//
// What "the same global order for any worker count" means for streams. A map-style split is
// permuted by the loader, so its order is independent of the worker count. A stream decides its
// own order per reader, and the reader count is the worker count, so a stream cannot promise
// one order for every worker count. What holds for any (world_size, workers) is the partition:
// the readers of all ranks together see every sample of the epoch exactly once (the dataset
// conformance suite checks this for every streaming plugin). A checkpoint therefore records the
// reader count, and resuming with another worker count is an error rather than a silent change
// of the data order.
//
// Equal lengths. When the source knows its size() and equal_lengths is set (the engine sets it
// for training), every reader yields exactly floor(size / (world_size * R * batch_size)) full
// batches, so every rank takes the same number of steps (DistributedSampler's drop semantics;
// at most world_size * R * batch_size - 1 samples of an epoch are left out). Readers must then be
// balanced: a reader ending before its share is a broken plugin and an error. Otherwise every
// reader runs to its end, and its last incomplete batch is kept unless drop_last.
//
// Position. state() holds the epoch, the batches taken, the round-robin cursor and, for each
// reader, the SampleStream::state() right after the last batch taken from it (batches prepared
// ahead are not part of the position). Restoring it and starting the same epoch at the same
// batch yields exactly the batches the uninterrupted run would have.

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/runtime/loader_worker_times.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

class StreamLoader {
 public:
  // Uses batch_size, drop_last, workers, prefetch, seed, place and pin of `options`; shuffle and
  // pad are the stream's business.
  StreamLoader(std::shared_ptr<const StreamSource> source, LoaderOptions options,
               bool equal_lengths);
  ~StreamLoader();
  StreamLoader(const StreamLoader&) = delete;
  StreamLoader& operator=(const StreamLoader&) = delete;

  // Readers this rank opens: max(1, workers).
  int readers() const { return readers_; }
  // Batches this rank yields per epoch, when known (equal lengths over a source with a size).
  std::optional<std::int64_t> batches_per_epoch() const;
  // Begins `epoch` at batch `first_batch`. When a restored state matches (epoch, first_batch)
  // the readers continue from it; otherwise the first `first_batch` batches are read and
  // dropped (exact, only slower).
  void start_epoch(std::int64_t epoch, std::int64_t first_batch = 0);
  std::optional<Batch> next();
  std::int64_t epoch() const { return epoch_; }
  std::int64_t position() const { return taken_; }

  // Writes the position under "loader.stream.*".
  void save_state(StateDict& out) const;
  // Reads a position written by save_state, used by the next start_epoch with the same epoch
  // and batch. Without such entries nothing changes. Throws Error when it was written by a
  // loader with another reader count or rank.
  void load_state(const StateDict& in);
  // As Loader::worker_times: slot k is reader k - 1's thread, slot 0 the consumer's.
  std::vector<WorkerTimes> worker_times() const { return worker_times_->snapshot(); }

 private:
  struct Reader;
  struct Item;
  struct Plan;
  Item take(int reader);
  void open_epoch(std::shared_ptr<const Plan> plan);

  std::shared_ptr<const StreamSource> source_;
  LoaderOptions options_;
  int readers_ = 1;
  std::optional<std::int64_t> per_reader_batches_;

  std::int64_t epoch_ = 0;
  std::int64_t taken_ = 0;   // batches taken this epoch
  int cursor_ = 0;           // the reader the next batch comes from, unless it has ended
  std::vector<std::int64_t> taken_from_;     // per reader
  std::vector<bool> ended_;                  // per reader
  std::vector<std::optional<TensorMap>> reader_state_;  // after the last batch taken
  std::shared_ptr<const Plan> restored_;     // from load_state, for the next start_epoch
  std::exception_ptr error_;                 // a reader's failure, rethrown until the next epoch

  std::unique_ptr<LoaderWorkerTimes> worker_times_ = std::make_unique<LoaderWorkerTimes>();
  std::vector<std::unique_ptr<Reader>> slots_;
};

}  // namespace trainyard
