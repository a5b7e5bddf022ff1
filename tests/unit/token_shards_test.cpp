// The `tokens` and `text` datasets: windows, rank x worker sharding of the streaming train split,
// deterministic shuffles, exact resume, the held-out split, the text cache and tokenizers (a
// tokenizer.json or .model giving the ids of Python's `tokenizers` and `sentencepiece`, made at
// test time by text_tokenizer/make_references.py from the venv), and every bad shard, corpus or
// tokenizer file ending in one clear error naming the file.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "test_support.hpp"
#include "token_shards.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/dataset.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<Dataset> make_dataset(const std::string& plugin,
                                      const std::map<std::string, Value>& options) {
  auto table = std::make_shared<Table>();
  for (const auto& [key, value] : options) table->set(key, value);
  return bundled_registry().create<Dataset>(plugin, Config(table, "dataset"), BuildContext{});
}

// A shard holding 0, 1, ..., count - 1 (vocabulary `count`), so each window is recognisable by
// its first token.
fs::path counting_shard(const TempDir& dir, const std::string& name, std::uint32_t count,
                        std::uint32_t start = 0) {
  std::vector<std::uint32_t> tokens(count);
  for (std::uint32_t i = 0; i < count; ++i) tokens[i] = start + i;
  fs::path path = dir / name;
  token_shards::write_shard(path, tokens, start + count);
  return path;
}

// Raw shard bytes, to write any header, true or not.
std::string shard_bytes(const std::string& magic, std::uint32_t version, std::uint32_t token_bytes,
                        std::uint64_t declared, std::uint32_t vocab, std::size_t payload_tokens) {
  std::string out(32, '\0');
  std::memcpy(out.data(), magic.data(), std::min<std::size_t>(8, magic.size()));
  std::memcpy(out.data() + 8, &version, 4);
  std::memcpy(out.data() + 12, &token_bytes, 4);
  std::memcpy(out.data() + 16, &declared, 8);
  std::memcpy(out.data() + 24, &vocab, 4);
  for (std::size_t i = 0; i < payload_tokens; ++i) {
    std::uint32_t token = static_cast<std::uint32_t>(i % 200);
    out.append(reinterpret_cast<const char*>(&token), token_bytes);
  }
  return out;
}

std::int64_t first_token(const TensorMap& sample) { return sample.at("input")[0].item<std::int64_t>(); }

// Every sample one reader yields this epoch, by first token.
std::vector<std::int64_t> drain(SampleStream& stream) {
  std::vector<std::int64_t> out;
  while (auto sample = stream.next()) out.push_back(first_token(*sample));
  return out;
}

std::vector<std::int64_t> rank_order(const StreamSource& source, StreamShard shard) {
  // A rank's workers read round-robin, as a loader interleaves their batches.
  std::vector<std::unique_ptr<SampleStream>> streams;
  for (int w = 0; w < shard.workers; ++w) {
    shard.worker = w;
    streams.push_back(source.open(shard));
  }
  std::vector<std::int64_t> out;
  for (bool any = true; any;) {
    any = false;
    for (auto& stream : streams) {
      if (auto sample = stream->next()) {
        out.push_back(first_token(*sample));
        any = true;
      }
    }
  }
  return out;
}

class TokenShards : public ::testing::Test {
 protected:
  void SetUp() override {
    // 1001 + 641 tokens, seq_len 10: 100 + 64 windows; every 8th held out: 20 eval, 144 train.
    counting_shard(dir_, "a.tok", 1001);
    counting_shard(dir_, "b.tok", 641, 5000);
    dataset_ = make_dataset("tokens", {{"path", Value((dir_ / "*.tok").string())},
                                       {"seq_len", Value(10)},
                                       {"eval_every", Value(8)}});
    train_ = dataset_->stream_split("train");
    ASSERT_NE(train_, nullptr);
  }
  TempDir dir_;
  std::shared_ptr<Dataset> dataset_;
  std::shared_ptr<const StreamSource> train_;
};

TEST_F(TokenShards, WindowsAreInputAndTargetShiftedByOne) {
  const DatasetInfo info = dataset_->info();
  EXPECT_EQ(info.input_shape, std::vector<std::int64_t>{10});
  EXPECT_EQ(info.sequence_length, 10);
  EXPECT_EQ(info.vocab_size, 5641);
  EXPECT_EQ(info.num_classes, 0);
  auto stream = train_->open(StreamShard{});
  for (int i = 0; i < 50; ++i) {
    auto sample = stream->next();
    ASSERT_TRUE(sample);
    const auto& input = sample->at("input");
    const auto& target = sample->at("target");
    EXPECT_EQ(input.scalar_type(), at::kLong);
    EXPECT_EQ(input.sizes().vec(), std::vector<std::int64_t>{10});
    EXPECT_TRUE(at::equal(target, input + 1)) << "target is the next token";
    // Windows start on a multiple of seq_len inside one shard and never cross into the next.
    const std::int64_t first = first_token(*sample);
    const std::int64_t local = first >= 5000 ? first - 5000 : first;
    EXPECT_EQ(local % 10, 0);
    EXPECT_LE(local + 10, first >= 5000 ? 640 : 1000);
  }
}

TEST_F(TokenShards, SizeCountsTrainWindowsAndTestSplitIsHeldOut) {
  ASSERT_TRUE(train_->size().has_value());
  EXPECT_EQ(*train_->size(), 144);
  auto test = dataset_->map_split("test");
  ASSERT_NE(test, nullptr);
  ASSERT_EQ(test->size(), 20);
  std::set<std::int64_t> held_out;
  for (std::int64_t i = 0; i < test->size(); ++i) {
    held_out.insert(first_token(test->get(i)));
    EXPECT_TRUE(at::equal(test->get(i).at("input"), test->get(i).at("input")));
  }
  EXPECT_EQ(held_out.size(), 20u);
  auto train = drain(*train_->open(StreamShard{}));
  EXPECT_EQ(train.size(), 144u);
  for (auto token : train) EXPECT_FALSE(held_out.count(token)) << "window " << token << " in both";
  EXPECT_EQ(std::set<std::int64_t>(train.begin(), train.end()).size() + held_out.size(), 164u);
}

TEST_F(TokenShards, ReadersPartitionEachEpochForAnyWorldAndWorkerCount) {
  for (int world : {1, 2, 3, 5}) {
    for (int workers : {1, 2, 3}) {
      std::multiset<std::int64_t> seen;
      std::vector<std::size_t> per_rank;
      for (int rank = 0; rank < world; ++rank) {
        std::size_t count = 0;
        for (int worker = 0; worker < workers; ++worker) {
          StreamShard shard{rank, world, worker, workers, 7, 3};
          for (auto token : drain(*train_->open(shard))) {
            seen.insert(token);
            ++count;
          }
        }
        per_rank.push_back(count);
      }
      const std::size_t used = 144 / world * world;  // DistributedSampler with drop_last
      EXPECT_EQ(seen.size(), used) << world << " ranks x " << workers << " workers";
      EXPECT_EQ(std::set<std::int64_t>(seen.begin(), seen.end()).size(), seen.size())
          << "a window was read twice with " << world << " ranks x " << workers << " workers";
      for (auto count : per_rank) EXPECT_EQ(count, 144u / world) << "ranks must read equal counts";
    }
  }
}

TEST_F(TokenShards, OrderDependsOnSeedAndEpochNotOnWorkerCount) {
  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      auto one = rank_order(*train_, StreamShard{rank, world, 0, 1, 11, 0});
      auto three = rank_order(*train_, StreamShard{rank, world, 0, 3, 11, 0});
      auto four = rank_order(*train_, StreamShard{rank, world, 0, 4, 11, 0});
      EXPECT_EQ(one, three) << "rank " << rank << " of " << world;
      EXPECT_EQ(one, four) << "rank " << rank << " of " << world;
    }
  }
  auto epoch0 = drain(*train_->open(StreamShard{0, 1, 0, 1, 11, 0}));
  auto epoch0_again = drain(*train_->open(StreamShard{0, 1, 0, 1, 11, 0}));
  auto epoch1 = drain(*train_->open(StreamShard{0, 1, 0, 1, 11, 1}));
  auto other_seed = drain(*train_->open(StreamShard{0, 1, 0, 1, 12, 0}));
  EXPECT_EQ(epoch0, epoch0_again);
  EXPECT_NE(epoch0, epoch1) << "each epoch reshuffles";
  EXPECT_NE(epoch0, other_seed);
  std::vector<std::int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(epoch0, sorted) << "the order is shuffled";
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(sorted, epoch1) << "each epoch reads the same windows";
}

TEST_F(TokenShards, RestoredStreamYieldsExactlyTheRemainingSamples) {
  for (int consumed : {0, 1, 17, 23, 24}) {
    StreamShard shard{1, 2, 1, 3, 99, 4};
    auto original = train_->open(shard);
    for (int i = 0; i < consumed; ++i) ASSERT_TRUE(original->next());
    TensorMap state = original->state();
    // The state must be a snapshot, not a view of the live stream.
    auto expected = drain(*original);
    auto resumed = train_->open(shard);
    resumed->restore(state);
    EXPECT_EQ(drain(*resumed), expected) << "after " << consumed << " samples";
  }
  auto stream = train_->open(StreamShard{0, 2, 0, 1, 99, 4});
  TensorMap state = stream->state();
  auto other_reader = train_->open(StreamShard{1, 2, 0, 1, 99, 4});
  EXPECT_HAS(error_of([&] { other_reader->restore(state); }), "another reader");
  auto other_epoch = train_->open(StreamShard{0, 2, 0, 1, 99, 5});
  EXPECT_HAS(error_of([&] { other_epoch->restore(state); }), "another reader");
}

TEST_F(TokenShards, InvalidReaderIsRefused) {
  EXPECT_HAS(error_of([&] { train_->open(StreamShard{0, 0, 0, 1, 0, 0}); }), "invalid reader");
  EXPECT_HAS(error_of([&] { train_->open(StreamShard{2, 2, 0, 1, 0, 0}); }), "rank 2 of 2");
  EXPECT_HAS(error_of([&] { train_->open(StreamShard{0, 1, 3, 3, 0, 0}); }), "worker 3 of 3");
}

TEST_F(TokenShards, ConcurrentReadersSeeTheSameWindows) {
  auto expected = drain(*train_->open(StreamShard{0, 1, 0, 1, 3, 0}));
  std::vector<std::vector<std::int64_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { got[t] = drain(*train_->open(StreamShard{0, 1, 0, 1, 3, 0})); });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& g : got) EXPECT_EQ(g, expected);
}

TEST(TokenShardFormat, Uint16AndUint32ShardsReadAlike) {
  TempDir dir;
  std::vector<std::uint32_t> small(300), large(300);
  for (std::uint32_t i = 0; i < 300; ++i) {
    small[i] = i;
    large[i] = 70000 + i;
  }
  token_shards::write_shard(dir / "small.tok", small, 300);
  token_shards::write_shard(dir / "large.tok", large, 70300);
  EXPECT_EQ(fs::file_size(dir / "small.tok"), 32u + 2 * 300);
  EXPECT_EQ(fs::file_size(dir / "large.tok"), 32u + 4 * 300);
  token_shards::MappedShard a(dir / "small.tok");
  token_shards::MappedShard b(dir / "large.tok");
  EXPECT_EQ(a.token_bytes(), 2u);
  EXPECT_EQ(b.token_bytes(), 4u);
  for (std::int64_t i = 0; i < 300; ++i) {
    EXPECT_EQ(a.token(i), static_cast<std::uint32_t>(i));
    EXPECT_EQ(b.token(i), static_cast<std::uint32_t>(70000 + i));
  }
  // No temporary file is left beside the shards.
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) files += entry.is_regular_file();
  EXPECT_EQ(files, 2u);
}

TEST(TokenShardFormat, PermutationIsABijection) {
  for (std::uint64_t size : {1u, 2u, 3u, 7u, 64u, 1000u, 4097u}) {
    token_shards::Permutation permutation(size, 42);
    std::set<std::uint64_t> seen;
    for (std::uint64_t i = 0; i < size; ++i) {
      const auto value = permutation(i);
      EXPECT_LT(value, size);
      seen.insert(value);
    }
    EXPECT_EQ(seen.size(), size);
  }
}

// --- bad shards: one clear Error naming the file (and offset) -------------------------------

std::string tokens_error(const fs::path& shard, std::int64_t seq_len = 8) {
  return error_of([&] {
    make_dataset("tokens", {{"path", Value(shard.string())}, {"seq_len", Value(seq_len)}});
  });
}

TEST(TokenShardBadInput, TruncatedShardIsNamed) {
  TempDir dir;
  auto path = dir.write("cut.tok", shard_bytes("TYTOKENS", 1, 2, 1000, 256, 600));
  auto error = tokens_error(path);
  EXPECT_HAS(error, path.string());
  EXPECT_HAS(error, "truncated");
  EXPECT_HAS(error, "offset 16");
  EXPECT_HAS(error, "declares 1000 tokens");
}

TEST(TokenShardBadInput, ShardShorterThanItsHeaderIsNamed) {
  TempDir dir;
  auto path = dir.write("stub.tok", std::string("TYTOK"));
  auto error = tokens_error(path);
  EXPECT_HAS(error, path.string());
  EXPECT_HAS(error, "shorter than its 32-byte header");
  auto empty = dir.write("empty.tok", "");
  EXPECT_HAS(tokens_error(empty), "0 bytes");
}

TEST(TokenShardBadInput, CorruptMagicIsNamedWithItsOffset) {
  TempDir dir;
  auto path = dir.write("bad.tok", shard_bytes("GARBAGE!", 1, 2, 100, 256, 100));
  auto error = tokens_error(path);
  EXPECT_HAS(error, path.string());
  EXPECT_HAS(error, "magic 'GARBAGE!' at offset 0");
}

TEST(TokenShardBadInput, HeaderLyingAboutItsLengthIsNamed) {
  TempDir dir;
  // The header declares 100 tokens; 400 follow.
  auto path = dir.write("liar.tok", shard_bytes("TYTOKENS", 1, 2, 100, 256, 400));
  auto error = tokens_error(path);
  EXPECT_HAS(error, path.string());
  EXPECT_HAS(error, "declares 100 tokens");
  EXPECT_HAS(error, "600 bytes more than declared");
  // A count so large that count * bytes overflows is still refused, not wrapped.
  auto huge = dir.write("huge.tok", shard_bytes("TYTOKENS", 1, 4, 0x4000000000000001ull, 256, 4));
  EXPECT_HAS(tokens_error(huge), "truncated");
}

TEST(TokenShardBadInput, UnknownVersionAndTokenSizeAreNamed) {
  TempDir dir;
  auto version = dir.write("v9.tok", shard_bytes("TYTOKENS", 9, 2, 100, 256, 100));
  EXPECT_HAS(tokens_error(version), "format version 9 at offset 8");
  auto width = dir.write("w3.tok", shard_bytes("TYTOKENS", 1, 3, 100, 256, 100));
  EXPECT_HAS(tokens_error(width), "3 bytes per token at offset 12");
}

TEST(TokenShardBadInput, NonZeroReservedFieldIsNamedWithItsOffset) {
  TempDir dir;
  std::string bytes = shard_bytes("TYTOKENS", 1, 2, 100, 256, 100);
  bytes[28] = 7;
  auto path = dir.write("reserved.tok", bytes);
  auto error = tokens_error(path);
  EXPECT_HAS(error, path.string());
  EXPECT_HAS(error, "7 in its reserved field at offset 28");
}

TEST(TokenShardBadInput, WindowLongerThanAShardIsNamed) {
  TempDir dir;
  auto path = dir.write("short.tok", shard_bytes("TYTOKENS", 1, 2, 50, 256, 50));
  auto error = tokens_error(path, 64);
  EXPECT_HAS(error, path.string());
  EXPECT_HAS(error, "holds 50 tokens, fewer than one window of seq_len + 1 = 65");
}

TEST(TokenShardBadInput, TokenOutsideTheVocabularyIsNamedWithItsOffset) {
  TempDir dir;
  std::string bytes = shard_bytes("TYTOKENS", 1, 2, 100, 150, 100);  // tokens 0..99, vocab 150
  const std::uint16_t bad = 999;
  std::memcpy(bytes.data() + 32 + 2 * 3, &bad, 2);
  auto path = dir.write("oov.tok", bytes);
  auto dataset = make_dataset("tokens", {{"path", Value(path.string())},
                                         {"seq_len", Value(8)},
                                         {"eval_every", Value(0)}});
  auto error = error_of([&] {
    auto stream = dataset->stream_split("train")->open(StreamShard{});
    while (stream->next()) {
    }
  });
  EXPECT_HAS(error, path.string());
  EXPECT_HAS(error, "token 999 at offset 38");
}

TEST(TokenShardBadInput, MissingShardsAndPathAreNamed) {
  TempDir dir;
  auto error = tokens_error(dir / "nothing-*.tok");
  EXPECT_HAS(error, "dataset.path");
  EXPECT_HAS(error, "matches no file");
  const std::string missing = error_of([] { make_dataset("tokens", {}); });
  EXPECT_HAS(missing, "missing required option 'dataset.path'");
  EXPECT_HAS(missing, "glob of token shard files");
}

// The host reports a bad shard on one line and exits 1: no crash, no backtrace.
TEST(TokenShardBadInput, HostReportsACorruptShardOnOneLine) {
  TempDir dir;
  auto shard = dir.write("bad.tok", shard_bytes("TYTOKENS", 1, 2, 5000, 256, 100));
  auto recipe = dir.write("r.toml", "[run]\noutput_dir = \"" + (dir / "out").string() +
                                        "\"\n[dataset]\nplugin = \"tokens\"\npath = \"bad.tok\"\n"
                                        "[model]\nplugin = \"gpt\"\n[optimizer]\nplugin = \"adamw\"\n");
  auto result = run_host({"run", recipe.string()}, {}, 120);
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_EQ(result.err.rfind("trainyard: error: ", 0), 0u) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_HAS(result.err, shard.string());
  EXPECT_HAS(result.err, "truncated");
}

// --- text: tokenizers, the cache, bad corpora -----------------------------------------------

std::shared_ptr<Dataset> text_dataset(const TempDir& corpus, const fs::path& cache,
                                      const Value& tokenizer, std::int64_t vocab = 0) {
  return make_dataset("text", {{"path", Value((corpus / "*.txt").string())},
                               {"cache", Value(cache.string())},
                               {"tokenizer", Value(tokenizer)},
                               {"vocab_size", Value(vocab)},
                               {"seq_len", Value(16)}});
}

std::vector<fs::path> cache_entries(const fs::path& cache) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(cache)) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string sample_text() {
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) +
            " — naïve café\n";
  }
  return text;
}

TEST(TextDataset, ByteTokensAreTheFileBytesAndTheCacheIsReused) {
  TempDir corpus, cache;
  const std::string text = sample_text();
  corpus.write("a.txt", text);
  corpus.write("skip.dat", "not text \xff\xfe");  // not matched by *.txt
  auto dataset = text_dataset(corpus, cache.path(), "byte");
  EXPECT_EQ(dataset->info().vocab_size, 256);
  EXPECT_EQ(dataset->info().sequence_length, 16);
  auto entries = cache_entries(cache.path());
  ASSERT_EQ(entries.size(), 1u) << "one complete entry, no temporary folder left";
  const fs::path shard = entries[0] / "tokens.bin";
  token_shards::MappedShard mapped(shard);
  ASSERT_EQ(mapped.tokens(), static_cast<std::int64_t>(text.size()));
  for (std::size_t i = 0; i < text.size(); ++i) {
    ASSERT_EQ(mapped.token(static_cast<std::int64_t>(i)), static_cast<unsigned char>(text[i]));
  }
  const auto written = fs::last_write_time(shard);

  // The same corpus and settings reuse the entry; a changed file or setting makes a new one.
  text_dataset(corpus, cache.path(), "byte");
  EXPECT_EQ(cache_entries(cache.path()), entries);
  EXPECT_EQ(fs::last_write_time(shard), written) << "the cached shard was rewritten";
  text_dataset(corpus, cache.path(), "bpe", 300);
  EXPECT_EQ(cache_entries(cache.path()).size(), 2u);
  corpus.write("a.txt", text + "one more line\n");
  text_dataset(corpus, cache.path(), "byte");
  EXPECT_EQ(cache_entries(cache.path()).size(), 3u);
}

TEST(TextDataset, BpeTokensDecodeBackToTheText) {
  TempDir corpus, cache;
  const std::string text = sample_text();
  corpus.write("a.txt", text);
  auto dataset = text_dataset(corpus, cache.path(), "bpe", 320);
  const std::int64_t vocab = dataset->info().vocab_size;
  EXPECT_GT(vocab, 256);
  EXPECT_LE(vocab, 320);
  auto entries = cache_entries(cache.path());
  ASSERT_EQ(entries.size(), 1u);
  std::map<std::uint32_t, std::string> pieces;
  for (std::uint32_t b = 0; b < 256; ++b) pieces[b] = std::string(1, static_cast<char>(b));
  std::istringstream merges(read_text(entries[0] / "merges.txt"));
  std::uint32_t id, left, right;
  while (merges >> id >> left >> right) pieces[id] = pieces.at(left) + pieces.at(right);
  EXPECT_EQ(static_cast<std::int64_t>(pieces.size()), vocab);
  token_shards::MappedShard mapped(entries[0] / "tokens.bin");
  EXPECT_LT(mapped.tokens(), static_cast<std::int64_t>(text.size()) * 3 / 4) << "BPE compresses";
  std::string decoded;
  for (std::int64_t i = 0; i < mapped.tokens(); ++i) decoded += pieces.at(mapped.token(i));
  EXPECT_EQ(decoded, text);
}

TEST(TextDataset, EmptyCorpusIsAClearError) {
  TempDir corpus, cache;
  corpus.write("empty.txt", "");
  corpus.write("also-empty.txt", "");
  auto error = error_of([&] { text_dataset(corpus, cache.path(), "byte"); });
  EXPECT_HAS(error, "corpus is empty");
  EXPECT_HAS(error, (corpus / "*.txt").string());
  TempDir nothing;
  EXPECT_HAS(error_of([&] { text_dataset(nothing, cache.path(), "byte"); }), "matches no file");
}

TEST(TextDataset, NonUtf8FileIsNamedWithItsOffset) {
  TempDir corpus, cache;
  auto path = corpus.write("latin1.txt", "caf\xe9 au lait");
  auto error = error_of([&] { text_dataset(corpus, cache.path(), "byte"); });
  EXPECT_HAS(error, path.string());
  EXPECT_HAS(error, "not UTF-8");
  EXPECT_HAS(error, "offset 3");
}

TEST(TextDataset, CorpusShorterThanOneWindowIsNamed) {
  TempDir corpus, cache;
  corpus.write("tiny.txt", "hello");
  auto error = error_of([&] { text_dataset(corpus, cache.path(), "byte"); });
  EXPECT_HAS(error, "tokens.bin");
  EXPECT_HAS(error, "fewer than one window");
}

// --- text with a Hugging Face tokenizer.json or a SentencePiece .model -----------------------

using Ids = std::vector<std::uint32_t>;

// Tokenizer files trained by tests/unit/text_tokenizer/make_references.py on a small corpus, with
// Python's ids for that corpus: made once per test process.
struct PythonTokenizers {
  TempDir corpus;       // a.txt, b.txt
  TempDir files;        // bos.json, bos_eos.json, spm.model and each one's <name>.ids
  std::string missing;  // what the environment lacks to make them
  std::string error;    // how the script failed otherwise
};

const PythonTokenizers& python_tokenizers() {
  static const std::unique_ptr<PythonTokenizers> made = [] {
    auto made = std::make_unique<PythonTokenizers>();
    const fs::path a = made->corpus.write("a.txt", sample_text());
    std::string mixed;
    for (int i = 0; i < 8; ++i) {
      mixed += "Déjà vu: 日本語のテキスト, Москва " + std::to_string(i) +
               ", emoji 🙂🚀 and tabs\tand  spaces.\n\n";
    }
    const fs::path b = made->corpus.write("b.txt", mixed);
    const fs::path python = source_dir() / ".venv/bin/python";
    if (!fs::exists(python)) {
      made->missing = "no " + python.string() + " (run tools/setup --tests)";
      return made;
    }
    const fs::path script = source_dir() / "tests/unit/text_tokenizer/make_references.py";
    const CommandResult result = run_command(
        {python.string(), script.string(), made->files.path().string(), a.string(), b.string()}, {},
        120);
    if (result.exit_code == 77) {
      made->missing = result.err;
    } else if (result.exit_code != 0) {
      made->error = describe(result);
    }
    return made;
  }();
  return *made;
}

struct PythonIds {
  std::int64_t vocab_size = 0;
  Ids ids;
};

// <name>.ids: the vocabulary size, then the ids of the whole corpus.
PythonIds python_ids(const std::string& name) {
  std::istringstream in(read_text(python_tokenizers().files / (name + ".ids")));
  PythonIds out;
  in >> out.vocab_size;
  for (std::uint32_t id; in >> id;) out.ids.push_back(id);
  return out;
}

Ids shard_ids(const fs::path& shard) {
  token_shards::MappedShard mapped(shard);
  Ids ids;
  for (std::int64_t i = 0; i < mapped.tokens(); ++i) ids.push_back(mapped.token(i));
  return ids;
}

// The tokenizer option as a recipe at `recipe` would write it, so a relative path resolves
// against the recipe's folder.
Value recipe_value(const std::string& text, const fs::path& recipe) {
  return Value(text, SourceLocation{recipe.string(), 7, 13});
}

class TextDatasetWithTokenizerFile : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!python_tokenizers().missing.empty()) {
      TRAINYARD_SKIP_MISSING() << python_tokenizers().missing;
    }
    ASSERT_EQ(python_tokenizers().error, "");
  }
};

TEST_F(TextDatasetWithTokenizerFile, IdsAreThoseOfPythonsTokenizersWithTheTemplatesSpecialTokens) {
  const PythonTokenizers& python = python_tokenizers();
  // bos.json's template puts <|begin_of_text|> before each file, bos_eos.json's also
  // <|end_of_text|> after it; spm.model adds nothing, as sentencepiece's encode.
  for (const char* file : {"bos.json", "bos_eos.json", "spm.model"}) {
    SCOPED_TRACE(file);
    TempDir cache;
    const PythonIds expected = python_ids(fs::path(file).stem().string());
    auto dataset =
        text_dataset(python.corpus, cache.path(), recipe_value(file, python.files / "recipe.toml"));
    EXPECT_EQ(dataset->info().vocab_size, expected.vocab_size);
    auto entries = cache_entries(cache.path());
    ASSERT_EQ(entries.size(), 1u);
    EXPECT_EQ(shard_ids(entries[0] / "tokens.bin"), expected.ids);
    // Naming the vocabulary it has is accepted, and reuses the entry.
    dataset = text_dataset(python.corpus, cache.path(),
                           recipe_value(file, python.files / "recipe.toml"), expected.vocab_size);
    EXPECT_EQ(dataset->info().vocab_size, expected.vocab_size);
    EXPECT_EQ(cache_entries(cache.path()), entries);
  }
}

TEST_F(TextDatasetWithTokenizerFile, AnotherVocabularySizeIsRefusedOnOneLine) {
  const PythonTokenizers& python = python_tokenizers();
  TempDir cache;
  const std::int64_t vocab = python_ids("bos").vocab_size;
  const fs::path recipe = python.files / "recipe.toml";
  const std::string error = error_of([&] {
    text_dataset(python.corpus, cache.path(), recipe_value("bos.json", recipe), vocab + 1);
  });
  EXPECT_HAS(error, "dataset.vocab_size must be 0 or " + std::to_string(vocab));
  EXPECT_HAS(error, (python.files / "bos.json").string());
  EXPECT_HAS(error, "got " + std::to_string(vocab + 1));
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_TRUE(!fs::exists(cache.path()) || fs::is_empty(cache.path())) << "nothing tokenized";
}

TEST_F(TextDatasetWithTokenizerFile, AnEditedTokenizerFileIsTokenizedAgain) {
  const PythonTokenizers& python = python_tokenizers();
  TempDir recipes, cache;
  const fs::path recipe = recipes / "recipe.toml";
  recipes.write("tokenizer.json", read_text(python.files / "bos.json"));
  text_dataset(python.corpus, cache.path(), recipe_value("tokenizer.json", recipe));
  const auto first = cache_entries(cache.path());
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(shard_ids(first[0] / "tokens.bin"), python_ids("bos").ids);

  // The same bytes under another name are the same tokenizer: the key is the content.
  recipes.write("renamed.json", read_text(python.files / "bos.json"));
  text_dataset(python.corpus, cache.path(), recipe_value("renamed.json", recipe));
  EXPECT_EQ(cache_entries(cache.path()), first);

  // Other bytes under the same name (a post-processor that now adds EOS too) are not.
  recipes.write("tokenizer.json", read_text(python.files / "bos_eos.json"));
  text_dataset(python.corpus, cache.path(), recipe_value("tokenizer.json", recipe));
  auto entries = cache_entries(cache.path());
  ASSERT_EQ(entries.size(), 2u);
  const fs::path added = entries[0] == first[0] ? entries[1] : entries[0];
  EXPECT_EQ(shard_ids(added / "tokens.bin"), python_ids("bos_eos").ids);
}

TEST(TextDataset, MissingUnsupportedOrUnknownTokenizerFilesAreRefusedOnOneLine) {
  TempDir corpus, recipes, cache;
  corpus.write("a.txt", sample_text());
  const fs::path recipe = recipes / "recipe.toml";
  const auto refusal = [&](const std::string& tokenizer) {
    const std::string error =
        error_of([&] { text_dataset(corpus, cache.path(), recipe_value(tokenizer, recipe)); });
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_HAS(error, recipe.string() + ":7:13: dataset.tokenizer ");
    return error;
  };
  const std::string missing = refusal("missing/tokenizer.json");
  EXPECT_HAS(missing, (recipes / "missing/tokenizer.json").string() + ": cannot read");
  EXPECT_HAS(refusal("gone.model"), (recipes / "gone.model").string() + ": cannot read");

  recipes.write("wordpiece.json",
                R"({"version": "1.0", "model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  const std::string wordpiece = refusal("wordpiece.json");
  EXPECT_HAS(wordpiece, (recipes / "wordpiece.json").string());
  EXPECT_HAS(wordpiece, "WordPiece");
  recipes.write("not-a.model", "plain text");
  EXPECT_HAS(refusal("not-a.model"), (recipes / "not-a.model").string() + ": not a SentencePiece");

  EXPECT_HAS(refusal("words.txt"), "must be \"byte\", \"bpe\" or a tokenizer file");
  EXPECT_TRUE(!fs::exists(cache.path()) || fs::is_empty(cache.path())) << "nothing tokenized";
}

// --- Fashion-MNIST IDX files ---------------------------------------------------------------

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

struct IdxFiles {
  TempDir dir;
  fs::path images = dir / "train-images-idx3-ubyte";
  fs::path labels = dir / "train-labels-idx1-ubyte";
  IdxFiles(const std::string& image_bytes, const std::string& label_bytes) {
    dir.write("train-images-idx3-ubyte", image_bytes);
    dir.write("train-labels-idx1-ubyte", label_bytes);
  }
  std::string error() const {
    return error_of([&] {
      make_dataset("fashion_mnist", {{"root", Value(dir.path().string())}})->map_split("train");
    });
  }
};

std::string images(std::uint32_t count, std::uint32_t rows = 28, std::uint32_t cols = 28,
                   std::uint32_t magic = 0x803) {
  return be32(magic) + be32(count) + be32(rows) + be32(cols) +
         std::string(static_cast<std::size_t>(count) * rows * cols, '\x10');
}
std::string labels(std::uint32_t count, char label = 3) {
  return be32(0x801) + be32(count) + std::string(count, label);
}

TEST(FashionMnistBadInput, ValidFilesLoad) {
  IdxFiles files(images(3), labels(3));
  auto split = make_dataset("fashion_mnist", {{"root", Value(files.dir.path().string())}})
                   ->map_split("train");
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(split->size(), 3);
}

TEST(FashionMnistBadInput, CorruptMagicIsNamed) {
  IdxFiles files(images(3, 28, 28, 0x12345678), labels(3));
  auto error = files.error();
  EXPECT_HAS(error, files.images.string());
  EXPECT_HAS(error, "at offset 0");
}

TEST(FashionMnistBadInput, FileShorterThanItsHeaderIsNamed) {
  IdxFiles files(be32(0x803) + be32(3), labels(3));
  auto error = files.error();
  EXPECT_HAS(error, files.images.string());
  EXPECT_HAS(error, "shorter than its 16-byte header");
}

TEST(FashionMnistBadInput, TruncatedAndOverlongPayloadsAreNamed) {
  std::string cut = images(3);
  cut.resize(cut.size() - 100);
  IdxFiles truncated(cut, labels(3));
  EXPECT_HAS(truncated.error(), "(truncated)");
  EXPECT_HAS(truncated.error(), truncated.images.string());
  IdxFiles overlong(images(3), labels(3) + "extra");
  EXPECT_HAS(overlong.error(), overlong.labels.string());
  EXPECT_HAS(overlong.error(), "header promises 3");
}

TEST(FashionMnistBadInput, DimensionsWhoseProductOverflowsAreRefused) {
  // 2^24 x 2^24 x 2^16 = 2^64 wraps around to 0 bytes in 64 bits, which an empty payload would
  // match; it must be refused, not trusted.
  std::string header = be32(0x803) + be32(1u << 24) + be32(1u << 24) + be32(1u << 16);
  IdxFiles files(header, labels(3));
  auto error = files.error();
  EXPECT_HAS(error, files.images.string());
}

TEST(FashionMnistBadInput, ImagesOfAnotherSizeAreRefused) {
  IdxFiles files(images(3, 32, 32), labels(3));
  auto error = files.error();
  EXPECT_HAS(error, files.images.string());
  EXPECT_HAS(error, "28x28");
}

TEST(FashionMnistBadInput, LabelsOutsideTheClassesAreNamed) {
  IdxFiles files(images(3), labels(3, 12));
  EXPECT_HAS(files.error(), "labels outside 0..9");
}

TEST(FashionMnistBadInput, CountsThatDisagreeAreNamed) {
  IdxFiles files(images(3), labels(4));
  EXPECT_HAS(files.error(), "disagree");
}

}  // namespace
}  // namespace trainyard::testing
