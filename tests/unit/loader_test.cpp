// Unit tests of trainyard/loader.hpp: epoch order, rank sharding, batching, worker threads,
// resuming mid-epoch and errors.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/loader.hpp"
#include "trainyard/runtime/loader_worker_times.hpp"
#include "trainyard/api/sample_timing.hpp"

namespace trainyard {
namespace {

// Sample i is {"x": [i, -i], "y": i * 10}.
class CountingSource : public MapSource {
 public:
  explicit CountingSource(std::int64_t n, std::int64_t fail_at = -1,
                          std::chrono::milliseconds delay = {})
      : n_(n), fail_at_(fail_at), delay_(delay) {}
  std::int64_t size() const override { return n_; }
  TensorMap get(std::int64_t index) const override {
    if (index == fail_at_) throw std::runtime_error("sample " + std::to_string(index) + " is bad");
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    return {{"x", torch::tensor({index, -index}, torch::kLong)},
            {"y", torch::tensor(static_cast<double>(index * 10), torch::kFloat64)}};
  }

 private:
  std::int64_t n_;
  std::int64_t fail_at_;
  std::chrono::milliseconds delay_;
};

std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), 0);
  return out;
}

LoaderOptions options_with(std::int64_t batch_size, bool shuffle, bool drop_last, int workers,
                           std::uint64_t seed = 0) {
  LoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = shuffle;
  options.drop_last = drop_last;
  options.workers = workers;
  options.seed = seed;
  return options;
}

// Every remaining batch of the current epoch.
std::vector<Batch> drain(Loader& loader) {
  std::vector<Batch> out;
  while (auto batch = loader.next()) out.push_back(std::move(*batch));
  return out;
}

// The sample indices of a batch (column 0 of "x").
std::vector<std::int64_t> ids(const Batch& batch) {
  torch::Tensor x = batch.at("x").select(1, 0).contiguous();
  return std::vector<std::int64_t>(x.data_ptr<std::int64_t>(),
                                   x.data_ptr<std::int64_t>() + x.numel());
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("batch " + std::to_string(i));
    EXPECT_EQ(a[i].size, b[i].size);
    ASSERT_EQ(a[i].tensors.size(), b[i].tensors.size());
    for (const auto& [name, tensor] : a[i].tensors) {
      ASSERT_TRUE(b[i].tensors.count(name)) << name;
      const torch::Tensor& other = b[i].tensors.at(name);
      EXPECT_EQ(tensor.dtype(), other.dtype()) << name;
      EXPECT_EQ(tensor.sizes(), other.sizes()) << name;
      EXPECT_TRUE(torch::equal(tensor, other)) << name;
    }
  }
}

TEST(LoaderTest, EpochIndicesAreDeterministicPermutations) {
  LoaderOptions options;
  options.seed = 11;
  auto a = epoch_indices(100, options, 3);
  auto b = epoch_indices(100, options, 3);
  EXPECT_EQ(a, b);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(100));
  EXPECT_NE(a, iota(100));
  EXPECT_NE(epoch_indices(100, options, 4), a);
  LoaderOptions other = options;
  other.seed = 12;
  EXPECT_NE(epoch_indices(100, other, 3), a);
  // Only seed + epoch matters.
  EXPECT_EQ(epoch_indices(100, other, 2), a);
  EXPECT_TRUE(epoch_indices(0, options, 0).empty());
}

// Reference values from PyTorch: g = torch.Generator(); g.manual_seed(s); torch.randperm(n,
// generator=g).
TEST(LoaderTest, EpochIndicesMatchTorchRandperm) {
  LoaderOptions options;
  options.seed = 0;
  EXPECT_EQ(epoch_indices(10, options, 0),
            (std::vector<std::int64_t>{4, 1, 7, 5, 3, 9, 0, 8, 6, 2}));
  options.seed = 3;
  EXPECT_EQ(epoch_indices(17, options, 2),
            (std::vector<std::int64_t>{13, 15, 9, 6, 3, 1, 4, 10, 14, 0, 7, 11, 2, 12, 8, 5, 16}));
}

TEST(LoaderTest, NoShuffleIsInOrder) {
  LoaderOptions options;
  options.shuffle = false;
  EXPECT_EQ(epoch_indices(13, options, 0), iota(13));
  EXPECT_EQ(epoch_indices(13, options, 5), iota(13));
}

TEST(LoaderTest, RankShardsAreDisjointAndCoverTheDataset) {
  const std::int64_t n = 24;
  LoaderOptions options;
  options.seed = 5;
  auto full = epoch_indices(n, options, 1);
  std::vector<std::vector<std::int64_t>> shards;
  for (int rank = 0; rank < 3; ++rank) {
    LoaderOptions ranked = options;
    ranked.place = DataParallelPlace{rank, 3};
    shards.push_back(epoch_indices(n, ranked, 1));
  }
  std::set<std::int64_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_EQ(shards[rank].size(), 8u);
    for (std::size_t i = 0; i < shards[rank].size(); ++i) {
      EXPECT_EQ(shards[rank][i], full[i * 3 + rank]);  // strided like DistributedSampler
      EXPECT_TRUE(seen.insert(shards[rank][i]).second) << "index in two shards";
    }
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(n));
}

TEST(LoaderTest, RankShardsArePaddedToEqualLength) {
  const std::int64_t n = 10;
  LoaderOptions options;
  options.seed = 2;
  auto full = epoch_indices(n, options, 0);
  // DistributedSampler: indices += indices[:padding], then indices[rank::world_size].
  auto padded = full;
  padded.push_back(full[0]);
  padded.push_back(full[1]);
  std::vector<std::int64_t> all;
  for (int rank = 0; rank < 4; ++rank) {
    LoaderOptions ranked = options;
    ranked.place = DataParallelPlace{rank, 4};
    auto shard = epoch_indices(n, ranked, 0);
    ASSERT_EQ(shard.size(), 3u) << "rank " << rank;
    for (std::size_t i = 0; i < shard.size(); ++i) EXPECT_EQ(shard[i], padded[i * 4 + rank]);
    all.insert(all.end(), shard.begin(), shard.end());
  }
  std::set<std::int64_t> unique(all.begin(), all.end());
  EXPECT_EQ(unique.size(), static_cast<std::size_t>(n));
  // More ranks than samples: indices repeat to fill every rank.
  LoaderOptions many = options;
  many.shuffle = false;
  many.place = DataParallelPlace{6, 7};
  EXPECT_EQ(epoch_indices(3, many, 0), (std::vector<std::int64_t>{0}));
  // Without padding ranks get disjoint shards that still cover the dataset.
  std::set<std::int64_t> unpadded;
  std::size_t total = 0;
  for (int rank = 0; rank < 4; ++rank) {
    LoaderOptions ranked = options;
    ranked.pad = false;
    ranked.place = DataParallelPlace{rank, 4};
    auto shard = epoch_indices(n, ranked, 0);
    total += shard.size();
    unpadded.insert(shard.begin(), shard.end());
  }
  EXPECT_EQ(unpadded.size(), total);
}

TEST(LoaderTest, BatchSizesWithAndWithoutDropLast) {
  auto source = std::make_shared<CountingSource>(10);
  {
    Loader loader(source, options_with(4, false, true, 0));
    EXPECT_EQ(loader.batches_per_epoch(), 2);
    auto batches = drain(loader);
    ASSERT_EQ(batches.size(), 2u);
    EXPECT_EQ(batches[0].size, 4);
    EXPECT_EQ(batches[1].size, 4);
    EXPECT_EQ(ids(batches[0]), (std::vector<std::int64_t>{0, 1, 2, 3}));
    EXPECT_EQ(ids(batches[1]), (std::vector<std::int64_t>{4, 5, 6, 7}));
    EXPECT_EQ(batches[0].at("x").sizes(), (std::vector<std::int64_t>{4, 2}));
    EXPECT_EQ(batches[0].at("y").sizes(), (std::vector<std::int64_t>{4}));
    EXPECT_DOUBLE_EQ(batches[1].at("y")[1].item<double>(), 50.0);
    EXPECT_FALSE(loader.next().has_value());  // stays at the end
  }
  {
    Loader loader(source, options_with(4, false, false, 0));
    EXPECT_EQ(loader.batches_per_epoch(), 3);
    auto batches = drain(loader);
    ASSERT_EQ(batches.size(), 3u);
    EXPECT_EQ(batches[2].size, 2);
    EXPECT_EQ(ids(batches[2]), (std::vector<std::int64_t>{8, 9}));
    EXPECT_EQ(batches[2].at("x").size(0), 2);
  }
  {
    // Exact multiples are the same either way.
    Loader keep(source, options_with(5, true, false, 0));
    Loader drop(source, options_with(5, true, true, 0));
    EXPECT_EQ(keep.batches_per_epoch(), 2);
    EXPECT_EQ(drop.batches_per_epoch(), 2);
  }
  {
    // Fewer samples than a batch.
    Loader drop(source, options_with(64, true, true, 0));
    EXPECT_EQ(drop.batches_per_epoch(), 0);
    EXPECT_FALSE(drop.next().has_value());
    Loader keep(source, options_with(64, true, false, 2));
    auto batches = drain(keep);
    ASSERT_EQ(batches.size(), 1u);
    EXPECT_EQ(batches[0].size, 10);
  }
}

TEST(LoaderTest, ShuffledEpochFollowsEpochIndices) {
  auto source = std::make_shared<CountingSource>(20);
  LoaderOptions options = options_with(6, true, false, 0, 9);
  Loader loader(source, options);
  loader.start_epoch(2);
  EXPECT_EQ(loader.epoch(), 2);
  std::vector<std::int64_t> seen;
  for (const auto& batch : drain(loader)) {
    auto part = ids(batch);
    seen.insert(seen.end(), part.begin(), part.end());
  }
  EXPECT_EQ(seen, epoch_indices(20, options, 2));
}

TEST(LoaderTest, SameBatchesForAnyWorkerCount) {
  auto source = std::make_shared<CountingSource>(23);
  std::vector<std::vector<Batch>> reference;
  {
    Loader loader(source, options_with(3, true, false, 0, 7));
    for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
      loader.start_epoch(epoch);
      reference.push_back(drain(loader));
    }
    ASSERT_EQ(reference[0].size(), 8u);
  }
  for (int workers : {1, 3}) {
    for (int prefetch : {1, 2}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + ", prefetch " + std::to_string(prefetch));
      LoaderOptions options = options_with(3, true, false, workers, 7);
      options.prefetch = prefetch;
      Loader loader(source, options);
      for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
        loader.start_epoch(epoch);
        expect_same_batches(drain(loader), reference[static_cast<std::size_t>(epoch)]);
      }
    }
  }
}

TEST(LoaderTest, ResumeYieldsTheTailOfTheEpoch) {
  auto source = std::make_shared<CountingSource>(29);
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    LoaderOptions options = options_with(4, true, false, workers, 3);
    Loader loader(source, options);
    loader.start_epoch(1);
    auto full = drain(loader);
    ASSERT_EQ(full.size(), 8u);
    for (std::int64_t first : {0, 1, 2, 5, 7, 8}) {
      SCOPED_TRACE("first batch " + std::to_string(first));
      // A fresh loader, as after a restart.
      Loader resumed(source, options);
      resumed.start_epoch(1, first);
      EXPECT_EQ(resumed.position(), first);
      std::vector<Batch> tail(full.begin() + first, full.end());
      expect_same_batches(drain(resumed), tail);
      EXPECT_EQ(resumed.position(), 8);
    }
    EXPECT_THROW(loader.start_epoch(1, 9), Error);
    EXPECT_THROW(loader.start_epoch(1, -1), Error);
  }
}

TEST(LoaderTest, StartEpochDiscardsBatchesInFlight) {
  auto source = std::make_shared<CountingSource>(40);
  LoaderOptions reference_options = options_with(4, true, true, 0, 1);
  Loader reference(source, reference_options);
  reference.start_epoch(3);
  auto expected = drain(reference);
  reference.start_epoch(0, 2);
  auto expected_tail = drain(reference);

  LoaderOptions options = options_with(4, true, true, 3, 1);
  options.prefetch = 2;
  Loader loader(source, options);
  ASSERT_TRUE(loader.next().has_value());
  ASSERT_TRUE(loader.next().has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let workers fill up
  loader.start_epoch(3);
  expect_same_batches(drain(loader), expected);
  // And back into the middle of another epoch.
  loader.start_epoch(0, 2);
  expect_same_batches(drain(loader), expected_tail);
}

TEST(LoaderTest, RankPlaceShardsBatches) {
  auto source = std::make_shared<CountingSource>(16);
  LoaderOptions options = options_with(2, false, true, 2);
  options.place = DataParallelPlace{1, 2};
  Loader loader(source, options);
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  std::vector<std::int64_t> seen;
  for (const auto& batch : drain(loader)) {
    auto part = ids(batch);
    seen.insert(seen.end(), part.begin(), part.end());
  }
  EXPECT_EQ(seen, (std::vector<std::int64_t>{1, 3, 5, 7, 9, 11, 13, 15}));
}

TEST(LoaderTest, SourceErrorsAreRethrown) {
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    // Sample 9 is in batch 2 (in order, batches of 4).
    auto source = std::make_shared<CountingSource>(20, 9);
    Loader loader(source, options_with(4, false, true, workers));
    if (workers == 0) {
      ASSERT_TRUE(loader.next().has_value());
      ASSERT_TRUE(loader.next().has_value());
    }
    bool thrown = false;
    try {
      for (int i = 0; i < 5; ++i) {
        auto batch = loader.next();
        ASSERT_TRUE(batch.has_value()) << "the epoch ended without the error";
        auto part = ids(*batch);
        EXPECT_EQ(std::count(part.begin(), part.end(), 9), 0) << "a batch with the bad sample";
      }
    } catch (const std::runtime_error& error) {
      thrown = true;
      EXPECT_NE(std::string(error.what()).find("sample 9 is bad"), std::string::npos)
          << error.what();
    }
    EXPECT_TRUE(thrown);
  }
}

// Runs `body` on another thread and reports whether it finished within `limit`. A hung body is
// left behind (detached) so the test fails instead of hanging.
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

TEST(LoaderTest, DestroyingMidEpochDoesNotHang) {
  auto source = std::make_shared<CountingSource>(200, -1, std::chrono::milliseconds(1));
  for (int workers : {1, 4}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    auto* loader = new Loader(source, options_with(8, true, true, workers));
    ASSERT_TRUE(loader->next().has_value());
    // Destroyed while workers are blocked on a full prefetch queue or preparing batches.
    EXPECT_TRUE(finishes_within(std::chrono::seconds(20), [loader] { delete loader; }));
  }
  // Destroyed before anything was consumed, and right after an error.
  auto failing = std::make_shared<CountingSource>(50, 0);
  EXPECT_TRUE(finishes_within(std::chrono::seconds(20), [failing] {
    Loader loader(failing, options_with(4, false, true, 3));
    try {
      loader.next();
    } catch (const std::exception&) {
    }
  }));
  EXPECT_TRUE(finishes_within(std::chrono::seconds(20),
                              [source] { Loader loader(source, options_with(8, true, true, 4)); }));
}

// Every sample exactly once per epoch across the ranks, for several world sizes and worker
// counts. With padding (DistributedSampler's rule) ranks get equal counts and the extra entries
// are the first ones of the epoch's permutation, repeated.
TEST(LoaderTest, RankShardingIsAPartitionForAnyWorldSizeAndWorkerCount) {
  const std::int64_t n = 23;
  auto source = std::make_shared<CountingSource>(n);
  for (int world : {1, 2, 3, 4}) {
    for (int workers : {0, 1, 3}) {
      for (bool pad : {true, false}) {
        SCOPED_TRACE("world " + std::to_string(world) + ", workers " + std::to_string(workers) +
                     ", pad " + std::to_string(pad));
        std::vector<std::int64_t> all;
        std::vector<std::size_t> counts;
        for (int rank = 0; rank < world; ++rank) {
          LoaderOptions options = options_with(4, true, false, workers, 8);
          options.pad = pad;
          options.place = DataParallelPlace{rank, world};
          Loader loader(source, options);
          loader.start_epoch(1);
          std::size_t count = 0;
          for (const auto& batch : drain(loader)) {
            auto part = ids(batch);
            all.insert(all.end(), part.begin(), part.end());
            count += part.size();
          }
          counts.push_back(count);
        }
        const auto padded = static_cast<std::size_t>((n + world - 1) / world * world);
        std::vector<std::int64_t> sorted = all;
        std::sort(sorted.begin(), sorted.end());
        if (!pad) {
          EXPECT_EQ(sorted, iota(n)) << "unpadded shards are a partition";
          continue;
        }
        for (auto count : counts) EXPECT_EQ(count, padded / static_cast<std::size_t>(world));
        ASSERT_EQ(all.size(), padded);
        // The unpadded set is covered exactly once, and the padding repeats the permutation's head.
        std::vector<std::int64_t> expected = iota(n);
        LoaderOptions unsharded = options_with(4, true, false, 0, 8);
        auto order = epoch_indices(n, unsharded, 1);
        expected.insert(expected.end(), order.begin(),
                        order.begin() + static_cast<long>(padded - static_cast<std::size_t>(n)));
        std::sort(expected.begin(), expected.end());
        EXPECT_EQ(sorted, expected);
      }
    }
  }
}

// The samples of each optimizer step of `epoch`, from `first_step` on, when `ranks` data-parallel
// ranks each take `accumulation` micro-batches of `batch_size` per step (the global batch is
// their product). Each step's samples are sorted: their order within the step does not matter.
std::vector<std::vector<std::int64_t>> samples_per_step(std::shared_ptr<const MapSource> source,
                                                        int ranks, std::int64_t batch_size,
                                                        std::int64_t accumulation,
                                                        std::int64_t epoch,
                                                        std::int64_t first_step) {
  std::vector<std::unique_ptr<Loader>> loaders;
  for (int rank = 0; rank < ranks; ++rank) {
    LoaderOptions options = options_with(batch_size, true, true, 0, 21);
    options.place = DataParallelPlace{rank, ranks};
    loaders.push_back(std::make_unique<Loader>(source, options));
    // A resumed rank starts at the first micro-batch of the step, whatever the accumulation.
    loaders.back()->start_epoch(epoch, first_step * accumulation);
  }
  std::vector<std::vector<std::int64_t>> steps;
  while (true) {
    std::vector<std::int64_t> step;
    for (auto& loader : loaders) {
      for (std::int64_t micro = 0; micro < accumulation; ++micro) {
        auto batch = loader->next();
        if (!batch) return steps;
        auto part = ids(*batch);
        step.insert(step.end(), part.begin(), part.end());
      }
    }
    std::sort(step.begin(), step.end());
    steps.push_back(std::move(step));
  }
}

// Resuming mid-epoch on another data-parallel size with the same global batch continues the
// same global sample sequence: the samples of a step are a run of the epoch's permutation that
// depends only on the global batch, however it is split into ranks and micro-batches.
TEST(LoaderTest, ResumingOnAnotherDataParallelSizeSeesEachRemainingSampleOnce) {
  for (std::int64_t samples : {96, 100}) {
    auto source = std::make_shared<CountingSource>(samples);
    const auto uninterrupted = samples_per_step(source, 4, 4, 1, 3, 0);
    ASSERT_EQ(uninterrupted.size(), 6u);
    struct Split {
      int ranks;
      std::int64_t batch_size;
      std::int64_t accumulation;
    };
    for (const Split& resumed : {Split{2, 4, 2}, Split{1, 8, 2}, Split{8, 2, 1}, Split{2, 2, 4}}) {
      SCOPED_TRACE(std::to_string(samples) + " samples, resumed on " +
                   std::to_string(resumed.ranks) + " ranks x batch " +
                   std::to_string(resumed.batch_size) + " x accumulation " +
                   std::to_string(resumed.accumulation));
      const std::int64_t interrupted_at = 2;
      auto before = samples_per_step(source, 4, 4, 1, 3, 0);
      before.resize(interrupted_at);
      const auto after = samples_per_step(source, resumed.ranks, resumed.batch_size,
                                          resumed.accumulation, 3, interrupted_at);
      ASSERT_EQ(before.size() + after.size(), uninterrupted.size());
      std::vector<std::int64_t> seen;
      for (std::size_t step = 0; step < uninterrupted.size(); ++step) {
        const auto& actual = step < before.size() ? before[step] : after[step - before.size()];
        EXPECT_EQ(actual, uninterrupted[step]) << "step " << step;
        seen.insert(seen.end(), actual.begin(), actual.end());
      }
      std::sort(seen.begin(), seen.end());
      EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end())
          << "a sample was seen twice in the epoch";
      EXPECT_EQ(seen.size(), 96u);
    }
  }
}

TEST(LoaderTest, ShufflesDifferAcrossEpochsAndAgreeAcrossWorkerCounts) {
  auto source = std::make_shared<CountingSource>(64);
  std::vector<std::vector<std::int64_t>> orders;  // per worker count, epochs 0 and 1 joined
  for (int workers : {0, 1, 3}) {
    Loader loader(source, options_with(8, true, true, workers, 21));
    std::vector<std::int64_t> epoch0, epoch1;
    loader.start_epoch(0);
    for (const auto& batch : drain(loader)) {
      auto part = ids(batch);
      epoch0.insert(epoch0.end(), part.begin(), part.end());
    }
    loader.start_epoch(1);
    for (const auto& batch : drain(loader)) {
      auto part = ids(batch);
      epoch1.insert(epoch1.end(), part.begin(), part.end());
    }
    EXPECT_NE(epoch0, epoch1) << "workers " << workers;
    epoch0.insert(epoch0.end(), epoch1.begin(), epoch1.end());
    orders.push_back(epoch0);
  }
  EXPECT_EQ(orders[0], orders[1]);
  EXPECT_EQ(orders[0], orders[2]);
}

TEST(LoaderTest, FinishHookIsAppliedToEveryBatch) {
  auto source = std::make_shared<CountingSource>(20);
  for (int workers : {0, 2}) {
    LoaderOptions options = options_with(4, true, true, workers);
    auto calls = std::make_shared<std::atomic<int>>(0);
    options.finish_batch = [calls](Batch batch) {
      ++*calls;
      batch.tensors["finished"] = torch::ones({batch.size});
      return batch;
    };
    Loader loader(source, options);
    auto batches = drain(loader);
    EXPECT_EQ(calls->load(), static_cast<int>(batches.size())) << "workers " << workers;
    for (const auto& batch : batches) EXPECT_EQ(batch.tensors.count("finished"), 1u);
  }
}

TEST(LoaderTest, DottedNamesCollateLikeNestedMaps) {
  std::vector<TensorMap> samples;
  for (std::int64_t i = 0; i < 3; ++i) {
    samples.push_back({{"input.ids", torch::full({4}, i, torch::kLong)},
                       {"input.mask", torch::ones({4}, torch::kBool)},
                       {"target", torch::scalar_tensor(i, torch::kLong)}});
  }
  Batch batch = collate(samples);
  EXPECT_EQ(batch.size, 3);
  EXPECT_EQ(batch.at("input.ids").sizes(), (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(batch.at("input.mask").dtype(), torch::kBool);
  EXPECT_EQ(batch.at("target")[2].item<std::int64_t>(), 2);
}

TEST(LoaderTest, DefaultWorkersFollowCoresPerLocalRank) {
  EXPECT_EQ(default_loader_workers(2, 1), 1);
  EXPECT_EQ(default_loader_workers(8, 1), 2);
  EXPECT_EQ(default_loader_workers(16, 1), 4);
  EXPECT_EQ(default_loader_workers(64, 1), 4);
  EXPECT_EQ(default_loader_workers(16, 4), 1);
  EXPECT_EQ(default_loader_workers(128, 8), 4);
  // One core per rank: no worker competes with the step for it.
  EXPECT_EQ(default_loader_workers(2, 2), 0);
  EXPECT_EQ(default_loader_workers(1, 8), 0);
  EXPECT_EQ(default_loader_workers(0, 0), 0);
}

TEST(LoaderTest, InvalidOptionsAreErrors) {
  auto source = std::make_shared<CountingSource>(10);
  EXPECT_THROW(Loader(nullptr, LoaderOptions{}), Error);
  EXPECT_THROW(Loader(source, options_with(0, true, true, 0)), Error);
  EXPECT_THROW(Loader(source, options_with(4, true, true, -1)), Error);
}

TEST(LoaderTest, EmptySource) {
  auto source = std::make_shared<CountingSource>(0);
  Loader loader(source, options_with(4, true, false, 2));
  EXPECT_EQ(loader.batches_per_epoch(), 0);
  EXPECT_FALSE(loader.next().has_value());
}

// The automatic loader changes the worker count mid-epoch: the batches and their order must be
// those of any fixed count.
TEST(LoaderTest, ChangingTheWorkersMidEpochKeepsTheBatches) {
  auto source = std::make_shared<CountingSource>(53);
  Loader reference(source, options_with(4, true, true, 0, 5));
  reference.start_epoch(2);
  const auto expected = drain(reference);
  ASSERT_EQ(expected.size(), 13u);
  Loader loader(source, options_with(4, true, true, 0, 5));
  loader.start_epoch(2);
  std::vector<Batch> got;
  const std::vector<int> counts = {0, 2, 1, 3, 0};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (i % 3 == 1) loader.set_workers(counts[(i / 3) % counts.size()] + 1);
    if (i % 3 == 2) loader.set_workers(counts[(i / 3) % counts.size()]);
    auto batch = loader.next();
    ASSERT_TRUE(batch);
    got.push_back(std::move(*batch));
  }
  EXPECT_FALSE(loader.next());
  expect_same_batches(got, expected);
  // The count holds into the next epoch.
  loader.set_workers(2);
  EXPECT_EQ(loader.workers(), 2);
  loader.start_epoch(2);
  expect_same_batches(drain(loader), expected);
  EXPECT_THROW(loader.set_workers(-1), Error);
}

}  // namespace
}  // namespace trainyard

namespace trainyard {
namespace {

// Sample i is {"draw": the seed its random draws came from, "index": i}; each sample takes a
// measurable "decode" and "transform" time.
class DrawingSource : public MapSource {
 public:
  explicit DrawingSource(std::int64_t n) : n_(n) {}
  std::int64_t size() const override { return n_; }
  TensorMap get(std::int64_t index) const override { return sample(index, SampleDraws{}); }
  Batch get_batch_drawn(std::span<const std::int64_t> indices,
                        const SampleDraws& draws) const override {
    std::vector<TensorMap> samples;
    for (const std::int64_t index : indices) samples.push_back(sample(index, draws));
    return collate(samples);
  }

 private:
  static TensorMap sample(std::int64_t index, const SampleDraws& draws) {
    {
      const SampleTimer decode(SampleStage::kDecode);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const SampleTimer transform(SampleStage::kTransform);
    return {{"draw", torch::tensor(static_cast<std::int64_t>(draws.for_sample(index) >> 1))},
            {"index", torch::tensor(index)}};
  }
  std::int64_t n_;
};

// The draws of every sample of `epoch` by index, through a loader with `workers` and `ranks`.
std::map<std::int64_t, std::int64_t> draws_of_epoch(int workers, int ranks, std::int64_t epoch) {
  std::map<std::int64_t, std::int64_t> draws;
  for (int rank = 0; rank < ranks; ++rank) {
    LoaderOptions options = options_with(4, true, false, workers, 7);
    options.place = {rank, ranks};
    Loader loader(std::make_shared<DrawingSource>(24), options);
    loader.start_epoch(epoch);
    while (auto batch = loader.next()) {
      for (std::int64_t i = 0; i < batch->size; ++i) {
        draws[batch->at("index")[i].item<std::int64_t>()] = batch->at("draw")[i].item<std::int64_t>();
      }
    }
  }
  return draws;
}

TEST(LoaderDraws, EachSampleDrawsByItsIndexAndEpochWhateverTheWorkersAndRanks) {
  const auto reference = draws_of_epoch(0, 1, 3);
  ASSERT_EQ(reference.size(), 24u);
  EXPECT_EQ(draws_of_epoch(1, 1, 3), reference);
  EXPECT_EQ(draws_of_epoch(4, 1, 3), reference);
  EXPECT_EQ(draws_of_epoch(2, 2, 3), reference);
  // Another epoch, other draws; and no two samples share a stream.
  const auto next_epoch = draws_of_epoch(0, 1, 4);
  std::set<std::int64_t> distinct;
  for (const auto& [index, draw] : reference) {
    EXPECT_NE(draw, next_epoch.at(index)) << "sample " << index;
    distinct.insert(draw);
  }
  EXPECT_EQ(distinct.size(), reference.size());
  EXPECT_NE((SampleDraws{1, 0}.for_sample(5)), (SampleDraws{2, 0}.for_sample(5)));
}

TEST(LoaderWorkerTimes, EachThreadReportsItsBatchesAndTheStagesTheDatasetTimed) {
  // The loader starts epoch 0 itself: a second start would discard (and count) batches prepared.
  Loader loader(std::make_shared<DrawingSource>(32), options_with(4, true, true, 2));
  while (loader.next()) {
  }
  const std::vector<WorkerTimes> times = loader.worker_times();
  ASSERT_EQ(times.size(), 3u);  // the training thread's slot and two workers
  EXPECT_EQ(times[0].batches, 0);
  EXPECT_EQ(times[1].batches + times[2].batches, 8);
  EXPECT_EQ(times[1].samples + times[2].samples, 32);
  for (std::size_t slot = 1; slot < 3; ++slot) {
    // Four samples of at least 200 us of decode in each batch, inside the batch's busy time.
    EXPECT_GE(times[slot].stages[SampleStage::kDecode], times[slot].batches * 4 * 200'000);
    EXPECT_GE(times[slot].busy_ns, times[slot].stages[SampleStage::kDecode]);
  }
  const auto lines = describe_worker_times(times);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("loader worker 0: "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("decode "), std::string::npos) << lines[0];
}

TEST(LoaderWorkerTimes, AdviceOnlyWhenStepsWaitedAndTheWorkersWereTheLimit) {
  WorkerTimes busy;
  busy.busy_ns = 9'000'000'000;
  busy.batches = 100;
  const std::vector<WorkerTimes> saturated = {{}, busy};
  // One worker busy 9 s of a 10 s run while steps waited 30% of their time: more workers.
  const auto advice = advise_loader_workers(saturated, 1, 10.0, 0.3);
  ASSERT_TRUE(advice.has_value());
  EXPECT_NE(advice->find("raise loader.workers"), std::string::npos) << *advice;
  // The same worker on a 100 s run idled: the wait has another cause.
  EXPECT_FALSE(advise_loader_workers(saturated, 1, 100.0, 0.3).has_value());
  // Little waiting: nothing to say.
  EXPECT_FALSE(advise_loader_workers(saturated, 1, 10.0, 0.01).has_value());
  // No workers at all and steps waited.
  const auto in_line = advise_loader_workers({busy}, 0, 10.0, 0.3);
  ASSERT_TRUE(in_line.has_value());
  EXPECT_NE(in_line->find("set loader.workers"), std::string::npos) << *in_line;
}

}  // namespace
}  // namespace trainyard
