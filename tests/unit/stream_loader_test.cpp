// Unit tests of trainyard/stream_loader.hpp: the (rank x worker) readers partition a stream, the
// batch order is the fixed round robin whatever the timing, equal lengths per rank, exact
// resume from a saved position, errors.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/runtime/stream_loader.hpp"

namespace trainyard {
namespace {

struct RangeOptions {
  std::int64_t size = 50;
  bool know_size = true;
  bool jitter = false;           // sleep a pseudo-random few hundred microseconds per sample
  std::int64_t fail_at = -1;     // the sample whose reading throws
  int short_reader = -1;         // this global reader ends one sample early (an unbalanced plugin)
  std::shared_ptr<std::atomic<std::int64_t>> reads;  // counts samples read, when set
};

// Samples 0..size-1, permuted per (seed, epoch); of R = world_size x workers readers, reader
// g = rank x workers + worker reads positions g, g + R, g + 2R, ... of the permutation.
// Sample i is {"id": i, "x": [i, -i], "meta.square": i * i}.
class RangeStream : public SampleStream {
 public:
  RangeStream(std::vector<std::int64_t> ids, const RangeOptions& options)
      : ids_(std::move(ids)), options_(options) {}
  std::optional<TensorMap> next() override {
    if (position_ >= ids_.size()) return std::nullopt;
    const std::int64_t id = ids_[position_++];
    if (options_.reads) ++*options_.reads;
    if (id == options_.fail_at) throw std::runtime_error("sample " + std::to_string(id) + " is bad");
    if (options_.jitter) {
      std::this_thread::sleep_for(std::chrono::microseconds((id * 7919) % 400));
    }
    return TensorMap{{"id", torch::scalar_tensor(id, torch::kLong)},
                     {"x", torch::tensor({id, -id}, torch::kLong)},
                     {"meta.square", torch::scalar_tensor(id * id, torch::kLong)}};
  }
  TensorMap state() const override {
    return {{"position", torch::scalar_tensor(static_cast<std::int64_t>(position_), torch::kLong)}};
  }
  void restore(const TensorMap& state) override {
    position_ = static_cast<std::size_t>(state.at("position").item<std::int64_t>());
  }

 private:
  std::vector<std::int64_t> ids_;
  RangeOptions options_;
  std::size_t position_ = 0;
};

class RangeSource : public StreamSource {
 public:
  explicit RangeSource(RangeOptions options) : options_(options) {}
  std::unique_ptr<SampleStream> open(const StreamShard& shard) const override {
    return std::make_unique<RangeStream>(reader_ids(shard), options_);
  }
  std::optional<std::int64_t> size() const override {
    if (!options_.know_size) return std::nullopt;
    return options_.size;
  }
  // The ids reader `shard` reads, in order.
  std::vector<std::int64_t> reader_ids(const StreamShard& shard) const {
    LoaderOptions permutation;
    permutation.seed = shard.seed;
    auto order = epoch_indices(options_.size, permutation, shard.epoch);
    const int readers = shard.world_size * shard.workers;
    const int global = shard.rank * shard.workers + shard.worker;
    std::vector<std::int64_t> mine;
    for (std::size_t i = static_cast<std::size_t>(global); i < order.size();
         i += static_cast<std::size_t>(readers)) {
      mine.push_back(order[i]);
    }
    if (global == options_.short_reader && !mine.empty()) mine.pop_back();
    return mine;
  }

 private:
  RangeOptions options_;
};

LoaderOptions stream_options(std::int64_t batch_size, int workers, bool drop_last = false,
                             DataParallelPlace place = {}, std::uint64_t seed = 4) {
  LoaderOptions options;
  options.batch_size = batch_size;
  options.workers = workers;
  options.drop_last = drop_last;
  options.place = place;
  options.seed = seed;
  options.prefetch = 2;
  return options;
}

std::vector<Batch> drain(StreamLoader& loader) {
  std::vector<Batch> out;
  while (auto batch = loader.next()) out.push_back(std::move(*batch));
  return out;
}

std::vector<std::int64_t> ids(const Batch& batch) {
  torch::Tensor id = batch.at("id").contiguous();
  return std::vector<std::int64_t>(id.data_ptr<std::int64_t>(), id.data_ptr<std::int64_t>() + id.numel());
}

std::vector<std::vector<std::int64_t>> ids(const std::vector<Batch>& batches) {
  std::vector<std::vector<std::int64_t>> out;
  for (const auto& batch : batches) out.push_back(ids(batch));
  return out;
}

// The batches the round-robin rule gives: reader r's samples in batches of `batch_size`, taken
// from readers 0, 1, ..., R-1 in turn, each reader's last partial batch kept unless drop_last.
std::vector<std::vector<std::int64_t>> expected_order(const RangeSource& source,
                                                      const LoaderOptions& options,
                                                      std::int64_t epoch) {
  const int readers = std::max(1, options.workers);
  std::vector<std::vector<std::vector<std::int64_t>>> per_reader(static_cast<std::size_t>(readers));
  for (int r = 0; r < readers; ++r) {
    auto all = source.reader_ids(StreamShard{options.place.rank, options.place.size, r, readers,
                                             options.seed, epoch});
    for (std::size_t i = 0; i < all.size(); i += static_cast<std::size_t>(options.batch_size)) {
      const auto end = std::min(all.size(), i + static_cast<std::size_t>(options.batch_size));
      if (options.drop_last && end - i < static_cast<std::size_t>(options.batch_size)) break;
      per_reader[static_cast<std::size_t>(r)].emplace_back(all.begin() + static_cast<long>(i),
                                                           all.begin() + static_cast<long>(end));
    }
  }
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t round = 0;; ++round) {
    bool any = false;
    for (auto& batches : per_reader) {
      if (round < batches.size()) {
        out.push_back(batches[round]);
        any = true;
      }
    }
    if (!any) return out;
  }
}

TEST(StreamLoaderTest, ReadersOfAllRanksPartitionTheEpoch) {
  RangeOptions range;
  range.size = 53;
  auto source = std::make_shared<RangeSource>(range);
  for (int world : {1, 2, 3, 4}) {
    for (int workers : {0, 1, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", workers " + std::to_string(workers));
      std::vector<std::int64_t> seen;
      for (int rank = 0; rank < world; ++rank) {
        StreamLoader loader(source, stream_options(4, workers, false, {rank, world}), false);
        EXPECT_EQ(loader.readers(), std::max(1, workers));
        EXPECT_FALSE(loader.batches_per_epoch().has_value());
        loader.start_epoch(2);
        for (const auto& batch : drain(loader)) {
          EXPECT_EQ(batch.size, static_cast<std::int64_t>(ids(batch).size()));
          auto part = ids(batch);
          seen.insert(seen.end(), part.begin(), part.end());
        }
      }
      std::sort(seen.begin(), seen.end());
      std::vector<std::int64_t> all(static_cast<std::size_t>(range.size));
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(seen, all) << "every sample exactly once across the (rank x worker) readers";
    }
  }
}

TEST(StreamLoaderTest, EqualLengthsGiveEveryRankTheSameFullBatches) {
  RangeOptions range;
  range.size = 61;
  auto source = std::make_shared<RangeSource>(range);
  for (int world : {1, 2, 3}) {
    for (int workers : {0, 1, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", workers " + std::to_string(workers));
      const int readers = std::max(1, workers);
      const std::int64_t expected = 61 / (world * readers * 3) * readers;
      std::set<std::int64_t> seen;
      for (int rank = 0; rank < world; ++rank) {
        StreamLoader loader(source, stream_options(3, workers, false, {rank, world}), true);
        ASSERT_EQ(loader.batches_per_epoch(), expected);
        auto batches = drain(loader);
        ASSERT_EQ(static_cast<std::int64_t>(batches.size()), expected) << "rank " << rank;
        for (const auto& batch : batches) {
          EXPECT_EQ(batch.size, 3);
          for (auto id : ids(batch)) EXPECT_TRUE(seen.insert(id).second) << "id " << id << " twice";
        }
      }
    }
  }
}

TEST(StreamLoaderTest, OrderIsTheRoundRobinWhateverTheTiming) {
  RangeOptions range;
  range.size = 47;
  range.jitter = true;
  auto source = std::make_shared<RangeSource>(range);
  for (int workers : {0, 1, 3}) {
    for (bool drop_last : {false, true}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + ", drop_last " + std::to_string(drop_last));
      LoaderOptions options = stream_options(4, workers, drop_last, {1, 2});
      StreamLoader loader(source, options, false);
      for (std::int64_t epoch : {0, 1}) {
        loader.start_epoch(epoch);
        auto batches = drain(loader);
        EXPECT_EQ(ids(batches), expected_order(*source, options, epoch));
        EXPECT_EQ(loader.position(), static_cast<std::int64_t>(batches.size()));
      }
      // Samples keep their names (dotted ones too) and are stacked along dimension 0.
      loader.start_epoch(0);
      auto first = loader.next();
      ASSERT_TRUE(first.has_value());
      EXPECT_EQ(first->at("x").sizes(), (std::vector<std::int64_t>{4, 2}));
      EXPECT_TRUE(torch::equal(first->at("meta.square"), first->at("id") * first->at("id")));
    }
  }
}

TEST(StreamLoaderTest, EpochsDifferAndRepeatPerSeed) {
  auto source = std::make_shared<RangeSource>(RangeOptions{});
  StreamLoader loader(source, stream_options(5, 2), true);
  loader.start_epoch(0);
  auto epoch0 = ids(drain(loader));
  loader.start_epoch(1);
  auto epoch1 = ids(drain(loader));
  EXPECT_NE(epoch0, epoch1);
  loader.start_epoch(0);
  EXPECT_EQ(ids(drain(loader)), epoch0);
  StreamLoader other_seed(source, stream_options(5, 2, false, {}, 99), true);
  EXPECT_NE(ids(drain(other_seed)), epoch0);
}

TEST(StreamLoaderTest, ResumeFromSavedPositionYieldsTheRestOfTheEpoch) {
  RangeOptions range;
  range.size = 71;
  range.jitter = true;
  auto source = std::make_shared<RangeSource>(range);
  for (int workers : {0, 1, 3}) {
    for (bool equal_lengths : {false, true}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + ", equal lengths " +
                   std::to_string(equal_lengths));
      LoaderOptions options = stream_options(4, workers, false, {0, 2});
      StreamLoader reference(source, options, equal_lengths);
      reference.start_epoch(3);
      auto full = ids(drain(reference));
      ASSERT_GE(full.size(), 6u);
      for (std::size_t at : {std::size_t{0}, std::size_t{1}, std::size_t{4}, full.size() - 1,
                             full.size()}) {
        SCOPED_TRACE("resumed at batch " + std::to_string(at));
        StateDict saved;
        {
          StreamLoader first(source, options, equal_lengths);
          first.start_epoch(3);
          for (std::size_t i = 0; i < at; ++i) ASSERT_TRUE(first.next().has_value());
          first.save_state(saved);
          // Workers have prepared batches beyond the position; those are not part of it.
        }
        std::vector<std::vector<std::int64_t>> tail(full.begin() + static_cast<long>(at), full.end());
        // From the saved reader states, as after a restart.
        StreamLoader resumed(source, options, equal_lengths);
        resumed.load_state(saved);
        resumed.start_epoch(3, static_cast<std::int64_t>(at));
        EXPECT_EQ(resumed.position(), static_cast<std::int64_t>(at));
        EXPECT_EQ(ids(drain(resumed)), tail);
        // Without saved state the loader reads up to the position: the same batches.
        StreamLoader replayed(source, options, equal_lengths);
        replayed.start_epoch(3, static_cast<std::int64_t>(at));
        EXPECT_EQ(ids(drain(replayed)), tail);
      }
    }
  }
}

// Resuming from saved reader states does not read the epoch's head again; without them the
// loader has to.
TEST(StreamLoaderTest, ResumeFromSavedStateSkipsReading) {
  RangeOptions range;
  range.size = 200;
  range.reads = std::make_shared<std::atomic<std::int64_t>>(0);
  auto source = std::make_shared<RangeSource>(range);
  const LoaderOptions options = stream_options(4, 0);
  StateDict saved;
  {
    StreamLoader first(source, options, true);
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(first.next().has_value());
    first.save_state(saved);
  }
  range.reads->store(0);
  StreamLoader resumed(source, options, true);
  resumed.load_state(saved);
  resumed.start_epoch(0, 40);
  EXPECT_EQ(range.reads->load(), 0);
  range.reads->store(0);
  StreamLoader replayed(source, options, true);
  replayed.start_epoch(0, 40);
  EXPECT_EQ(range.reads->load(), 160);
  // Both continue alike.
  EXPECT_EQ(ids(drain(resumed)), ids(drain(replayed)));
}

TEST(StreamLoaderTest, SavedStateHoldsTheReadersPositionNotThePrefetchedOne) {
  auto source = std::make_shared<RangeSource>(RangeOptions{});
  StreamLoader loader(source, stream_options(2, 2), false);
  ASSERT_TRUE(loader.next().has_value());  // reader 0's first batch
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // workers fill their queues
  StateDict saved;
  loader.save_state(saved);
  EXPECT_EQ(saved.tensors.at("loader.stream.batch").item<std::int64_t>(), 1);
  EXPECT_EQ(saved.tensors.at("loader.stream.cursor").item<std::int64_t>(), 1);
  EXPECT_EQ(saved.tensors.at("loader.stream.reader.0.position").item<std::int64_t>(), 2);
  EXPECT_EQ(saved.tensors.count("loader.stream.reader.1.position"), 0u);
}

TEST(StreamLoaderTest, ResumingWithAnotherReaderCountIsAnError) {
  auto source = std::make_shared<RangeSource>(RangeOptions{});
  StreamLoader two(source, stream_options(2, 2), false);
  ASSERT_TRUE(two.next().has_value());
  StateDict saved;
  two.save_state(saved);
  StreamLoader three(source, stream_options(2, 3), false);
  try {
    three.load_state(saved);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("loader.workers"), std::string::npos) << error.what();
  }
  StreamLoader other_rank(source, stream_options(2, 2, false, {1, 2}), false);
  EXPECT_THROW(other_rank.load_state(saved), Error);
  // No stream entries (a map-style checkpoint): nothing to restore.
  StateDict empty;
  EXPECT_NO_THROW(three.load_state(empty));
}

TEST(StreamLoaderTest, ResumeBeyondTheEpochIsAnError) {
  auto source = std::make_shared<RangeSource>(RangeOptions{});
  StreamLoader capped(source, stream_options(5, 2), true);
  ASSERT_EQ(capped.batches_per_epoch(), 10);
  EXPECT_THROW(capped.start_epoch(0, 11), Error);
  EXPECT_THROW(capped.start_epoch(0, -1), Error);
  StreamLoader open_ended(source, stream_options(5, 2), false);
  EXPECT_THROW(open_ended.start_epoch(0, 11), Error);
}

TEST(StreamLoaderTest, UnbalancedReadersAreAnErrorWithEqualLengths) {
  RangeOptions range;
  range.size = 40;
  range.short_reader = 1;
  auto source = std::make_shared<RangeSource>(range);
  for (int workers : {0, 2}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    // 40 samples, 2 readers of batches of 5 -> 4 batches each; reader 1 has only 19 samples.
    // Global reader 1 is rank 1's only reader without workers, rank 0's second with two.
    const DataParallelPlace place = workers == 0 ? DataParallelPlace{1, 2} : DataParallelPlace{0, 1};
    StreamLoader loader(source, stream_options(5, workers, false, place), true);
    std::string message;
    try {
      drain(loader);
    } catch (const Error& error) {
      message = error.what();
    }
    EXPECT_NE(message.find("unbalanced"), std::string::npos) << message;
    EXPECT_NE(message.find("rank"), std::string::npos) << message;
  }
}

TEST(StreamLoaderTest, ReaderErrorsAreRethrownUntilTheNextEpoch) {
  RangeOptions range;
  range.fail_at = 17;
  auto source = std::make_shared<RangeSource>(range);
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    StreamLoader loader(source, stream_options(4, workers), false);
    bool thrown = false;
    try {
      drain(loader);
    } catch (const std::runtime_error& error) {
      thrown = true;
      EXPECT_NE(std::string(error.what()).find("sample 17 is bad"), std::string::npos);
    }
    EXPECT_TRUE(thrown);
    EXPECT_THROW(loader.next(), std::runtime_error);
  }
}

template <typename Body>
bool finishes_within(std::chrono::seconds limit, Body body) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread thread([done, body = std::move(body)]() mutable {
    body();
    done->set_value();
  });
  if (finished.wait_for(limit) == std::future_status::ready) {
    thread.join();
    return true;
  }
  thread.detach();
  return false;
}

TEST(StreamLoaderTest, DestroyingMidEpochDoesNotHang) {
  RangeOptions range;
  range.size = 400;
  range.jitter = true;
  auto source = std::make_shared<RangeSource>(range);
  for (int workers : {1, 4}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    auto* loader = new StreamLoader(source, stream_options(8, workers), false);
    ASSERT_TRUE(loader->next().has_value());
    EXPECT_TRUE(finishes_within(std::chrono::seconds(20), [loader] { delete loader; }));
  }
  EXPECT_TRUE(finishes_within(std::chrono::seconds(20), [source] {
    StreamLoader loader(source, stream_options(8, 3), false);
    loader.start_epoch(1);
    loader.start_epoch(2, 3);
  }));
}

TEST(StreamLoaderTest, FinishHookIsAppliedToEveryBatchByTheWorkers) {
  auto source = std::make_shared<RangeSource>(RangeOptions{});
  LoaderOptions options = stream_options(5, 2);
  auto calls = std::make_shared<std::atomic<int>>(0);
  options.finish_batch = [calls](Batch batch) {
    ++*calls;
    for (auto& [name, tensor] : batch.tensors) tensor = tensor.clone();
    return batch;
  };
  StreamLoader loader(source, options, true);
  auto batches = drain(loader);
  ASSERT_EQ(batches.size(), 10u);
  EXPECT_EQ(calls->load(), 10);
}

TEST(StreamLoaderTest, LoaderWrapsStreams) {
  auto source = std::make_shared<RangeSource>(RangeOptions{});
  LoaderOptions options = stream_options(5, 2);
  Loader loader(std::shared_ptr<const StreamSource>(source), options, true);
  EXPECT_TRUE(loader.streaming());
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  loader.start_epoch(1, 3);
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(loader.position(), 3);
  std::vector<std::vector<std::int64_t>> rest;
  while (auto batch = loader.next()) rest.push_back(ids(*batch));
  auto full = expected_order(*source, options, 1);
  EXPECT_EQ(rest, std::vector<std::vector<std::int64_t>>(full.begin() + 3, full.end()));
  RangeOptions unknown;
  unknown.know_size = false;
  Loader open_ended(std::shared_ptr<const StreamSource>(std::make_shared<RangeSource>(unknown)),
                    options, true);
  EXPECT_EQ(open_ended.batches_per_epoch(), -1);
}

}  // namespace
}  // namespace trainyard
