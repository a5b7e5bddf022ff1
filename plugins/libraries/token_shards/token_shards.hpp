#pragma once
// Token shards: memory-mapped files of token ids, read as fixed-length windows for language
// modelling. Shared by the `tokens` dataset (shards on disk) and the `text` dataset (shards it
// makes from text once).
//
// Shard file format, version 1 (all integers little-endian):
//
//   offset  size  field
//        0     8  magic, the ASCII bytes "TYTOKENS"
//        8     4  format version, 1
//       12     4  bytes per token: 2 (uint16) or 4 (uint32)
//       16     8  token count N
//       24     4  vocabulary size (0: not recorded; every token must be below it otherwise)
//       28     4  reserved, 0
//       32   N*b  the tokens
//
// The file size must be exactly 32 + N * bytes-per-token: a shorter file is truncated, a longer
// one has a header that lies about its length. Both are errors naming the file.
//
// Windows: a shard of N tokens holds floor((N - 1) / seq_len) windows; window w is
// input = tokens[w*seq_len, w*seq_len + seq_len) and target = the same shifted by one token.
// Windows of all shards, in the order the shards are listed, are numbered globally; every
// `eval_every`-th of them (numbers eval_every-1, 2*eval_every-1, ...) is held out as the map-style
// "test" split, the rest form the streaming "train" split.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shard_header.hpp"
#include "trainyard/api/dataset.hpp"

namespace trainyard::token_shards {

// Writes a shard atomically (a temporary file in the same folder, then a rename), so a crash
// never leaves a partial shard under `path`. Uses uint16 when every token fits, else uint32.
void write_shard(const std::filesystem::path& path, std::span<const std::uint32_t> tokens,
                 std::uint32_t vocab_size);

// One shard file, mapped read-only and validated on opening.
class MappedShard {
 public:
  explicit MappedShard(const std::filesystem::path& path);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::int64_t tokens() const { return tokens_; }
  std::uint32_t token_bytes() const { return token_bytes_; }
  std::uint32_t vocab_size() const { return vocab_size_; }
  std::uint32_t token(std::int64_t index) const;
  // Copies tokens [first, first + count) into `out` as int64, checking each against `vocab`.
  void copy(std::int64_t first, std::int64_t count, std::int64_t vocab, std::int64_t* out) const;

 private:
  std::filesystem::path path_;
  const unsigned char* data_ = nullptr;  // the whole file
  std::size_t bytes_ = 0;
  std::int64_t tokens_ = 0;
  std::uint32_t token_bytes_ = 0;
  std::uint32_t vocab_size_ = 0;
};

struct CorpusOptions {
  std::int64_t seq_len = 128;
  std::int64_t vocab_size = 0;   // 0: the largest the shard headers record
  std::int64_t eval_every = 20;  // 0: no held-out split
};

// Shards as one numbered sequence of windows.
class TokenCorpus {
 public:
  TokenCorpus(const std::vector<std::filesystem::path>& shard_paths, const CorpusOptions& options);

  std::int64_t seq_len() const { return options_.seq_len; }
  std::int64_t vocab_size() const { return vocab_size_; }
  std::int64_t windows() const { return windows_.back(); }
  std::int64_t train_windows() const;
  std::int64_t eval_windows() const;
  // Global window number of the i-th train / eval window.
  std::int64_t train_window(std::int64_t index) const;
  std::int64_t eval_window(std::int64_t index) const;
  // {"input": int64 [seq_len], "target": int64 [seq_len]} of global window `window`.
  TensorMap window(std::int64_t window) const;
  // Entropy in nats of the token frequencies over every shard: the loss of the best model that
  // ignores context, which a language model must beat.
  double unigram_entropy() const;

 private:
  CorpusOptions options_;
  std::int64_t vocab_size_ = 0;
  std::vector<std::unique_ptr<MappedShard>> shards_;
  std::vector<std::int64_t> windows_;  // prefix sums: windows_[s] = windows before shard s
};

// A pseudo-random permutation of [0, size) computed one index at a time (a Feistel network with
// cycle walking): no table, so a stream's position is a single number.
class Permutation {
 public:
  Permutation(std::uint64_t size, std::uint64_t key);
  std::uint64_t operator()(std::uint64_t index) const;

 private:
  std::uint64_t apply_rounds(std::uint64_t value) const;
  std::uint64_t size_;
  unsigned half_bits_ = 1;
  std::uint64_t keys_[4] = {};
};

// The train split as a stream. Each epoch the train windows are permuted by (seed, epoch);
// like PyTorch's DistributedSampler with drop_last, the first floor(T / world_size) * world_size
// positions are used and rank r reads positions r, r + world_size, ...; within a rank, worker w
// of W reads every W-th of those starting at its w-th. Readers therefore never overlap, every
// used window is read exactly once, and reading a rank's workers round-robin gives the same
// order for any worker count.
class TrainStream final : public StreamSource {
 public:
  explicit TrainStream(std::shared_ptr<const TokenCorpus> corpus) : corpus_(std::move(corpus)) {}
  std::unique_ptr<SampleStream> open(const StreamShard& shard) const override;
  std::optional<std::int64_t> size() const override { return corpus_->train_windows(); }

 private:
  std::shared_ptr<const TokenCorpus> corpus_;
};

// The held-out windows, map-style so evaluation is deterministic.
class EvalWindows final : public MapSource {
 public:
  explicit EvalWindows(std::shared_ptr<const TokenCorpus> corpus) : corpus_(std::move(corpus)) {}
  std::int64_t size() const override { return corpus_->eval_windows(); }
  TensorMap get(std::int64_t index) const override;

 private:
  std::shared_ptr<const TokenCorpus> corpus_;
};

// A dataset over a corpus: a streaming "train" split and, when eval_every > 0, a map "test" split.
class TokenDataset : public Dataset {
 public:
  explicit TokenDataset(std::shared_ptr<const TokenCorpus> corpus);
  DatasetInfo info() const override;
  std::vector<std::string> splits() const override;
  std::shared_ptr<const MapSource> map_split(const std::string& split) const override;
  std::shared_ptr<const StreamSource> stream_split(const std::string& split) const override;
  const TokenCorpus& corpus() const { return *corpus_; }

 private:
  std::shared_ptr<const TokenCorpus> corpus_;
  std::shared_ptr<const StreamSource> train_;
  std::shared_ptr<const MapSource> eval_;
};

// Files matching a glob pattern, sorted; Error naming the pattern when nothing matches.
std::vector<std::filesystem::path> expand_glob(const std::filesystem::path& pattern,
                                               const std::string& what);

}  // namespace trainyard::token_shards
