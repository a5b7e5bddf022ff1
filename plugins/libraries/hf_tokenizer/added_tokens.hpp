#pragma once
// tokenizer.json's added_tokens: found in the text before anything else runs, longest first at
// the leftmost place (as tokenizers' Aho-Corasick, LeftmostLongest), with single_word, lstrip
// and rstrip as tokenizers applies them. Tokens with normalized=false are found in the raw
// text, the others in each normalized piece between those.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "encode_scratch.hpp"
#include "flat_tables.hpp"
#include "function_ref.hpp"

namespace trainyard {

struct AddedToken {
  std::uint32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  std::string pattern;  // what is matched: the content, normalized when `normalized`
};

// Receives the pieces of a text in order: an added token's id, or text to go on with.
using AddedSink =
    FunctionRef<void(std::string_view piece, std::size_t offset, std::optional<std::uint32_t> id)>;

class AddedTokenMatcher {
 public:
  void add(std::string_view pattern, std::size_t token);
  bool empty() const { return nodes_.size() <= 1; }
  // The token and end of the longest pattern at `at`, if any.
  std::optional<std::pair<std::size_t, std::size_t>> longest_at(std::string_view text,
                                                                std::size_t at) const;
  bool may_start(unsigned char byte) const { return first_[byte]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::uint32_t>> children;
    std::int64_t token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_{};
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  explicit AddedVocabulary(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }
  bool has_normalized() const { return !normalized_.empty(); }
  // Splits `text` on the tokens with normalized=false (`normalized_pass` false) or true.
  void split(std::string_view text, bool normalized_pass, EncodeScratch& scratch,
             AddedSink sink) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // The text an id decodes to (the normalized form for normalized tokens), when it is one.
  const std::string* decoded(std::uint32_t id) const;
  bool is_special_content(std::string_view text) const { return specials_.find(text); }

 private:
  std::vector<AddedToken> tokens_;
  AddedTokenMatcher raw_, normalized_;
  std::unordered_map<std::uint32_t, std::size_t> by_id_;  // id -> index in tokens_
  StringTable<char> specials_;
};

}  // namespace trainyard
