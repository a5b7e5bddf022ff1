#pragma once
// A tokenizer read from a Hugging Face tokenizer.json, run as tokenizers runs it: added tokens
// split out first, then each remaining piece normalized, pre-tokenized into words and each word
// encoded by the BPE model; the post-processor's template around the result.

#include <memory>
#include <string>

#include "added_tokens.hpp"
#include "bpe_model.hpp"
#include "decoder.hpp"
#include "encode_scratch.hpp"
#include "normalizer.hpp"
#include "post_processor.hpp"
#include "pre_tokenizer.hpp"
#include "tokenizer.hpp"

namespace trainyard {

struct JsonTokenizerParts {
  std::string path;  // for messages
  AddedVocabulary added;
  std::unique_ptr<Normalizer> normalizer;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null: the piece is one word
  std::unique_ptr<BpeModel> model;
  TemplateProcessing post_processor;
  std::unique_ptr<Decoder> decoder;  // may be null: tokens joined by spaces
};

class JsonTokenizer final : public Tokenizer {
 public:
  explicit JsonTokenizer(JsonTokenizerParts parts);

  void encode_into(std::string_view text, SpecialTokens special,
                   std::vector<std::uint32_t>& ids) const override;
  std::string decode(std::span<const std::uint32_t> ids, SkipSpecial skip) const override;
  std::size_t vocab_size() const override { return vocab_size_; }
  // The special token the template puts first (Llama 3's <|begin_of_text|>, Llama 2's <s>).
  std::optional<std::uint32_t> bos_id() const override;
  // The one the template puts last, else a special added token named as end-of-text tokens
  // usually are (</s>, <|end_of_text|>, <|endoftext|>, <eos>).
  std::optional<std::uint32_t> eos_id() const override;

 private:
  void encode_piece(std::string_view piece, bool at_start, EncodeScratch& scratch,
                    std::vector<std::uint32_t>& out) const;
  void encode_words(std::string_view text, bool at_start, EncodeScratch& scratch,
                    std::vector<std::uint32_t>& out) const;

  JsonTokenizerParts parts_;
  std::size_t vocab_size_ = 0;
  mutable ScratchPool pool_;
};

}  // namespace trainyard
