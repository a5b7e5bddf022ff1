#include "json_tokenizer.hpp"

#include <set>

#include "utf8.hpp"

namespace trainyard {

JsonTokenizer::JsonTokenizer(JsonTokenizerParts parts) : parts_(std::move(parts)) {
  std::set<std::string> extra;
  for (const AddedToken& token : parts_.added.tokens())
    if (!parts_.model->token_to_id(token.content)) extra.insert(token.content);
  vocab_size_ = parts_.model->size() + extra.size();
}

void JsonTokenizer::encode_into(std::string_view text, SpecialTokens special,
                                std::vector<std::uint32_t>& ids) const {
  utf8::require_valid(text, parts_.path + ": encode: the text");
  const bool add_special = special == SpecialTokens::add;
  auto lease = pool_.take();
  EncodeScratch& scratch = *lease;
  const bool through = parts_.post_processor.passes_through(add_special);
  std::vector<std::uint32_t>& sequence = through ? ids : scratch.sequence;
  if (!through) sequence.clear();
  parts_.added.split(
      text, false, scratch,
      [&](std::string_view piece, std::size_t offset, std::optional<std::uint32_t> id) {
        if (id) {
          sequence.push_back(*id);
        } else {
          encode_piece(piece, offset == 0, scratch, sequence);
        }
      });
  if (!through) parts_.post_processor.apply(sequence, add_special, ids);
}

void JsonTokenizer::encode_piece(std::string_view piece, bool at_start, EncodeScratch& scratch,
                                 std::vector<std::uint32_t>& out) const {
  if (piece.empty()) return;
  std::string normalized;
  if (parts_.normalizer) {
    parts_.normalizer->normalize(piece, normalized);
    piece = normalized;
  }
  if (!parts_.added.has_normalized()) {
    encode_words(piece, at_start, scratch, out);
    return;
  }
  parts_.added.split(
      piece, true, scratch,
      [&](std::string_view part, std::size_t offset, std::optional<std::uint32_t> id) {
        if (id) {
          out.push_back(*id);
        } else {
          encode_words(part, at_start && offset == 0, scratch, out);
        }
      });
}

void JsonTokenizer::encode_words(std::string_view text, bool at_start, EncodeScratch& scratch,
                                 std::vector<std::uint32_t>& out) const {
  if (text.empty()) return;
  if (!parts_.pre_tokenizer) {
    parts_.model->encode_word(text, scratch.bpe, out);
    return;
  }
  parts_.pre_tokenizer->pre_tokenize(text, at_start, scratch, [&](std::string_view word, bool) {
    parts_.model->encode_word(word, scratch.bpe, out);
  });
}

std::string JsonTokenizer::decode(std::span<const std::uint32_t> ids, SkipSpecial skip) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const std::uint32_t id : ids) {
    const std::string* token = parts_.added.decoded(id);
    if (!token) token = parts_.model->token(id);
    if (!token) continue;
    if (skip == SkipSpecial::yes && parts_.added.is_special_content(*token)) continue;
    tokens.push_back(*token);
  }
  std::string text;
  if (parts_.decoder) {
    parts_.decoder->decode_chain(tokens);
    for (const std::string& token : tokens) text += token;
    return text;
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  return text;
}

std::optional<std::uint32_t> JsonTokenizer::bos_id() const {
  return parts_.post_processor.leading();
}

std::optional<std::uint32_t> JsonTokenizer::eos_id() const {
  if (const auto trailing = parts_.post_processor.trailing()) return trailing;
  for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"}) {
    for (const AddedToken& token : parts_.added.tokens())
      if (token.special && token.content == name) return token.id;
  }
  return std::nullopt;
}

}  // namespace trainyard
