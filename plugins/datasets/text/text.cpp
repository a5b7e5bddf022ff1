// UTF-8 text files turned into a token shard once, then read like the `tokens` dataset.
//
// Tokenizers: "byte" (each byte is a token, vocabulary 256), "bpe" (byte-pair encoding trained
// on the corpus itself: starting from bytes, the most frequent adjacent pair becomes a new token
// until vocab_size is reached or no pair repeats), or the path of a Hugging Face tokenizer.json or
// a SentencePiece .model (the hf_tokenizer library, whose ids are Python's).
//
// The shard is cached in <cache>/<key>/ where the key hashes the format version, the tokenizer
// settings (for a tokenizer file, its bytes rather than its path, so an edited file re-tokenizes)
// and every input file's path, size and bytes, so a change to any of them builds a new cache entry
// and an unchanged corpus is never tokenized twice. An entry is built in a temporary folder and
// renamed into place, so a crash never leaves a half-written entry under its key.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fnmatch.h>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>

#include "load_tokenizer.hpp"
#include "token_shards.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/support/files.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCacheFormat = "trainyard-text-cache-v1";
constexpr std::int64_t kMaxBpeVocab = 4096;

struct TextFile {
  fs::path path;
  std::string bytes;
};

// What turns the text into ids.
struct TextTokenizer {
  std::string name;  // "byte", "bpe", or the tokenizer file's path
  std::uint32_t vocab_size = 256;
  std::unique_ptr<Tokenizer> file;  // the tokenizer file's tokenizer; null for byte and bpe
  std::string file_bytes;           // what the cache key hashes for a tokenizer file
};

bool names_tokenizer_file(const std::string& tokenizer) {
  return tokenizer.ends_with(".json") || tokenizer.ends_with(".model");
}

// Offset of the first byte that breaks UTF-8, or npos.
std::size_t invalid_utf8_offset(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    std::size_t extra = 0;
    std::uint32_t min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, min = 0x10000;
    } else {
      return i;
    }
    std::uint32_t code = c & (0x3F >> extra);
    for (std::size_t k = 1; k <= extra; ++k) {
      if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return i;
      code = (code << 6) | (s[i + k] & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += extra + 1;
  }
  return std::string::npos;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open text file " + path.string());
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) throw Error("cannot read text file " + path.string());
  std::string text = out.str();
  if (auto offset = invalid_utf8_offset(text); offset != std::string::npos) {
    std::ostringstream message;
    message << "text file " << path.string() << " is not UTF-8: invalid byte 0x" << std::hex
            << std::setw(2) << std::setfill('0')
            << static_cast<unsigned>(static_cast<unsigned char>(text[offset])) << std::dec
            << " at offset " << offset;
    throw Error(message.str());
  }
  return text;
}

// 64-bit FNV-1a, twice with different offsets for a 128-bit key.
struct Hasher {
  std::uint64_t a = 0xcbf29ce484222325ull;
  std::uint64_t b = 0x84222325cbf29ce4ull;
  void add(const void* data, std::size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < size; ++i) {
      a = (a ^ p[i]) * 0x100000001b3ull;
      b = (b ^ p[i]) * 0x100000001b3ull ^ (b >> 29);
    }
  }
  void add(const std::string& text) {
    const std::uint64_t size = text.size();
    add(&size, sizeof size);
    add(text.data(), text.size());
  }
  std::string hex() const {
    std::ostringstream out;
    out << std::hex << std::setfill('0') << std::setw(16) << a << std::setw(16) << b;
    return out.str();
  }
};

// Byte-pair encoding trained on `ids` in place: returns the merges (left, right) in order; merge
// i made token 256 + i. Ties go to the smallest pair, so training is deterministic.
std::vector<std::pair<std::uint32_t, std::uint32_t>> train_bpe(std::vector<std::uint32_t>& ids,
                                                               std::uint32_t vocab_size) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> merges;
  const std::size_t width = vocab_size;
  std::vector<std::uint32_t> counts(width * width, 0);
  std::vector<std::size_t> touched;
  for (std::uint32_t next = 256; next < vocab_size; ++next) {
    for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
      const std::size_t pair = ids[i] * width + ids[i + 1];
      if (counts[pair]++ == 0) touched.push_back(pair);
    }
    std::size_t best = 0;
    std::uint32_t best_count = 0;
    for (auto pair : touched) {
      if (counts[pair] > best_count || (counts[pair] == best_count && pair < best)) {
        best = pair;
        best_count = counts[pair];
      }
      counts[pair] = 0;
    }
    touched.clear();
    if (best_count < 2) break;
    const auto left = static_cast<std::uint32_t>(best / width);
    const auto right = static_cast<std::uint32_t>(best % width);
    std::size_t out = 0;
    for (std::size_t i = 0; i < ids.size();) {
      if (i + 1 < ids.size() && ids[i] == left && ids[i + 1] == right) {
        ids[out++] = next;
        i += 2;
      } else {
        ids[out++] = ids[i++];
      }
    }
    ids.resize(out);
    merges.emplace_back(left, right);
  }
  return merges;
}

// Entropy in nats of the token frequencies: the loss floor of a model that ignores context.
double unigram_entropy(const std::vector<std::uint32_t>& ids, std::uint32_t vocab) {
  std::vector<std::size_t> counts(vocab, 0);
  for (auto id : ids) ++counts[id];
  double entropy = 0;
  for (auto count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / static_cast<double>(ids.size());
    entropy -= p * std::log(p);
  }
  return entropy;
}

fs::path default_cache() {
  if (const char* cache = std::getenv("TRAINYARD_CACHE"); cache && *cache) {
    return fs::path(cache) / "text";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return fs::path(home) / ".cache" / "trainyard" / "text";
  }
  return fs::temp_directory_path() / "trainyard-text-cache";
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw Error("cannot write " + path.string());
}

// Each file is one document, encoded as Python's `tokenizer.encode(text)` encodes it by default
// (add_special_tokens on): a tokenizer.json's post-processor puts its special tokens around each
// file (Llama 3's template a <|begin_of_text|> first, GPT-2's nothing), and a SentencePiece .model,
// which has no post-processor, adds none, as sentencepiece's `encode(text)`.
void encode_with_file(const TextTokenizer& tokenizer, const std::vector<TextFile>& files,
                      std::vector<std::uint32_t>& ids) {
  for (const auto& file : files) {
    try {
      tokenizer.file->encode_into(file.bytes, SpecialTokens::add, ids);
    } catch (const std::exception& error) {
      throw Error("text: cannot tokenize " + file.path.string() + ": " + error.what());
    }
  }
  // The vocabulary counts tokens, so a tokenizer whose ids leave gaps could give one beyond it,
  // which every window holding it would be refused for later.
  const auto largest = std::max_element(ids.begin(), ids.end());
  if (largest != ids.end() && *largest >= tokenizer.vocab_size) {
    throw Error("text: tokenizer " + tokenizer.name + " gives id " + std::to_string(*largest) +
                ", outside its vocabulary of " + std::to_string(tokenizer.vocab_size));
  }
}

// Builds (or finds) the cache entry for `files` and returns the shard's path.
fs::path cached_shard(const std::vector<TextFile>& files, const TextTokenizer& tokenizer,
                      const fs::path& cache) {
  Hasher hasher;
  hasher.add(kCacheFormat);
  if (tokenizer.file) {
    hasher.add("file");
    hasher.add(tokenizer.file_bytes);
  } else {
    hasher.add(tokenizer.name);
  }
  hasher.add(&tokenizer.vocab_size, sizeof tokenizer.vocab_size);
  for (const auto& file : files) {
    hasher.add(file.path.string());
    hasher.add(file.bytes);
  }
  const fs::path entry = cache / hasher.hex();
  const fs::path shard = entry / "tokens.bin";
  if (fs::exists(shard)) return shard;

  std::error_code error;
  fs::create_directories(cache, error);
  if (error) throw Error("cannot create text cache folder " + cache.string() + ": " + error.message());
  std::random_device entropy;
  const fs::path building = cache / (hasher.hex() + ".building." + std::to_string(::getpid()) +
                                     "." + std::to_string(entropy()));
  fs::create_directories(building, error);
  if (error) throw Error("cannot create " + building.string() + ": " + error.message());
  try {
    std::vector<std::uint32_t> ids;
    std::size_t bytes = 0;
    for (const auto& file : files) bytes += file.bytes.size();
    std::uint32_t vocab = tokenizer.vocab_size;
    if (tokenizer.file) {
      encode_with_file(tokenizer, files, ids);
    } else {
      ids.reserve(bytes);
      for (const auto& file : files) {
        for (unsigned char c : file.bytes) ids.push_back(c);
      }
      vocab = 256;
    }
    std::ostringstream merges_text;
    if (tokenizer.name == "bpe") {
      auto merges = train_bpe(ids, tokenizer.vocab_size);
      vocab = 256 + static_cast<std::uint32_t>(merges.size());
      for (std::size_t i = 0; i < merges.size(); ++i) {
        merges_text << 256 + i << ' ' << merges[i].first << ' ' << merges[i].second << '\n';
      }
      write_text_file(building / "merges.txt", merges_text.str());
    }
    token_shards::write_shard(building / "tokens.bin", ids, vocab);
    const double entropy = unigram_entropy(ids, vocab);
    std::ostringstream meta;
    meta << "tokenizer " << tokenizer.name << "\nvocab_size " << vocab << "\ntokens " << ids.size()
         << "\nbytes " << bytes << "\nunigram_entropy_nats " << entropy << "\n";
    for (const auto& file : files) meta << "file " << file.path.string() << "\n";
    write_text_file(building / "meta.txt", meta.str());
    std::cerr << "text: tokenized " << files.size() << " files (" << bytes << " bytes) into "
              << ids.size()
              << (tokenizer.file ? " tokens of " + tokenizer.name
                                 : " " + tokenizer.name + " tokens")
              << ", vocabulary " << vocab << ", unigram entropy " << entropy << " nats, cached in "
              << entry.string() << "\n";
  } catch (...) {
    remove_tree(building);
    throw;
  }
  if (::rename(building.c_str(), entry.c_str()) != 0) {
    const int code = errno;
    remove_tree(building);
    // Another process finished the same entry first: theirs is complete, use it.
    if ((code == ENOTEMPTY || code == EEXIST) && fs::exists(shard)) return shard;
    throw Error("cannot move the text cache entry into place at " + entry.string() + ": " +
                std::strerror(code));
  }
  return shard;
}

std::string read_tokenizer_bytes(const Config& options, const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  if (!in) options.fail("tokenizer", "cannot read " + path.string());
  return out.str();
}

TextTokenizer text_tokenizer(const Config& options) {
  TextTokenizer tokenizer;
  tokenizer.name = options.get_string("tokenizer");
  const std::int64_t vocab_size = options.get_int("vocab_size");
  if (tokenizer.name == "byte") {
    if (vocab_size != 0 && vocab_size != 256) {
      options.fail("vocab_size", "must be 0 or 256 with the byte tokenizer");
    }
    tokenizer.vocab_size = 256;
  } else if (tokenizer.name == "bpe") {
    if (vocab_size != 0 && (vocab_size < 257 || vocab_size > kMaxBpeVocab)) {
      options.fail("vocab_size", "must be in [257, " + std::to_string(kMaxBpeVocab) +
                                     "] with the bpe tokenizer");
    }
    tokenizer.vocab_size = vocab_size == 0 ? 512 : static_cast<std::uint32_t>(vocab_size);
  } else if (names_tokenizer_file(tokenizer.name)) {
    const fs::path path = options.get_path("tokenizer");
    tokenizer.name = path.string();
    try {
      tokenizer.file = load_tokenizer(path);
    } catch (const std::exception& error) {
      // The library's reason names the file and the part it refuses, on one line.
      options.fail("tokenizer", std::string("does not load: ") + error.what());
    }
    tokenizer.file_bytes = read_tokenizer_bytes(options, path);
    const std::size_t file_vocab = tokenizer.file->vocab_size();
    if (vocab_size != 0 && static_cast<std::size_t>(vocab_size) != file_vocab) {
      options.fail("vocab_size", "must be 0 or " + std::to_string(file_vocab) +
                                     ", the vocabulary of " + path.string() + ", got " +
                                     std::to_string(vocab_size));
    }
    tokenizer.vocab_size = static_cast<std::uint32_t>(file_vocab);
  } else {
    options.fail("tokenizer",
                 R"(must be "byte", "bpe" or a tokenizer file (*.json, *.model), got ")" +
                     tokenizer.name + "\"");
  }
  return tokenizer;
}

std::unique_ptr<Dataset> make_text(const Config& options) {
  const fs::path pattern = options.get_path("path");
  const auto excludes = options.get_string_list("exclude");
  const TextTokenizer tokenizer = text_tokenizer(options);
  token_shards::CorpusOptions corpus;
  corpus.seq_len = options.get_int("seq_len");
  corpus.eval_every = options.get_int("eval_every");
  const fs::path cache = options.get_string("cache").empty() ? default_cache()
                                                             : options.get_path("cache");

  std::vector<TextFile> files;
  std::size_t bytes = 0;
  std::vector<fs::path> paths;
  try {
    paths = token_shards::expand_glob(pattern, options.qualified("path"));
  } catch (const Error& error) {
    const bool fortunes = pattern.string().rfind("/usr/share/games/fortunes", 0) == 0;
    if (!fortunes) throw;
    throw Error(std::string(error.what()) + " (tools/setup installs Debian's fortunes)");
  }
  for (const auto& path : paths) {
    const std::string name = path.filename().string();
    const bool excluded = std::any_of(excludes.begin(), excludes.end(), [&](const auto& glob) {
      return ::fnmatch(glob.c_str(), name.c_str(), 0) == 0;
    });
    if (excluded || !fs::is_regular_file(path)) continue;
    files.push_back({path, read_text(path)});
    bytes += files.back().bytes.size();
  }
  if (bytes == 0) {
    throw Error("dataset 'text': the corpus is empty: " + options.qualified("path") + " '" +
                pattern.string() + "' gives " + std::to_string(files.size()) +
                " text files holding no text");
  }
  const fs::path shard = cached_shard(files, tokenizer, cache);
  return std::make_unique<token_shards::TokenDataset>(
      std::make_shared<token_shards::TokenCorpus>(std::vector<fs::path>{shard}, corpus));
}

void register_components(Registry& registry) {
  registry.add<Dataset>(
      "text",
      {option("path", "/usr/share/games/fortunes/*",
              "glob of UTF-8 text files (default: Debian's fortunes)"),
       option("exclude", std::vector<std::string>{"*.dat", "*.u8"},
              "file-name patterns to skip (fortune's index files and links)"),
       option("tokenizer", "byte",
              "\"byte\" (vocabulary 256), \"bpe\" (trained on the corpus), or the path of a "
              "Hugging Face tokenizer.json or SentencePiece .model, relative to the recipe "
              "(each file encoded with the special tokens the tokenizer adds by default)"),
       option("vocab_size", 0,
              "bpe vocabulary size (0: 512 for bpe, 256 for byte, the file's for a tokenizer "
              "file, which it must equal otherwise)"),
       option("cache", "", "folder of tokenized corpora (default: $TRAINYARD_CACHE/text or "
                           "~/.cache/trainyard/text)"),
       option("seq_len", 128, "tokens per window (the model's sequence length)").at_least(1),
       option("eval_every", 20, "hold out every N-th window as the test split (0: none)")
           .at_least(2)
           .or_exactly(0, "for no test split")},
      "UTF-8 text tokenized once (byte, BPE or a tokenizer file) into a cached token shard, read "
      "as windows",
      [](const Config& options, const BuildContext&) { return make_text(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("text", "1.0.0", trainyard::register_components)
