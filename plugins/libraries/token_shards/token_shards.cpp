#include "token_shards.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <random>

#include "trainyard/api/error.hpp"
#include "trainyard/api/sample_index.hpp"

namespace trainyard::token_shards {
namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian and read in place");

std::string quoted(const fs::path& path) { return path.string(); }

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <typename T>
T load(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

// Writes all of `bytes`, retrying short writes.
void write_all(int fd, const void* data, std::size_t bytes, const fs::path& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    ssize_t done = ::write(fd, p, bytes);
    if (done < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write token shard " + quoted(path) + ": " + std::strerror(errno));
    }
    p += done;
    bytes -= static_cast<std::size_t>(done);
  }
}

}  // namespace

void write_shard(const fs::path& path, std::span<const std::uint32_t> tokens,
                 std::uint32_t vocab_size) {
  std::uint32_t largest = 0;
  for (auto t : tokens) largest = std::max(largest, t);
  const std::uint32_t token_bytes = largest <= 0xFFFF && vocab_size <= 0x10000 ? 2 : 4;
  const auto header = shard_header_bytes(
      ShardHeader{token_bytes, static_cast<std::int64_t>(tokens.size()), vocab_size});
  std::random_device entropy;
  const fs::path temporary =
      path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(entropy());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw Error("cannot create token shard " + quoted(temporary) + ": " + std::strerror(errno));
  }
  try {
    write_all(fd, header.data(), header.size(), temporary);
    constexpr std::size_t kChunk = 1 << 16;
    std::vector<unsigned char> buffer;
    buffer.reserve(kChunk * token_bytes);
    for (std::size_t first = 0; first < tokens.size(); first += kChunk) {
      const std::size_t last = std::min(tokens.size(), first + kChunk);
      buffer.clear();
      for (std::size_t i = first; i < last; ++i) {
        unsigned char bytes[4];
        std::memcpy(bytes, &tokens[i], 4);
        buffer.insert(buffer.end(), bytes, bytes + token_bytes);
      }
      write_all(fd, buffer.data(), buffer.size(), temporary);
    }
    if (::fsync(fd) != 0) {
      throw Error("cannot flush token shard " + quoted(temporary) + ": " + std::strerror(errno));
    }
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int code = errno;
    ::unlink(temporary.c_str());
    throw Error("cannot move token shard into place at " + quoted(path) + ": " +
                std::strerror(code));
  }
}

MappedShard::MappedShard(const fs::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open token shard " + quoted(path) + ": " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw Error("token shard " + quoted(path) + " is not a regular file");
  }
  bytes_ = static_cast<std::size_t>(info.st_size);
  try {
    check_shard_size(bytes_, quoted(path));  // mapping nothing would fail less clearly
  } catch (...) {
    ::close(fd);
    throw;
  }
  void* mapped = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (mapped == MAP_FAILED) {
    throw Error("cannot map token shard " + quoted(path) + ": " + std::strerror(map_errno));
  }
  data_ = static_cast<const unsigned char*>(mapped);
  try {
    const ShardHeader header = read_shard_header({data_, bytes_}, quoted(path));
    token_bytes_ = header.token_bytes;
    vocab_size_ = header.vocab_size;
    tokens_ = header.tokens;
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(data_), bytes_);
    data_ = nullptr;
    throw;
  }
}

MappedShard::~MappedShard() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), bytes_);
}

std::uint32_t MappedShard::token(std::int64_t index) const {
  const unsigned char* at = data_ + kHeaderBytes + static_cast<std::size_t>(index) * token_bytes_;
  return token_bytes_ == 2 ? load<std::uint16_t>(at) : load<std::uint32_t>(at);
}

void MappedShard::copy(std::int64_t first, std::int64_t count, std::int64_t vocab,
                       std::int64_t* out) const {
  std::uint32_t largest = 0;
  if (token_bytes_ == 2) {
    const unsigned char* at = data_ + kHeaderBytes + static_cast<std::size_t>(first) * 2;
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint16_t t = load<std::uint16_t>(at + 2 * i);
      largest = std::max<std::uint32_t>(largest, t);
      out[i] = t;
    }
  } else {
    const unsigned char* at = data_ + kHeaderBytes + static_cast<std::size_t>(first) * 4;
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint32_t t = load<std::uint32_t>(at + 4 * i);
      largest = std::max(largest, t);
      out[i] = t;
    }
  }
  if (static_cast<std::int64_t>(largest) >= vocab) {
    for (std::int64_t i = 0; i < count; ++i) {
      if (out[i] >= vocab) {
        const auto offset = kHeaderBytes + static_cast<std::size_t>(first + i) * token_bytes_;
        throw Error("token shard " + quoted(path_) + " holds token " + std::to_string(out[i]) +
                    " at offset " + std::to_string(offset) + ", outside the vocabulary of " +
                    std::to_string(vocab));
      }
    }
  }
}

TokenCorpus::TokenCorpus(const std::vector<fs::path>& shard_paths, const CorpusOptions& options)
    : options_(options) {
  if (options_.seq_len < 1) throw Error("token windows need seq_len >= 1");
  if (options_.eval_every == 1 || options_.eval_every < 0) {
    throw Error("eval_every must be 0 (no held-out split) or >= 2, got " +
                std::to_string(options_.eval_every));
  }
  if (shard_paths.empty()) throw Error("no token shards to read");
  windows_.push_back(0);
  std::int64_t recorded_vocab = 0;
  bool every_vocab_recorded = true;
  for (const auto& path : shard_paths) {
    auto shard = std::make_unique<MappedShard>(path);
    if (shard->tokens() < options_.seq_len + 1) {
      throw Error("token shard " + quoted(path) + " holds " + std::to_string(shard->tokens()) +
                  " tokens, fewer than one window of seq_len + 1 = " +
                  std::to_string(options_.seq_len + 1) + " tokens");
    }
    windows_.push_back(windows_.back() + (shard->tokens() - 1) / options_.seq_len);
    recorded_vocab = std::max<std::int64_t>(recorded_vocab, shard->vocab_size());
    if (shard->vocab_size() == 0) every_vocab_recorded = false;
    if (options_.vocab_size > 0 && shard->vocab_size() > options_.vocab_size) {
      throw Error("token shard " + quoted(path) + " records a vocabulary of " +
                  std::to_string(shard->vocab_size()) + " (offset 24), larger than vocab_size " +
                  std::to_string(options_.vocab_size));
    }
    shards_.push_back(std::move(shard));
  }
  vocab_size_ = options_.vocab_size;
  if (vocab_size_ == 0) {
    if (!every_vocab_recorded) {
      throw Error("a token shard records no vocabulary size (offset 24 is 0): set vocab_size");
    }
    vocab_size_ = recorded_vocab;
  }
  if (train_windows() < 1) throw Error("the token shards hold no training window");
}

std::int64_t TokenCorpus::eval_windows() const {
  return options_.eval_every > 0 ? windows() / options_.eval_every : 0;
}

std::int64_t TokenCorpus::train_windows() const { return windows() - eval_windows(); }

std::int64_t TokenCorpus::train_window(std::int64_t index) const {
  if (options_.eval_every == 0) return index;
  // Every eval_every-th window is held out, so eval_every - 1 train windows precede each one.
  return index + index / (options_.eval_every - 1);
}

std::int64_t TokenCorpus::eval_window(std::int64_t index) const {
  return index * options_.eval_every + options_.eval_every - 1;
}

TensorMap TokenCorpus::window(std::int64_t window) const {
  if (window < 0 || window >= windows()) {
    throw Error("token window " + std::to_string(window) + " is outside [0, " +
                std::to_string(windows()) + ")");
  }
  const auto after = std::upper_bound(windows_.begin(), windows_.end(), window);
  const auto shard = static_cast<std::size_t>(after - windows_.begin() - 1);
  const std::int64_t first = (window - windows_[shard]) * options_.seq_len;
  torch::Tensor tokens = at::empty({options_.seq_len + 1}, at::kLong);
  shards_[shard]->copy(first, options_.seq_len + 1, vocab_size_, tokens.data_ptr<std::int64_t>());
  return {{"input", tokens.narrow(0, 0, options_.seq_len)},
          {"target", tokens.narrow(0, 1, options_.seq_len)}};
}

double TokenCorpus::unigram_entropy() const {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(vocab_size_), 0);
  std::int64_t total = 0;
  for (const auto& shard : shards_) {
    for (std::int64_t i = 0; i < shard->tokens(); ++i) {
      const std::uint32_t t = shard->token(i);
      if (t < counts.size()) ++counts[t];
    }
    total += shard->tokens();
  }
  double entropy = 0;
  for (auto count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / static_cast<double>(total);
    entropy -= p * std::log(p);
  }
  return entropy;
}

Permutation::Permutation(std::uint64_t size, std::uint64_t key) : size_(size) {
  unsigned bits = 2;
  while (bits < 64 && (std::uint64_t{1} << bits) < size) bits += 2;
  half_bits_ = bits / 2;
  std::uint64_t state = key;
  for (auto& round_key : keys_) {
    state = splitmix64(state);
    round_key = state;
  }
}

std::uint64_t Permutation::apply_rounds(std::uint64_t value) const {
  const std::uint64_t mask = (std::uint64_t{1} << half_bits_) - 1;
  std::uint64_t left = value >> half_bits_;
  std::uint64_t right = value & mask;
  for (auto round_key : keys_) {
    const std::uint64_t mixed = left ^ (splitmix64(right ^ round_key) & mask);
    left = right;
    right = mixed;
  }
  return (left << half_bits_) | right;
}

std::uint64_t Permutation::operator()(std::uint64_t index) const {
  // A bijection on [0, 4^k) restricted to [0, size) by walking the cycle until it lands inside.
  std::uint64_t value = apply_rounds(index);
  while (value >= size_) value = apply_rounds(value);
  return value;
}

namespace {

// Positions rank + world_size * (worker + workers * j) of the epoch's permutation.
class WindowReader final : public SampleStream {
 public:
  WindowReader(std::shared_ptr<const TokenCorpus> corpus, const StreamShard& shard)
      : corpus_(std::move(corpus)),
        shard_(validated(shard)),
        train_(corpus_->train_windows()),
        used_(train_ / shard_.world_size * shard_.world_size),
        stride_(static_cast<std::int64_t>(shard_.world_size) * shard_.workers),
        offset_(shard_.rank + static_cast<std::int64_t>(shard_.world_size) * shard_.worker),
        permutation_(static_cast<std::uint64_t>(train_),
                     splitmix64(shard_.seed ^ splitmix64(static_cast<std::uint64_t>(shard_.epoch) +
                                                         0x746F6B656E73ull))) {}

  std::optional<TensorMap> next() override {
    const std::int64_t at = offset_ + stride_ * position_;
    if (at >= used_) return std::nullopt;
    ++position_;
    const auto index = static_cast<std::int64_t>(permutation_(static_cast<std::uint64_t>(at)));
    TensorMap sample = corpus_->window(corpus_->train_window(index));
    sample.emplace(kSampleIndexKey, at::scalar_tensor(index, at::kLong));
    return sample;
  }

  TensorMap state() const override {
    return {{"position", at::tensor({position_}, at::kLong)}, {"reader", identity()}};
  }

  void restore(const TensorMap& state) override {
    auto position = state.find("position");
    auto reader = state.find("reader");
    if (position == state.end() || reader == state.end() || position->second.numel() != 1) {
      throw Error("token stream state lacks 'position' or 'reader'");
    }
    const torch::Tensor expected = identity();
    const torch::Tensor saved = reader->second.to(at::kLong);
    if (!saved.sizes().equals(expected.sizes()) || !at::equal(saved, expected)) {
      throw Error(
          "token stream state belongs to another reader or corpus (saved [seed, epoch, "
          "rank, world_size, worker, workers, windows] differ from this stream's)");
    }
    const std::int64_t value = position->second.item<std::int64_t>();
    if (value < 0) throw Error("token stream state has a negative position");
    position_ = value;
  }

 private:
  static const StreamShard& validated(const StreamShard& shard) {
    if (shard.world_size < 1 || shard.rank < 0 || shard.rank >= shard.world_size ||
        shard.workers < 1 || shard.worker < 0 || shard.worker >= shard.workers || shard.epoch < 0) {
      throw Error("token stream: invalid reader (rank " + std::to_string(shard.rank) + " of " +
                  std::to_string(shard.world_size) + ", worker " + std::to_string(shard.worker) +
                  " of " + std::to_string(shard.workers) + ", epoch " +
                  std::to_string(shard.epoch) + ")");
    }
    return shard;
  }

  torch::Tensor identity() const {
    return at::tensor({static_cast<std::int64_t>(shard_.seed), shard_.epoch,
                       std::int64_t{shard_.rank}, std::int64_t{shard_.world_size},
                       std::int64_t{shard_.worker}, std::int64_t{shard_.workers}, train_},
                      at::kLong);
  }

  std::shared_ptr<const TokenCorpus> corpus_;
  StreamShard shard_;
  std::int64_t train_;
  std::int64_t used_;
  std::int64_t stride_;
  std::int64_t offset_;
  Permutation permutation_;
  std::int64_t position_ = 0;  // reads done this epoch
};

}  // namespace

std::unique_ptr<SampleStream> TrainStream::open(const StreamShard& shard) const {
  return std::make_unique<WindowReader>(corpus_, shard);
}

TensorMap EvalWindows::get(std::int64_t index) const {
  if (index < 0 || index >= size()) {
    throw Error("held-out window " + std::to_string(index) + " is outside [0, " +
                std::to_string(size()) + ")");
  }
  return corpus_->window(corpus_->eval_window(index));
}

TokenDataset::TokenDataset(std::shared_ptr<const TokenCorpus> corpus)
    : corpus_(std::move(corpus)),
      train_(std::make_shared<TrainStream>(corpus_)),
      eval_(corpus_->eval_windows() > 0 ? std::make_shared<EvalWindows>(corpus_) : nullptr) {}

DatasetInfo TokenDataset::info() const {
  DatasetInfo info;
  info.input_shape = {corpus_->seq_len()};
  info.vocab_size = corpus_->vocab_size();
  info.sequence_length = corpus_->seq_len();
  return info;
}

std::vector<std::string> TokenDataset::splits() const {
  if (eval_) return {"train", "test"};
  return {"train"};
}

std::shared_ptr<const MapSource> TokenDataset::map_split(const std::string& split) const {
  return split == "test" ? eval_ : nullptr;
}

std::shared_ptr<const StreamSource> TokenDataset::stream_split(const std::string& split) const {
  return split == "train" ? train_ : nullptr;
}

std::vector<fs::path> expand_glob(const fs::path& pattern, const std::string& what) {
  glob_t found{};
  const int code = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &found);
  std::vector<fs::path> out;
  if (code == 0) {
    for (std::size_t i = 0; i < found.gl_pathc; ++i) out.emplace_back(found.gl_pathv[i]);
  }
  ::globfree(&found);
  if (code == GLOB_NOMATCH || (code == 0 && out.empty())) {
    throw Error(what + " '" + pattern.string() + "' matches no file");
  }
  if (code != 0) throw Error("cannot list " + what + " '" + pattern.string() + "'");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace trainyard::token_shards
