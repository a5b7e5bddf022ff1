// The webdataset dataset: tar shards made at test time by webdataset/make_shards.py, read through
// the plugin's streams directly (every sample once across the readers of two ranks of two
// workers; the same samples for the same seed, epoch and reader and another order in another
// epoch; any position restored exactly, with and without a shuffle buffer; bad shards refused at
// the start naming the shard and the key, or skipped and counted) and in real runs of the host
// (training and evaluation; killed with SIGKILL mid-epoch after a checkpoint and resumed, on one
// rank and on two, ending with the model of the uninterrupted run bit for bit).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/sample_index.hpp"
#include "trainyard/api/skipped_samples.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kTrainSamples = 200;  // 4 shards of 50

void make_shards(const fs::path& out) {
  const CommandResult made =
      run_command({(source_dir() / ".venv" / "bin" / "python").string(),
                   (source_dir() / "tests/e2e/webdataset/make_shards.py").string(), out.string()},
                  {}, 120);
  ASSERT_EQ(made.exit_code, 0) << describe(made);
}

std::string train_pattern(const fs::path& shards) {
  return (shards / "train-{000000..000003}.tar").string();
}

std::shared_ptr<const Table> table_of(const std::map<std::string, Value>& entries) {
  auto table = std::make_shared<Table>();
  for (const auto& [key, value] : entries) table->set(key, value);
  return table;
}

std::shared_ptr<Dataset> make_dataset(const std::map<std::string, Value>& options) {
  auto table = std::make_shared<Table>();
  for (const auto& [key, value] : options) table->set(key, value);
  return bundled_registry().create<Dataset>("webdataset", Config(table, "dataset"), BuildContext{});
}

std::shared_ptr<Dataset> train_dataset(const fs::path& shards, std::int64_t shuffle_buffer,
                                       std::shared_ptr<const Table> transforms = {}) {
  std::map<std::string, Value> options = {
      {"train", train_pattern(shards)}, {"classes", 4}, {"shuffle_buffer", shuffle_buffer}};
  if (transforms) options.emplace("transforms", Value(transforms));
  return make_dataset(options);
}

StreamShard reader(int rank, int world_size, int worker, int workers, std::int64_t epoch = 0) {
  return StreamShard{rank, world_size, worker, workers, 11, epoch};
}

std::vector<TensorMap> drain(SampleStream& stream) {
  std::vector<TensorMap> out;
  while (auto sample = stream.next()) out.push_back(std::move(*sample));
  return out;
}

std::int64_t index_of(const TensorMap& sample) {
  return sample.at(kSampleIndexKey).item<std::int64_t>();
}

std::vector<std::int64_t> indices(const std::vector<TensorMap>& samples) {
  std::vector<std::int64_t> out;
  for (const auto& sample : samples) out.push_back(index_of(sample));
  return out;
}

void expect_same_samples(const std::vector<TensorMap>& expected,
                         const std::vector<TensorMap>& actual, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(expected[i].size(), actual[i].size()) << what << ", sample " << i;
    for (const auto& [name, tensor] : expected[i]) {
      const at::Tensor& other = actual[i].at(name);
      ASSERT_EQ(tensor.sizes(), other.sizes()) << what << ", sample " << i << ": " << name;
      EXPECT_TRUE(at::equal(tensor, other)) << what << ", sample " << i << ": " << name;
    }
  }
}

// Every reader of a world_size x workers layout together: every sample exactly once, each
// reader within one sample of the others, and each sample's label its class (n % 4).
void expect_partition(const StreamSource& source, int world_size, int workers) {
  SCOPED_TRACE(std::to_string(world_size) + " ranks x " + std::to_string(workers) + " workers");
  std::vector<std::int64_t> seen;
  std::vector<std::size_t> lengths;
  for (int rank = 0; rank < world_size; ++rank) {
    for (int worker = 0; worker < workers; ++worker) {
      auto stream = source.open(reader(rank, world_size, worker, workers));
      const std::vector<TensorMap> samples = drain(*stream);
      lengths.push_back(samples.size());
      for (const auto& sample : samples) {
        const std::int64_t index = index_of(sample);
        EXPECT_EQ(sample.at("target").item<std::int64_t>(), index % 50 % 4) << index;
        EXPECT_EQ(sample.at("input").sizes(), at::IntArrayRef({3, 16, 16}));
        seen.push_back(index);
      }
    }
  }
  std::sort(seen.begin(), seen.end());
  std::vector<std::int64_t> all(kTrainSamples);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(seen, all);
  const auto [shortest, longest] = std::minmax_element(lengths.begin(), lengths.end());
  EXPECT_LE(*longest - *shortest, 1u);
}

TEST(WebDatasetStream, ReadersOfTwoRanksOfTwoWorkersSeeEverySampleOnce) {
  TempDir dir;
  make_shards(dir / "shards");
  for (const std::int64_t buffer : {0, 16}) {
    SCOPED_TRACE("shuffle_buffer " + std::to_string(buffer));
    auto dataset = train_dataset(dir / "shards", buffer);
    EXPECT_EQ(dataset->info().input_shape, std::vector<std::int64_t>({3, 16, 16}));
    EXPECT_EQ(dataset->info().num_classes, 4);
    EXPECT_EQ(dataset->splits(), std::vector<std::string>({"train"}));
    auto source = dataset->stream_split("train");
    ASSERT_NE(source, nullptr);
    EXPECT_EQ(source->size(), kTrainSamples);
    expect_partition(*source, 2, 2);
    expect_partition(*source, 1, 3);
  }
}

TEST(WebDatasetStream, TheSameSeedEpochAndReaderGiveTheSameSamplesAnotherEpochAnotherOrder) {
  TempDir dir;
  make_shards(dir / "shards");
  auto source = train_dataset(dir / "shards", 16)->stream_split("train");
  const auto first = drain(*source->open(reader(1, 2, 0, 2, 3)));
  const auto again = drain(*source->open(reader(1, 2, 0, 2, 3)));
  expect_same_samples(first, again, "the same reader opened twice");
  const auto whole = drain(*source->open(reader(0, 1, 0, 1, 3)));
  const auto next_epoch = drain(*source->open(reader(0, 1, 0, 1, 4)));
  ASSERT_EQ(whole.size(), next_epoch.size());
  EXPECT_NE(indices(whole), indices(next_epoch)) << "epochs 3 and 4 read in the same order";
  // Without shuffling, one reader reads the shards as listed, front to back.
  auto ordered = train_dataset(dir / "shards", 0)->stream_split("train");
  std::vector<std::int64_t> in_order(kTrainSamples);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_EQ(indices(drain(*ordered->open(reader(0, 1, 0, 1, 4)))), in_order);
}

TEST(WebDatasetStream, ASamplesAugmentationDoesNotDependOnItsReader) {
  TempDir dir;
  make_shards(dir / "shards");
  auto transforms = table_of(
      {{"random_resized_crop", Array{Value(12)}}, {"horizontal_flip", 0.5}, {"brightness", 0.4}});
  auto source = train_dataset(dir / "shards", 16, transforms)->stream_split("train");
  std::map<std::int64_t, at::Tensor> alone;
  for (const auto& sample : drain(*source->open(reader(0, 1, 0, 1, 2)))) {
    alone.emplace(index_of(sample), sample.at("input"));
  }
  ASSERT_EQ(alone.size(), static_cast<std::size_t>(kTrainSamples));
  std::size_t differing_epochs = 0;
  for (int rank = 0; rank < 2; ++rank) {
    for (int worker = 0; worker < 2; ++worker) {
      for (const auto& sample : drain(*source->open(reader(rank, 2, worker, 2, 2)))) {
        EXPECT_TRUE(at::equal(sample.at("input"), alone.at(index_of(sample))))
            << "sample " << index_of(sample) << " on rank " << rank << ", worker " << worker;
      }
    }
  }
  for (const auto& sample : drain(*source->open(reader(0, 1, 0, 1, 5)))) {
    if (!at::equal(sample.at("input"), alone.at(index_of(sample)))) ++differing_epochs;
  }
  EXPECT_GT(differing_epochs, 100u) << "epochs 2 and 5 draw the same augmentations";
}

// Reads `at` samples, saves the state, and checks that a fresh reader restored from it reads
// exactly the rest.
void expect_exact_restore(const StreamSource& source, const StreamShard& shard, std::size_t at) {
  SCOPED_TRACE("state after " + std::to_string(at) + " samples");
  const std::vector<TensorMap> all = drain(*source.open(shard));
  ASSERT_LE(at, all.size());
  auto stream = source.open(shard);
  for (std::size_t i = 0; i < at; ++i) ASSERT_TRUE(stream->next().has_value());
  const TensorMap state = stream->state();
  auto resumed = source.open(shard);
  resumed->restore(state);
  // The restored reader stands where the saved one stood.
  for (const auto& [name, tensor] : state) {
    EXPECT_TRUE(at::equal(tensor, resumed->state().at(name))) << name;
  }
  expect_same_samples(
      std::vector<TensorMap>(all.begin() + static_cast<std::ptrdiff_t>(at), all.end()),
      drain(*resumed), "the restored reader");
}

TEST(WebDatasetStream, StateAfterKSamplesRestoresExactlyTheRest) {
  TempDir dir;
  make_shards(dir / "shards");
  auto transforms = table_of({{"horizontal_flip", 0.5}});
  for (const std::int64_t buffer : {0, 16}) {
    SCOPED_TRACE("shuffle_buffer " + std::to_string(buffer));
    auto source = train_dataset(dir / "shards", buffer, transforms)->stream_split("train");
    // Rank 1's first reader of 2 x 2: a range that starts and ends inside shards.
    const StreamShard shard = reader(1, 2, 0, 2, 1);
    for (std::size_t at : {0, 1, 13, 25, 49, 50}) expect_exact_restore(*source, shard, at);
    // A state belongs to its reader.
    auto stream = source->open(shard);
    stream->next();
    auto other = source->open(reader(1, 2, 1, 2, 1));
    EXPECT_HAS(error_of([&] { other->restore(stream->state()); }), "another reader or split");
  }
}

std::string shard_error(const fs::path& shard) {
  return error_of([&] { make_dataset({{"train", shard.string()}, {"classes", 4}}); });
}

TEST(WebDatasetBadInput, IsRefusedAtTheStartNamingTheShardAndTheKey) {
  TempDir dir;
  make_shards(dir / "shards");
  const fs::path bad = dir / "shards" / "bad";
  EXPECT_HAS(shard_error(bad / "missing_cls.tar"),
             (bad / "missing_cls.tar").string() + ": bad/0003: no label member (.cls or .json)");
  EXPECT_HAS(shard_error(bad / "out_of_range.tar"),
             (bad / "out_of_range.tar").string() + ": bad/0002: label 9 is outside [0, 4)");
  EXPECT_HAS(shard_error(bad / "truncated.tar"),
             (bad / "truncated.tar").string() + ": bad/0006: damaged or truncated tar");
  EXPECT_HAS(shard_error(bad / "absent.tar"), (bad / "absent.tar").string() + ": cannot open");
  EXPECT_HAS(shard_error(bad / "x-{1..}.tar"), "dataset.train");
  EXPECT_HAS(shard_error(bad / "x-{1..}.tar"), "needs two decimal numbers");
}

TEST(WebDatasetBadInput, WithSkipBadSamplesAreLeftOutAndCounted) {
  TempDir dir;
  make_shards(dir / "shards");
  const fs::path bad = dir / "shards" / "bad";
  const std::int64_t reported = skipped_samples().count;
  ::testing::internal::CaptureStderr();
  auto dataset =
      make_dataset({{"train", (bad / "{missing_cls,out_of_range,truncated}.tar").string()},
                    {"classes", 4},
                    {"on_bad_sample", "skip"}});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_HAS(err, "webdataset: skipped 3 bad samples of dataset.train");
  EXPECT_HAS(err, (bad / "missing_cls.tar").string() + ": bad/0003: no label member");
  // ...and for the run summary.
  EXPECT_EQ(skipped_samples().count, reported + 3);
  // 9 + 9 + the 6 samples before the tar breaks off.
  auto source = dataset->stream_split("train");
  EXPECT_EQ(source->size(), 24);
  EXPECT_EQ(drain(*source->open(reader(0, 1, 0, 1))).size(), 24u);
}

TEST(WebDatasetBadInput, AnImageThatDoesNotDecodeIsRefusedOrSkippedWhenRead) {
  TempDir dir;
  make_shards(dir / "shards");
  const fs::path shard = dir / "shards" / "bad" / "bad_crc.tar";
  // The index reads no image data: the damage surfaces when a reader decodes the image.
  auto refusing = make_dataset({{"train", shard.string()}, {"classes", 4}, {"shuffle_buffer", 0}});
  auto stream = refusing->stream_split("train")->open(reader(0, 1, 0, 1));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(stream->next().has_value());
  EXPECT_HAS(error_of([&] { stream->next(); }), shard.string() + ": bad/0004: ");

  auto skipping = make_dataset({{"train", shard.string()},
                                {"classes", 4},
                                {"shuffle_buffer", 4},
                                {"on_bad_sample", "skip"}});
  auto source = skipping->stream_split("train");
  const std::int64_t reported = skipped_samples().count;
  ::testing::internal::CaptureStderr();
  auto whole = source->open(reader(0, 1, 0, 1));
  const std::vector<TensorMap> read = drain(*whole);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_HAS(err, "webdataset: skipped " + shard.string() + ": bad/0004: ");
  EXPECT_EQ(skipped_samples().count, reported + 1);
  std::vector<std::int64_t> kept = indices(read);
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, std::vector<std::int64_t>({0, 1, 2, 3, 5, 6, 7, 8, 9}));
  // The state counts the skipped sample: 10 drawn, 9 emitted, 1 skipped.
  EXPECT_TRUE(at::equal(whole->state().at("counts"), at::tensor({10, 9, 1}, at::kLong)));
  ::testing::internal::CaptureStderr();
  for (std::size_t at : {0, 3, 6, 9}) expect_exact_restore(*source, reader(0, 1, 0, 1), at);
  ::testing::internal::GetCapturedStderr();
}

// A small run: 16x16 gray images, a cnn, 2 readers of batches of 8.
std::string recipe_text(const fs::path& shards) {
  return R"([run]
seed = 7
epochs = 10
log_every = 3
eval = false

[loader]
batch_size = 8
workers = 2

[dataset]
plugin = "webdataset"
train = ")" +
         train_pattern(shards) + R"("
test = ")" +
         (shards / "test-000000.tar").string() + R"("
classes = 4
color = "gray"
shuffle_buffer = 16

[dataset.transforms]
horizontal_flip = 0.5
mean = [0.5]
std = [0.25]

[model]
plugin = "cnn"
channels = [4, 8]
hidden = 16
dropout = 0.2

[optimizer]
plugin = "adamw"
lr = 0.01

[checkpoint]
plugin = "torch"
every_steps = 3
keep = 0

[sinks.jsonl]
)";
}

TEST(WebDatasetRun, TrainsAndEvaluatesOnTheShards) {
  TempDir dir;
  make_shards(dir / "shards");
  const auto recipe = dir.write("recipe.toml", recipe_text(dir / "shards"));
  // 200 samples, 2 readers of batches of 8: 12 batches each, 24 steps per epoch.
  const auto run =
      run_one_process(recipe, dir / "out", {"--set", "run.epochs=3", "--set", "run.eval=true"});
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  const auto records = read_metrics(dir / "out" / "metrics.jsonl");
  const auto summary = of_phase(records, "summary");
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_EQ(summary[0].at("steps"), 72);
  const auto eval = of_phase(records, "eval");
  ASSERT_EQ(eval.size(), 3u);
  for (const auto& record : eval) EXPECT_EQ(record.at("samples"), 20);
  EXPECT_GT(eval.back().at("accuracy"), 0.6);
}

TEST(WebDatasetRun, BadSamplesStopTheRunNamingShardAndKeyOrAreSkippedAndSummarised) {
  TempDir dir;
  make_shards(dir / "shards");
  const fs::path bad = dir / "shards" / "bad";
  const auto recipe = dir.write("recipe.toml", recipe_text(dir / "shards"));
  const std::vector<std::string> shards = {
      "--set", "dataset.train=" + (bad / "{missing_cls,out_of_range}.tar").string(),
      "--set", "dataset.test=",
      "--set", "run.epochs=1"};
  const auto refused = run_one_process(recipe, dir / "refused", shards);
  EXPECT_NE(refused.exit_code, 0) << describe(refused);
  EXPECT_HAS(refused.err, (bad / "missing_cls.tar").string() + ": bad/0003: no label member");
  std::vector<std::string> skip = shards;
  skip.insert(skip.end(), {"--set", "dataset.on_bad_sample=skip"});
  const auto skipped = run_one_process(recipe, dir / "skipped", skip);
  ASSERT_EQ(skipped.exit_code, 0) << describe(skipped);
  EXPECT_HAS(skipped.err, "webdataset: skipped 2 bad samples of dataset.train");
  EXPECT_HAS(skipped.err, "the dataset skipped 2 unreadable samples");
}

// `trainyard run` or `trainyard launch` with `ranks` processes, killed with SIGKILL once the
// checkpoint of step 6 is committed (mid-epoch), then resumed; its final model must be the
// uninterrupted run's, bit for bit.
void expect_exact_resume_after_kill(int ranks, const std::string& max_steps) {
  TempDir dir;
  make_shards(dir / "shards");
  const auto recipe = dir.write("recipe.toml", recipe_text(dir / "shards"));
  std::vector<std::string> extra = {"--set", "run.max_steps=" + max_steps};
  if (ranks > 1) extra.insert(extra.end(), {"--set", "strategy.plugin=ddp"});
  auto run = [&](const fs::path& out, const std::vector<std::string>& more) {
    std::vector<std::string> args = extra;
    args.insert(args.end(), more.begin(), more.end());
    return ranks > 1 ? run_launched(ranks, recipe, out, args) : run_one_process(recipe, out, args);
  };
  const auto whole = run(dir / "whole", {});
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);

  const fs::path crashed = dir / "crashed";
  std::vector<std::string> argv = {host_binary().string()};
  if (ranks > 1) {
    argv.insert(argv.end(), {"launch", "--nproc-per-node", std::to_string(ranks)});
  } else {
    argv.push_back("run");
  }
  argv.insert(argv.end(), {recipe.string(), "--set", "run.threads=1", "--set",
                           "run.output_dir=" + crashed.string(), "--set",
                           "run.final_model_file=" + (crashed / "final.pt").string()});
  argv.insert(argv.end(), extra.begin(), extra.end());
  const fs::path step6 = crashed / "checkpoints" / "step-000000006" / "manifest.toml";
  const auto killed = run_command(argv, source_dir(), 300, {}, [&] { return fs::exists(step6); });
  ASSERT_TRUE(killed.killed) << "the run ended before the kill: " << describe(killed);
  ASSERT_FALSE(fs::exists(crashed / "final.pt"));

  const auto resumed = run(crashed, {"--resume", "auto"});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_HAS(resumed.err, "resumed from");
  expect_same_model_within(dir / "whole" / "final.pt", crashed / "final.pt", 0, 0);
}

TEST(WebDatasetRun, KilledMidEpochAndResumedTrainsTheSameModelBitForBitOnOneRank) {
  // 24 steps per epoch: the kill lands in the first, the runs end in the third.
  expect_exact_resume_after_kill(1, "60");
}

TEST(WebDatasetRun, KilledMidEpochAndResumedTrainsTheSameModelBitForBitOnTwoRanks) {
  // 200 samples over 2 ranks x 2 readers of batches of 8: 12 steps per epoch.
  expect_exact_resume_after_kill(2, "30");
}

}  // namespace
}  // namespace trainyard::testing
