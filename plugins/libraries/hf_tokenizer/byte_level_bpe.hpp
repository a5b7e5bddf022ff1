#pragma once
// Byte-level BPE (GPT-2, Llama 3): the vocabulary is spelled in GPT-2's byte alphabet, so every
// byte has a token and nothing is unknown. Words are encoded from their raw bytes: the
// vocabulary is looked up by the bytes each token spells, which is the same as spelling the
// word in the alphabet first, without doing it.

#include <array>

#include "bpe_model.hpp"

namespace trainyard {

class ByteLevelBpe final : public BpeModel {
 public:
  // Throws std::runtime_error for byte_fallback (meaningless over the byte alphabet) and as
  // BpeModel does.
  explicit ByteLevelBpe(const BpeOptions& options);

 private:
  void initial_symbols(std::string_view word, std::vector<std::uint32_t>& symbols) const override;
  std::optional<std::uint32_t> whole_word(std::string_view word) const override;

  StringTable<std::uint32_t> by_bytes_;       // the vocabulary keyed by the bytes it spells
  std::array<std::int64_t, 256> byte_ids_{};  // -1 where the byte's character is not a token
};

}  // namespace trainyard
