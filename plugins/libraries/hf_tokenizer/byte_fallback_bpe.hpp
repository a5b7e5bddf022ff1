#pragma once
// SentencePiece-style BPE as Llama 2 and Mistral tokenizer.json files have it: the units are
// Unicode characters ('▁' for a space), a character outside the vocabulary becomes its UTF-8
// bytes as <0xNN> tokens (byte_fallback) or the unk token, fused over a run when fuse_unk.

#include <array>

#include "bpe_model.hpp"

namespace trainyard {

class ByteFallbackBpe final : public BpeModel {
 public:
  explicit ByteFallbackBpe(const BpeOptions& options);

 private:
  void initial_symbols(std::string_view word, std::vector<std::uint32_t>& symbols) const override;
  std::optional<std::uint32_t> whole_word(std::string_view word) const override;

  std::array<std::int64_t, 128> ascii_ids_{};    // single ASCII characters; -1 for none
  std::array<std::int64_t, 256> byte_tokens_{};  // <0xNN>; -1 for none
};

}  // namespace trainyard
