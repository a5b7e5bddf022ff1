#pragma once
// A split of WebDataset shards as a stream: each reader reads its range of the epoch's sequence
// (epoch_order.hpp) through a shuffle buffer of raw image bytes, then decodes and transforms the
// sample it draws.
//
// Shuffle buffer. A reader keeps up to `shuffle_buffer` samples' encoded bytes (several times
// smaller than their decoded pixels); each output is drawn uniformly from the buffer by a
// 64-bit Mersenne Twister seeded from (seed, epoch, reader), and its slot takes the next sample
// read, so the buffer stays full until the range ends and then drains. shuffle_buffer = 0 keeps
// the shards in their listed order and reads every range front to back.
//
// Augmentation. A sample's random draws are seeded by SampleDraws{seed, epoch}.for_sample(its
// index in the split, shards as listed), never by the reader, so a sample looks the same under any
// layout of ranks and workers.
//
// Position. state() holds the draws made, the samples emitted and skipped, and the read cursor:
// positions read, and the shard and member the next read starts at (the place in each shard is
// part of the checkpoint), with the reader's identity and range to check on restore. restore()
// replays the draws from the range's start on the index alone (no shard is read, nothing is
// decoded), checks that the replay reads up to the saved cursor, then reads the bytes of the
// samples the buffer holds at that point: the samples that follow are exactly the uninterrupted
// reader's.
//
// Bad images. A sample whose image does not decode (damaged pixels the index could not see) is
// refused with an Error "<shard>: <key>: <why>", or with skip_bad left out, reported on stderr and
// to the run summary (report_skipped_sample, each time a reader meets it) and counted in the
// state. A skipped sample shortens its reader's range by one: past the few samples the loader's
// equal lengths drop, the loader refuses the epoch as unbalanced.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "decoded_image.hpp"
#include "image_transforms.hpp"
#include "shard_index.hpp"
#include "trainyard/api/dataset.hpp"

namespace trainyard {

// What every reader of one split shares.
struct SplitReading {
  std::shared_ptr<const ShardIndex> index;
  std::shared_ptr<const ImageTransforms> transforms;
  ColorMode mode = ColorMode::kRgb;
  // The [C, H, W] every sample of the split has.
  std::vector<std::int64_t> shape;
  // Samples each reader holds to shuffle; 0: the shard order as listed, no shuffling.
  std::int64_t shuffle_buffer = 0;
  bool skip_bad = false;
};

class WebDatasetStream final : public StreamSource {
 public:
  explicit WebDatasetStream(std::shared_ptr<const SplitReading> split) : split_(std::move(split)) {}
  std::unique_ptr<SampleStream> open(const StreamShard& shard) const override;
  std::optional<std::int64_t> size() const override { return split_->index->size(); }

 private:
  std::shared_ptr<const SplitReading> split_;
};

// One sample as every reader makes it: {"input": float [C, H, W] (contiguous), "target": long
// scalar, "sample_index": long scalar (its index in the split)}. The stream loader stacks samples
// into contiguous batches itself, so [dataset.transforms] channels_last does not reach a stream's
// batches; a model that wants channels-last activations (resnet's channels_last) converts its
// input. Throws Error "<shard>: <key>: <why>" for an image that does not decode, or that does not
// make a sample of `split.shape` (when not empty).
TensorMap make_sample(const SplitReading& split, std::int64_t shard, std::int64_t sample,
                      const std::vector<std::uint8_t>& bytes, const SampleDraws& draws);

}  // namespace trainyard
