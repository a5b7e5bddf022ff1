#include "added_tokens.hpp"

#include <algorithm>

#include "regex.hpp"
#include "utf8.hpp"

namespace trainyard {
namespace {

// Rust regex's Unicode \w (Alphabetic, marks, decimal digits, connector punctuation,
// joiners), which tokenizers' single_word checks use; Alphabetic is approximated by letters,
// letter numbers and the symbols with Other_Alphabetic.
bool is_word_char(std::string_view text, std::size_t at, EncodeScratch& scratch) {
  static const Regex word(
      R"([\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\x{24B6}-\x{24E9}\x{1F130}-\x{1F149})"
      R"(\x{1F150}-\x{1F169}\x{1F170}-\x{1F189}])");
  const std::string_view one =
      text.substr(at, utf8::char_length(static_cast<unsigned char>(text[at])));
  bool found = false;
  word.for_each_match(one, scratch.regex, [&](std::size_t, std::size_t) { found = true; });
  return found;
}

std::size_t previous_char(std::string_view text, std::size_t at) {
  do --at;
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80);
  return at;
}

// The start of the white space that ends text[0, end).
std::size_t trailing_space_start(std::string_view text, std::size_t end) {
  while (end > 0) {
    const std::size_t at = previous_char(text, end);
    if (!utf8::is_white_space(utf8::decode_at(text, at))) break;
    end = at;
  }
  return end;
}

// The end of the white space that starts text[begin, size).
std::size_t leading_space_end(std::string_view text, std::size_t begin) {
  while (begin < text.size() && utf8::is_white_space(utf8::decode_at(text, begin)))
    begin += utf8::char_length(static_cast<unsigned char>(text[begin]));
  return begin;
}

}  // namespace

void AddedTokenMatcher::add(std::string_view pattern, std::size_t token) {
  if (pattern.empty()) return;
  std::uint32_t node = 0;
  for (const char c : pattern) {
    const auto byte = static_cast<unsigned char>(c);
    std::uint32_t child = 0;
    for (const auto& [b, index] : nodes_[node].children)
      if (b == byte) child = index;
    if (child == 0) {
      child = static_cast<std::uint32_t>(nodes_.size());
      nodes_[node].children.emplace_back(byte, child);
      nodes_.emplace_back();
    }
    node = child;
  }
  if (nodes_[node].token < 0) nodes_[node].token = static_cast<std::int64_t>(token);
  first_[static_cast<unsigned char>(pattern.front())] = true;
}

std::optional<std::pair<std::size_t, std::size_t>> AddedTokenMatcher::longest_at(
    std::string_view text, std::size_t at) const {
  std::optional<std::pair<std::size_t, std::size_t>> best;
  std::uint32_t node = 0;
  for (std::size_t i = at; i < text.size(); ++i) {
    std::uint32_t child = 0;
    for (const auto& [b, index] : nodes_[node].children)
      if (b == static_cast<unsigned char>(text[i])) child = index;
    if (child == 0) break;
    node = child;
    if (nodes_[node].token >= 0) best.emplace(static_cast<std::size_t>(nodes_[node].token), i + 1);
  }
  return best;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& token = tokens_[i];
    (token.normalized ? normalized_ : raw_).add(token.pattern, i);
    by_id_[token.id] = i;
    if (token.special) specials_.insert(token.content, 1);
  }
}

const std::string* AddedVocabulary::decoded(std::uint32_t id) const {
  const auto found = by_id_.find(id);
  return found == by_id_.end() ? nullptr : &tokens_[found->second].pattern;
}

// tokenizers' AddedVocabulary::find_matches, one match after another from the end of the last.
void AddedVocabulary::split(std::string_view text, bool normalized_pass, EncodeScratch& scratch,
                            AddedSink sink) const {
  const AddedTokenMatcher& matcher = normalized_pass ? normalized_ : raw_;
  if (matcher.empty()) {
    sink(text, 0, std::nullopt);
    return;
  }
  std::size_t start_offset = 0;
  for (std::size_t at = 0; at < text.size();) {
    if (!matcher.may_start(static_cast<unsigned char>(text[at]))) {
      ++at;
      continue;
    }
    const auto found = matcher.longest_at(text, at);
    if (!found) {
      ++at;
      continue;
    }
    const AddedToken& token = tokens_[found->first];
    std::size_t start = at, stop = found->second;
    at = stop;
    if (token.single_word) {
      const bool space_before =
          start == 0 || !is_word_char(text, previous_char(text, start), scratch);
      const bool space_after = stop == text.size() || !is_word_char(text, stop, scratch);
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(text, start), start_offset);
    if (token.rstrip) stop = leading_space_end(text, stop);
    if (start_offset < start)
      sink(text.substr(start_offset, start - start_offset), start_offset, std::nullopt);
    sink(text.substr(start, stop - start), start, token.id);
    start_offset = stop;
  }
  if (start_offset != text.size()) sink(text.substr(start_offset), start_offset, std::nullopt);
}

}  // namespace trainyard
