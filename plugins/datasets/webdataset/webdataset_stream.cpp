#include "webdataset_stream.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <string>

#include "epoch_order.hpp"
#include "image_cursor.hpp"
#include "image_decode.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/sample_index.hpp"
#include "trainyard/api/sample_timing.hpp"
#include "trainyard/api/skipped_samples.hpp"

namespace trainyard {
namespace {

// Salt of the shuffle buffer's seed, apart from the shard order's and the samples' seeds.
constexpr std::uint64_t kBufferSalt = 0x4255464645520000ULL;  // "BUFFER"

at::Tensor longs(const std::vector<std::int64_t>& values) {
  return at::tensor(values, at::TensorOptions(at::kLong));
}

// One reader: its range of the epoch's sequence through its shuffle buffer.
class ShardReader final : public SampleStream {
 public:
  ShardReader(std::shared_ptr<const SplitReading> split, const StreamShard& shard)
      : split_(std::move(split)),
        shard_(shard),
        order_(*split_->index, shard, split_->shuffle_buffer > 0),
        cursor_(split_->index),
        capacity_(static_cast<std::size_t>(std::max<std::int64_t>(1, split_->shuffle_buffer))) {
    reset();
  }

  std::optional<TensorMap> next() override;
  TensorMap state() const override;
  void restore(const TensorMap& state) override;

 private:
  // A sample in the buffer: its position in the epoch's sequence and its image's bytes (empty
  // while a restore replays the draws).
  struct Held {
    std::int64_t position = 0;
    std::vector<std::uint8_t> bytes;
  };

  void reset();
  std::int64_t length() const { return order_.end() - order_.begin(); }
  Held take_next();
  void read_bytes(Held& held);
  std::optional<Held> draw();
  std::vector<std::int64_t> identity() const;
  std::vector<std::int64_t> read_cursor() const;

  std::shared_ptr<const SplitReading> split_;
  StreamShard shard_;
  EpochOrder order_;
  ImageCursor cursor_;
  std::size_t capacity_;
  std::mt19937_64 rng_;
  std::vector<Held> buffer_;
  std::int64_t read_ = 0;     // positions of the range read into the buffer
  std::int64_t drawn_ = 0;    // samples drawn from the buffer
  std::int64_t emitted_ = 0;  // of those, samples returned
  std::int64_t skipped_ = 0;  // of those, samples left out (skip_bad)
  bool fetch_ = true;         // read bytes as samples enter the buffer (not while replaying)
};

void ShardReader::reset() {
  const std::int64_t reader =
      static_cast<std::int64_t>(shard_.rank) * shard_.workers + shard_.worker;
  rng_.seed(SampleDraws{shard_.seed ^ kBufferSalt, shard_.epoch}.for_sample(reader));
  buffer_.clear();
  cursor_.close();
  read_ = drawn_ = emitted_ = skipped_ = 0;
  fetch_ = true;
}

void ShardReader::read_bytes(Held& held) {
  const SampleTimer timer(SampleStage::kRead);
  const EpochOrder::Location at = order_.locate(held.position);
  held.bytes = cursor_.read(at.shard, at.sample);
}

ShardReader::Held ShardReader::take_next() {
  Held held{order_.begin() + read_++, {}};
  if (fetch_) read_bytes(held);
  return held;
}

std::optional<ShardReader::Held> ShardReader::draw() {
  while (buffer_.size() < capacity_ && read_ < length()) buffer_.push_back(take_next());
  if (buffer_.empty()) return std::nullopt;
  const std::size_t slot = buffer_.size() == 1 ? 0 : uniform_below(rng_, buffer_.size());
  Held out = std::move(buffer_[slot]);
  if (read_ < length()) {
    buffer_[slot] = take_next();
  } else {
    if (slot + 1 != buffer_.size()) buffer_[slot] = std::move(buffer_.back());
    buffer_.pop_back();
  }
  ++drawn_;
  return out;
}

std::optional<TensorMap> ShardReader::next() {
  while (std::optional<Held> held = draw()) {
    const EpochOrder::Location at = order_.locate(held->position);
    try {
      TensorMap sample =
          make_sample(*split_, at.shard, at.sample, held->bytes, {shard_.seed, shard_.epoch});
      ++emitted_;
      return sample;
    } catch (const Error& error) {
      if (!split_->skip_bad) throw;
      ++skipped_;
      report_skipped_sample(error.what());
      std::cerr << "webdataset: skipped " << error.what() << " (dataset.on_bad_sample = \"skip\")"
                << std::endl;
    }
  }
  return std::nullopt;
}

std::vector<std::int64_t> ShardReader::identity() const {
  return {static_cast<std::int64_t>(shard_.seed),
          shard_.epoch,
          shard_.rank,
          shard_.world_size,
          shard_.worker,
          shard_.workers,
          split_->index->size(),
          split_->shuffle_buffer,
          order_.begin(),
          order_.end()};
}

// Positions read, then the shard and member the next read starts at (-1, -1 at the range's end).
std::vector<std::int64_t> ShardReader::read_cursor() const {
  if (read_ >= length()) return {read_, -1, -1};
  const EpochOrder::Location at = order_.locate(order_.begin() + read_);
  const IndexedShard& shard = split_->index->shards[static_cast<std::size_t>(at.shard)];
  return {read_, at.shard, shard.samples[static_cast<std::size_t>(at.sample)].member};
}

TensorMap ShardReader::state() const {
  return {{"reader", longs(identity())},
          {"counts", longs({drawn_, emitted_, skipped_})},
          {"cursor", longs(read_cursor())}};
}

std::vector<std::int64_t> saved_values(const TensorMap& state, const std::string& name,
                                       std::size_t count) {
  const auto it = state.find(name);
  if (it == state.end() || it->second.numel() != static_cast<std::int64_t>(count)) {
    throw Error("webdataset stream state lacks '" + name + "' (" + std::to_string(count) +
                " numbers): it was not saved by this dataset");
  }
  const at::Tensor values = it->second.to(at::kLong).contiguous();
  return {values.data_ptr<std::int64_t>(), values.data_ptr<std::int64_t>() + count};
}

void ShardReader::restore(const TensorMap& state) {
  const std::vector<std::int64_t> expected = identity();
  if (saved_values(state, "reader", expected.size()) != expected) {
    throw Error(
        "webdataset stream state belongs to another reader or split (saved [seed, epoch, "
        "rank, world_size, worker, workers, samples, shuffle_buffer, begin, end] differ "
        "from this reader's)");
  }
  const std::vector<std::int64_t> counts = saved_values(state, "counts", 3);
  const std::vector<std::int64_t> cursor = saved_values(state, "cursor", 3);
  if (counts[0] < 0 || counts[1] < 0 || counts[2] < 0 || counts[1] + counts[2] != counts[0]) {
    throw Error("webdataset stream state has inconsistent counts (drawn, emitted, skipped)");
  }
  reset();
  fetch_ = false;
  while (drawn_ < counts[0]) {
    if (!draw())
      throw Error("webdataset stream state has more draws than the reader's range holds");
  }
  fetch_ = true;
  if (read_cursor() != cursor) {
    throw Error("webdataset stream state's read cursor (shard " + std::to_string(cursor[1]) +
                ", member " + std::to_string(cursor[2]) +
                ") is not where replaying its draws "
                "leads (shard " +
                std::to_string(read_cursor()[1]) + ", member " + std::to_string(read_cursor()[2]) +
                "): the shards have changed since it was saved");
  }
  emitted_ = counts[1];
  skipped_ = counts[2];
  // The held samples' bytes, read in the order of their positions: one pass over the shards.
  std::vector<Held*> held;
  for (Held& h : buffer_) held.push_back(&h);
  std::sort(held.begin(), held.end(),
            [](const Held* a, const Held* b) { return a->position < b->position; });
  for (Held* h : held) read_bytes(*h);
}

}  // namespace

std::unique_ptr<SampleStream> WebDatasetStream::open(const StreamShard& shard) const {
  return std::make_unique<ShardReader>(split_, shard);
}

TensorMap make_sample(const SplitReading& split, std::int64_t shard, std::int64_t sample,
                      const std::vector<std::uint8_t>& bytes, const SampleDraws& draws) {
  const ShardIndex& index = *split.index;
  const IndexedShard& indexed = index.shards[static_cast<std::size_t>(shard)];
  const IndexedSample& item = indexed.samples[static_cast<std::size_t>(sample)];
  const std::int64_t global = index.first[static_cast<std::size_t>(shard)] + sample;
  const std::string source = indexed.path.string() + ": " + item.key;
  const DecodedImage image = decode_image(bytes, source, split.mode);
  const at::Tensor input = split.transforms->apply(image, draws.for_sample(global));
  if (!split.shape.empty()) check_sample_shape(input, split.shape, source);
  return {{"input", input},
          {"target", at::scalar_tensor(item.label, at::kLong)},
          {kSampleIndexKey, at::scalar_tensor(global, at::kLong)}};
}

}  // namespace trainyard
