#pragma once
// Datasets: where samples come from, split by split, in map-style or streaming form.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/component.hpp"

namespace trainyard {

// What a sample's random draws (augmentation: crops, flips, jitter) are seeded by: the run's
// seed, the epoch and the sample's index in its split; never the worker, the rank or the time.
// So any worker count, any data-parallel layout and a resume mid-epoch give the same samples.
struct SampleDraws {
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
  // The seed of one sample's draws: a 64-bit mix (splitmix64) of seed, epoch and index, so
  // neighbouring samples and epochs draw independent streams.
  std::uint64_t for_sample(std::int64_t index) const;
};

// Random access to the samples of one split. Implementations must be safe to call from several
// loader threads at once and deterministic: get(i) returns the same sample every time.
class MapSource {
 public:
  virtual ~MapSource();
  virtual std::int64_t size() const = 0;
  virtual TensorMap get(std::int64_t index) const = 0;
  // A whole batch at once; the default collates get(i). Sources that hold their data in one
  // tensor override it with a single index_select.
  virtual Batch get_batch(std::span<const std::int64_t> indices) const;
  // The batch as the training loader asks for it, with the epoch's draws. Sources whose samples
  // are augmented at random override it (their get() gives the samples of SampleDraws{}); the
  // default ignores the draws and calls get_batch.
  virtual Batch get_batch_drawn(std::span<const std::int64_t> indices,
                                const SampleDraws& draws) const;
};

// The part of a stream one reader owns: readers (rank x worker) see disjoint samples, and the
// order depends only on (seed, epoch), never on timing.
struct StreamShard {
  int rank = 0;
  int world_size = 1;
  int worker = 0;
  int workers = 1;
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
};

// One reader's sequence of samples, with a position that can be saved and restored exactly.
class SampleStream {
 public:
  virtual ~SampleStream();
  // Nullopt at the end of the epoch.
  virtual std::optional<TensorMap> next() = 0;
  virtual TensorMap state() const = 0;
  virtual void restore(const TensorMap& state) = 0;
};

// A split read sequentially, for data too large to index (token shards, text corpora).
class StreamSource {
 public:
  virtual ~StreamSource();
  virtual std::unique_ptr<SampleStream> open(const StreamShard& shard) const = 0;
  // Samples per epoch across all readers, when known.
  virtual std::optional<std::int64_t> size() const { return std::nullopt; }
};

// A dataset plugin. Each split is map-style or streaming: exactly one of map_split and
// stream_split returns non-null for a split listed in splits().
class Dataset : public Component {
 public:
  static constexpr const char* kKind = "dataset";
  virtual DatasetInfo info() const = 0;
  virtual std::vector<std::string> splits() const = 0;
  virtual std::shared_ptr<const MapSource> map_split(const std::string& split) const;
  virtual std::shared_ptr<const StreamSource> stream_split(const std::string& split) const;
  // map_split() and stream_split() as the runtime takes them: the source keeps the dataset's
  // library loaded while it lives, even after the dataset and the registry are gone.
  std::shared_ptr<const MapSource> map_source(const std::string& split) const;
  std::shared_ptr<const StreamSource> stream_source(const std::string& split) const;
};

}  // namespace trainyard
