// Dataset conformance: info() matches the samples, splits are map-style xor streaming, map
// splits are deterministic, batch-consistent and thread-safe.

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "conformance.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"

namespace {

using namespace trainyard;

class DatasetConformance : public ::testing::TestWithParam<std::string> {
 protected:
  // Built once per plugin (loading real data is slow); kept for the whole process.
  std::shared_ptr<Dataset> dataset() {
    static std::mutex mutex;
    static auto* cache = new std::map<std::string, std::shared_ptr<Dataset>>;
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = (*cache)[GetParam()];
    if (!slot) {
      slot = conformance::registry().create<Dataset>(GetParam(), conformance::under_test("dataset"),
                                                     conformance::classification_context());
    }
    return slot;
  }

  void SetUp() override {
    // A dataset that reads only files it must be given (token shards) declares them as required
    // options; it is tested through a plugin sharing its code with defaults, and by its own
    // tests. Any other dataset must build from its defaults.
    const std::string reason = conformance::why_not_buildable_from_defaults("dataset", GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
    dataset();
  }

  std::vector<std::string> map_splits() {
    std::vector<std::string> out;
    for (const auto& split : dataset()->splits()) {
      if (dataset()->map_split(split)) out.push_back(split);
    }
    return out;
  }

  // A few indices spread over the split, some repeated, not sorted.
  static std::vector<std::int64_t> probe_indices(std::int64_t size) {
    std::vector<std::int64_t> out = {size - 1, 0, size / 2, size / 3, 0};
    if (size > 7) out.push_back(7);
    return out;
  }
};

void expect_same_tensors(const TensorMap& a, const TensorMap& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, tensor] : a) {
    auto it = b.find(name);
    ASSERT_NE(it, b.end()) << what << ": missing '" << name << "'";
    const auto& other = it->second;
    EXPECT_EQ(tensor.scalar_type(), other.scalar_type()) << what << ": '" << name << "'";
    ASSERT_TRUE(tensor.sizes().equals(other.sizes()))
        << what << ": '" << name << "' " << tensor.sizes() << " vs " << other.sizes();
    EXPECT_TRUE(at::equal(tensor, other)) << what << ": '" << name << "' differs";
  }
}

void check_sample(const TensorMap& sample, const DatasetInfo& info, const std::string& what) {
  auto input = sample.find("input");
  ASSERT_NE(input, sample.end()) << what << ": sample has no 'input'";
  EXPECT_EQ(input->second.sizes().vec(), info.input_shape) << what;
  if (info.num_classes > 0) {
    auto target = sample.find("target");
    ASSERT_NE(target, sample.end()) << what << ": classification sample has no 'target'";
    const auto& t = target->second;
    EXPECT_EQ(t.dim(), 0) << what << ": a sample's target is one class index";
    EXPECT_FALSE(at::isFloatingType(t.scalar_type())) << what << ": target must be integral";
    EXPECT_GE(t.min().item<std::int64_t>(), 0) << what;
    EXPECT_LT(t.max().item<std::int64_t>(), info.num_classes) << what;
  }
}

TEST_P(DatasetConformance, SplitsAreEachExactlyOneKind) {
  auto splits = dataset()->splits();
  ASSERT_FALSE(splits.empty());
  for (const auto& split : splits) {
    const bool map = dataset()->map_split(split) != nullptr;
    const bool stream = dataset()->stream_split(split) != nullptr;
    EXPECT_NE(map, stream) << "split '" << split << "' must be exactly one of map or stream";
  }
}

TEST_P(DatasetConformance, UnknownSplitIsNull) {
  EXPECT_EQ(dataset()->map_split("no_such_split_xyz"), nullptr);
  EXPECT_EQ(dataset()->stream_split("no_such_split_xyz"), nullptr);
}

TEST_P(DatasetConformance, InfoMatchesSamples) {
  const DatasetInfo info = dataset()->info();
  EXPECT_FALSE(info.input_shape.empty());
  for (auto d : info.input_shape) EXPECT_GT(d, 0);
  EXPECT_GE(info.num_classes, 0);
  for (const auto& split : dataset()->splits()) {
    if (auto source = dataset()->map_split(split)) {
      ASSERT_GT(source->size(), 0) << "split '" << split << "' is empty";
      for (auto index : probe_indices(source->size())) {
        check_sample(source->get(index), info, split + "[" + std::to_string(index) + "]");
      }
    } else if (auto stream_source = dataset()->stream_split(split)) {
      auto stream = stream_source->open(StreamShard{});
      ASSERT_NE(stream, nullptr) << split;
      for (int i = 0; i < 3; ++i) {
        auto sample = stream->next();
        if (!sample) break;
        check_sample(*sample, info, split + " stream sample " + std::to_string(i));
      }
    }
  }
}

TEST_P(DatasetConformance, MapGetIsDeterministic) {
  for (const auto& split : map_splits()) {
    auto source = dataset()->map_split(split);
    EXPECT_EQ(dataset()->map_split(split)->size(), source->size());
    for (auto index : probe_indices(source->size())) {
      TensorMap first = source->get(index);
      TensorMap second = source->get(index);
      expect_same_tensors(first, second, split + ".get(" + std::to_string(index) + ") twice");
    }
  }
}

TEST_P(DatasetConformance, MapGetBatchEqualsCollatedGet) {
  for (const auto& split : map_splits()) {
    auto source = dataset()->map_split(split);
    auto indices = probe_indices(source->size());
    std::vector<TensorMap> samples;
    for (auto index : indices) samples.push_back(source->get(index));
    Batch expected = collate(samples);
    Batch batch = source->get_batch(indices);
    EXPECT_EQ(batch.size, static_cast<std::int64_t>(indices.size())) << split;
    expect_same_tensors(batch.tensors, expected.tensors, split + ".get_batch vs collate(get)");
    // The caller's index buffer may be reused at once: the batch must not alias it.
    std::vector<std::int64_t> scratch = indices;
    Batch again = source->get_batch(scratch);
    std::fill(scratch.begin(), scratch.end(), 0);
    expect_same_tensors(again.tensors, expected.tensors, split + ".get_batch after reuse");
  }
}

// A sample drawn with the loader's draws depends on its index and the draws alone: not on the
// batch it is in, nor its place there (so any worker count and any rank layout give the same
// samples), and SampleDraws{} gives what get() gives.
TEST_P(DatasetConformance, MapDrawnSamplesDependOnTheirIndexAndDrawsAlone) {
  for (const auto& split : map_splits()) {
    auto source = dataset()->map_split(split);
    const std::vector<std::int64_t> indices = probe_indices(source->size());
    const SampleDraws draws{11, 3};
    const Batch batch = source->get_batch_drawn(indices, draws);
    EXPECT_EQ(batch.size, static_cast<std::int64_t>(indices.size())) << split;
    expect_same_tensors(source->get_batch_drawn(indices, draws).tensors, batch.tensors,
                        split + ".get_batch_drawn twice");
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::vector<std::int64_t> one = {indices[i]};
      TensorMap alone = source->get_batch_drawn(one, draws).tensors;
      TensorMap row;
      for (const auto& [name, tensor] : batch.tensors) row[name] = tensor.narrow(0, static_cast<std::int64_t>(i), 1);
      expect_same_tensors(alone, row, split + "[" + std::to_string(indices[i]) + "] alone vs in a batch");
    }
    expect_same_tensors(source->get_batch_drawn(indices, SampleDraws{}).tensors,
                        source->get_batch(indices).tensors,
                        split + ": SampleDraws{} vs get_batch");
  }
}

TEST_P(DatasetConformance, MapGetBatchIsThreadSafe) {
  for (const auto& split : map_splits()) {
    auto source = dataset()->map_split(split);
    const std::int64_t size = source->size();
    std::vector<std::vector<std::int64_t>> index_sets;
    for (std::int64_t t = 0; t < 8; ++t) {
      std::vector<std::int64_t> set;
      for (std::int64_t i = 0; i < 16; ++i) set.push_back((t * 977 + i * 131) % size);
      index_sets.push_back(set);
    }
    std::vector<Batch> serial;
    for (const auto& set : index_sets) serial.push_back(source->get_batch(set));

    constexpr int kThreads = 4;
    constexpr int kRounds = 5;
    std::vector<std::vector<Batch>> parallel(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          for (int round = 0; round < kRounds; ++round) {
            for (std::size_t s = 0; s < index_sets.size(); ++s) {
              parallel[t].push_back(source->get_batch(index_sets[(s + t) % index_sets.size()]));
            }
          }
        } catch (const std::exception& error) {
          errors[t] = error.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t];
      for (std::size_t i = 0; i < parallel[t].size(); ++i) {
        const std::size_t s = (i % index_sets.size() + t) % index_sets.size();
        expect_same_tensors(parallel[t][i].tensors, serial[s].tensors,
                            split + " parallel get_batch, thread " + std::to_string(t));
      }
    }
  }
}

TEST_P(DatasetConformance, StreamIsDeterministicAndResumable) {
  bool any = false;
  for (const auto& split : dataset()->splits()) {
    auto source = dataset()->stream_split(split);
    if (!source) continue;
    any = true;
    StreamShard shard;
    shard.seed = 5;
    auto a = source->open(shard);
    auto b = source->open(shard);
    auto first_a = a->next();
    auto first_b = b->next();
    ASSERT_TRUE(first_a && first_b) << split << ": stream yields nothing";
    expect_same_tensors(*first_a, *first_b, split + ": same shard, same first sample");
    TensorMap position = a->state();
    auto next_a = a->next();
    auto resumed = source->open(shard);
    resumed->restore(position);
    auto next_resumed = resumed->next();
    ASSERT_EQ(next_a.has_value(), next_resumed.has_value()) << split;
    if (next_a) expect_same_tensors(*next_a, *next_resumed, split + ": restored stream");
  }
  if (!any) GTEST_SKIP() << "no streaming splits";
}

// A sample's identity for comparing readers: its names, dtypes, shapes and bytes, hashed.
std::size_t fingerprint(const TensorMap& sample) {
  std::string key;
  for (const auto& [name, tensor] : sample) {
    at::Tensor flat = tensor.contiguous().cpu();
    key += name;
    key += '|';
    key += std::string(c10::toString(flat.scalar_type()));
    for (auto d : flat.sizes()) {
      key += ',';
      key += std::to_string(d);
    }
    key += '|';
    key.append(static_cast<const char*>(flat.data_ptr()), flat.nbytes());
  }
  return std::hash<std::string>{}(key);
}

// Epochs longer than this are not read whole by the partition check.
constexpr std::size_t kMaxEpochSamples = 200000;

// The fingerprints of every sample `shard` reads this epoch (at most kMaxEpochSamples + 1).
std::vector<std::size_t> read_all(const StreamSource& source, const StreamShard& shard) {
  auto stream = source.open(shard);
  std::vector<std::size_t> out;
  while (out.size() <= kMaxEpochSamples) {
    auto sample = stream->next();
    if (!sample) break;
    out.push_back(fingerprint(*sample));
  }
  return out;
}

std::vector<std::string> stream_splits(const Dataset& dataset) {
  std::vector<std::string> out;
  for (const auto& split : dataset.splits()) {
    if (dataset.stream_split(split)) out.push_back(split);
  }
  return out;
}

// The loader opens one reader per (rank, worker) and trusts them to share out the epoch: all
// readers of a (world_size, workers) layout together read exactly the samples one reader reads,
// each reader at least its floor share of size() (so every rank can take equal batch counts).
TEST_P(DatasetConformance, StreamReadersAreDisjointAndComplete) {
  auto splits = stream_splits(*dataset());
  if (splits.empty()) GTEST_SKIP() << "no streaming splits";
  for (const auto& split : splits) {
    auto source = dataset()->stream_split(split);
    StreamShard whole;
    whole.seed = 7;
    whole.epoch = 1;
    std::vector<std::size_t> reference = read_all(*source, whole);
    ASSERT_FALSE(reference.empty()) << split << ": one reader reads nothing";
    if (reference.size() > kMaxEpochSamples) {
      ADD_FAILURE() << split << ": an epoch of over " << kMaxEpochSamples
                    << " samples with the default options is too long to check; make the "
                       "default small";
      continue;
    }
    if (auto size = source->size()) {
      EXPECT_EQ(static_cast<std::size_t>(*size), reference.size())
          << split << ": size() differs from the samples one reader reads";
    }
    std::sort(reference.begin(), reference.end());
    for (auto [world, workers] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}, {2, 3}, {3, 2}}) {
      SCOPED_TRACE(split + ": world_size " + std::to_string(world) + ", workers " +
                   std::to_string(workers));
      std::vector<std::size_t> together;
      const std::size_t readers = static_cast<std::size_t>(world * workers);
      for (int rank = 0; rank < world; ++rank) {
        for (int worker = 0; worker < workers; ++worker) {
          StreamShard shard = whole;
          shard.rank = rank;
          shard.world_size = world;
          shard.worker = worker;
          shard.workers = workers;
          auto mine = read_all(*source, shard);
          EXPECT_GE(mine.size(), reference.size() / readers)
              << "reader (rank " << rank << ", worker " << worker << ") gets less than its share";
          together.insert(together.end(), mine.begin(), mine.end());
        }
      }
      std::sort(together.begin(), together.end());
      // Disjoint: no sample twice. Complete: every sample read is one of the epoch's, and at most
      // the tail a rank count does not divide is left out (DistributedSampler's drop_last rule,
      // which keeps the ranks' step counts equal).
      EXPECT_TRUE(std::adjacent_find(together.begin(), together.end()) == together.end())
          << "readers overlap";
      EXPECT_TRUE(std::includes(reference.begin(), reference.end(), together.begin(), together.end()))
          << "the readers' samples are not the epoch's samples";
      EXPECT_LT(reference.size() - together.size(), static_cast<std::size_t>(world))
          << "readers miss " << reference.size() - together.size()
          << " samples, more than the tail the rank count does not divide";
    }
  }
}

TEST_P(DatasetConformance, StreamOrderDependsOnlyOnShardSeedAndEpoch) {
  auto splits = stream_splits(*dataset());
  if (splits.empty()) GTEST_SKIP() << "no streaming splits";
  for (const auto& split : splits) {
    auto source = dataset()->stream_split(split);
    for (std::int64_t epoch : {0, 3}) {
      StreamShard shard{1, 2, 1, 2, 11, epoch};
      auto first = read_all(*source, shard);
      // Another reader opened in between must not disturb the order.
      auto other = source->open(StreamShard{0, 2, 0, 2, 11, epoch});
      other->next();
      auto second = read_all(*source, shard);
      EXPECT_TRUE(first == second) << split << ": epoch " << epoch << " differs between opens";
    }
  }
}

TEST_P(DatasetConformance, StreamStateRestoresAnyPosition) {
  auto splits = stream_splits(*dataset());
  if (splits.empty()) GTEST_SKIP() << "no streaming splits";
  for (const auto& split : splits) {
    auto source = dataset()->stream_split(split);
    const StreamShard shard{0, 2, 1, 2, 3, 2};
    std::vector<std::size_t> all = read_all(*source, shard);
    for (std::size_t at : {std::size_t{0}, std::size_t{1}, std::size_t{7}, all.size() / 2,
                           all.size()}) {
      if (at > all.size()) continue;
      SCOPED_TRACE(split + ": state after " + std::to_string(at) + " samples");
      auto stream = source->open(shard);
      for (std::size_t i = 0; i < at; ++i) ASSERT_TRUE(stream->next().has_value());
      TensorMap position = stream->state();
      // The state is a snapshot: reading on must not change it.
      std::map<std::string, at::Tensor> copy;
      for (const auto& [name, tensor] : position) copy.emplace(name, tensor.clone());
      stream->next();
      expect_same_tensors(position, copy, "state() after further reads");
      auto resumed = source->open(shard);
      resumed->restore(position);
      std::vector<std::size_t> rest;
      for (std::size_t i = 0; i < 25; ++i) {
        auto sample = resumed->next();
        if (!sample) break;
        rest.push_back(fingerprint(*sample));
      }
      const std::size_t expected = std::min<std::size_t>(25, all.size() - at);
      ASSERT_EQ(rest.size(), expected);
      EXPECT_TRUE(std::equal(rest.begin(), rest.end(), all.begin() + static_cast<long>(at)));
    }
  }
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(DatasetConformance, "dataset");
