#pragma once
// What byte-level and byte-fallback BPE share: the vocabulary, the merges ranked by their place
// in the merges list, unknown tokens, and per-thread scratch (a word cache and the merge loop's
// buffers). Words are merged as Hugging Face tokenizers' BPE does: always the lowest-ranked
// adjacent pair, the leftmost of equals, until none is left.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flat_tables.hpp"

namespace trainyard {

struct BpeOptions {
  std::vector<std::pair<std::string, std::uint32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;  // a whole word found in the vocab is one token, merges unused
};

// A thread's buffers for encoding words: reused, never shared between threads.
class BpeScratch {
 public:
  // Ids of `word` when it was encoded before.
  const std::uint32_t* find(std::string_view word, std::size_t& count) const;
  void remember(std::string_view word, const std::uint32_t* ids, std::size_t count);

  std::vector<std::uint32_t> symbols;  // the word's tokens while merging
  std::vector<std::uint32_t> ranks, made, prev, next;
  std::vector<char> removed;
  struct Candidate {
    std::uint32_t rank, pos, new_id;
  };
  std::vector<Candidate> heap;

 private:
  struct Span {
    std::uint32_t offset, count;
  };
  StringTable<Span> cache_;
  std::vector<std::uint32_t> cached_ids_;
};

class BpeModel {
 public:
  virtual ~BpeModel() = default;

  // Appends the ids of one pre-token (`word`, non-empty) to `out`.
  void encode_word(std::string_view word, BpeScratch& scratch,
                   std::vector<std::uint32_t>& out) const;

  // The token of `id` as the vocabulary spells it, or nothing outside the vocabulary.
  const std::string* token(std::uint32_t id) const;
  std::optional<std::uint32_t> token_to_id(std::string_view token) const;
  std::size_t size() const { return vocab_.size(); }

 protected:
  // Builds the vocabulary and merge table; throws std::runtime_error naming a merge whose
  // tokens, or their concatenation, are not in the vocab, or an unk_token that is not.
  explicit BpeModel(const BpeOptions& options);

  // The word's first symbols (before any merge), from the subclass's notion of a unit.
  virtual void initial_symbols(std::string_view word,
                               std::vector<std::uint32_t>& symbols) const = 0;
  // The id a whole word has under ignore_merges, in the subclass's spelling of words.
  virtual std::optional<std::uint32_t> whole_word(std::string_view word) const = 0;

  // HF's unknown units: the unk token is held back until a known unit (or the word's end)
  // follows, so that a run of unknowns fuses into one when fuse_unk; without an unk token the
  // unit is dropped.
  void unknown(std::vector<std::uint32_t>& symbols, bool& pending) const;
  void flush_unknown(std::vector<std::uint32_t>& symbols, bool& pending) const;

  const StringTable<std::uint32_t>& vocab() const { return vocab_; }
  bool byte_fallback() const { return byte_fallback_; }
  bool has_unk() const { return unk_id_.has_value(); }

 private:
  void merge(BpeScratch& scratch) const;
  void merge_short(BpeScratch& scratch) const;
  void merge_long(BpeScratch& scratch) const;

  StringTable<std::uint32_t> vocab_;
  std::vector<std::string> tokens_;  // by id
  std::vector<bool> present_;
  MergeTable merges_;
  std::optional<std::uint32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
};

}  // namespace trainyard
