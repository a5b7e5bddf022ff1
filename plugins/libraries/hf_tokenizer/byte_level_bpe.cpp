#include "byte_level_bpe.hpp"

#include <stdexcept>

#include "byte_level_alphabet.hpp"

namespace trainyard {

ByteLevelBpe::ByteLevelBpe(const BpeOptions& options) : BpeModel(options) {
  if (options.byte_fallback) {
    throw std::runtime_error(
        "model: byte_fallback with a ByteLevel pre-tokenizer is not supported");
  }
  for (const auto& [token, id] : options.vocab) {
    if (*vocab().find(token) != id) continue;
    // A token spelling no bytes (outside the alphabet) can never be reached from text.
    if (const auto bytes = byte_level::decode(token)) by_bytes_.insert(*bytes, id, true);
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    const std::uint32_t* id = by_bytes_.find(std::string_view(&byte, 1));
    byte_ids_[b] = id ? static_cast<std::int64_t>(*id) : -1;
  }
}

void ByteLevelBpe::initial_symbols(std::string_view word,
                                   std::vector<std::uint32_t>& symbols) const {
  bool pending = false;
  for (const char byte : word) {
    const std::int64_t id = byte_ids_[static_cast<unsigned char>(byte)];
    if (id >= 0) {
      flush_unknown(symbols, pending);
      symbols.push_back(static_cast<std::uint32_t>(id));
    } else {
      unknown(symbols, pending);
    }
  }
  flush_unknown(symbols, pending);
}

std::optional<std::uint32_t> ByteLevelBpe::whole_word(std::string_view word) const {
  const std::uint32_t* id = by_bytes_.find(word);
  return id ? std::optional<std::uint32_t>(*id) : std::nullopt;
}

}  // namespace trainyard
