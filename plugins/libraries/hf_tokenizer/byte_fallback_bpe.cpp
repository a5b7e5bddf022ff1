#include "byte_fallback_bpe.hpp"

#include <cstdio>

#include "utf8.hpp"

namespace trainyard {

ByteFallbackBpe::ByteFallbackBpe(const BpeOptions& options) : BpeModel(options) {
  for (int c = 0; c < 128; ++c) {
    const char ch = static_cast<char>(c);
    const std::uint32_t* id = vocab().find(std::string_view(&ch, 1));
    ascii_ids_[c] = id ? static_cast<std::int64_t>(*id) : -1;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const std::uint32_t* id = vocab().find(name);
    byte_tokens_[b] = id ? static_cast<std::int64_t>(*id) : -1;
  }
}

void ByteFallbackBpe::initial_symbols(std::string_view word,
                                      std::vector<std::uint32_t>& symbols) const {
  bool pending = false;
  for (std::size_t at = 0; at < word.size();) {
    const auto lead = static_cast<unsigned char>(word[at]);
    const std::size_t length = utf8::char_length(lead);
    std::int64_t id = -1;
    if (lead < 0x80) {
      id = ascii_ids_[lead];
    } else if (const std::uint32_t* found = vocab().find(word.substr(at, length))) {
      id = *found;
    }
    if (id >= 0) {
      flush_unknown(symbols, pending);
      symbols.push_back(static_cast<std::uint32_t>(id));
    } else {
      bool fell_back = byte_fallback();
      for (std::size_t i = 0; fell_back && i < length; ++i)
        fell_back = byte_tokens_[static_cast<unsigned char>(word[at + i])] >= 0;
      if (fell_back) {
        // As HF: the bytes go in at once, ahead of an unk still held back.
        for (std::size_t i = 0; i < length; ++i)
          symbols.push_back(
              static_cast<std::uint32_t>(byte_tokens_[static_cast<unsigned char>(word[at + i])]));
      } else {
        unknown(symbols, pending);
      }
    }
    at += length;
  }
  flush_unknown(symbols, pending);
}

std::optional<std::uint32_t> ByteFallbackBpe::whole_word(std::string_view word) const {
  return token_to_id(word);
}

}  // namespace trainyard
