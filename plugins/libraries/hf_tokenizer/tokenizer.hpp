#pragma once
// The tokenizer interface the training code sees: text to token ids and back, whatever file the
// tokenizer came from (a Hugging Face tokenizer.json or a SentencePiece .model;
// load_tokenizer.hpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard {

// Whether encode adds what the tokenizer's post-processor adds (a BOS such as Llama 3's
// <|begin_of_text|>), as Python's `tokenizer.encode(text, add_special_tokens=...)`.
enum class SpecialTokens { add, omit };
// Whether decode drops special tokens, as Python's `decode(ids, skip_special_tokens=...)`.
enum class SkipSpecial { yes, no };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Ids of UTF-8 `text`; throws std::runtime_error on invalid UTF-8. Safe to call from several
  // threads at once.
  std::vector<std::uint32_t> encode(std::string_view text,
                                    SpecialTokens special = SpecialTokens::add) const {
    std::vector<std::uint32_t> ids;
    encode_into(text, special, ids);
    return ids;
  }
  // The same, appending to `ids` (which keeps its capacity between calls).
  virtual void encode_into(std::string_view text, SpecialTokens special,
                           std::vector<std::uint32_t>& ids) const = 0;

  // Text of `ids`; ids outside the vocabulary are skipped, as the Python libraries do.
  virtual std::string decode(std::span<const std::uint32_t> ids,
                             SkipSpecial skip = SkipSpecial::yes) const = 0;

  // The number of distinct tokens, added tokens included (Python's `get_vocab_size()`).
  virtual std::size_t vocab_size() const = 0;
  virtual std::optional<std::uint32_t> bos_id() const { return std::nullopt; }
  virtual std::optional<std::uint32_t> eos_id() const { return std::nullopt; }
};

}  // namespace trainyard
