#pragma once
// GPT-2's byte-to-unicode map: each byte as a printable character ('Ġ' for a space), the
// spelling of byte-level BPE vocabularies.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace trainyard::byte_level {

// The character standing for byte `b`.
char32_t char_of(std::uint8_t b);
// The byte that character `c` stands for, or nothing when it stands for none.
std::optional<std::uint8_t> byte_of(char32_t c);

// `bytes` spelled in the alphabet.
std::string encode(std::string_view bytes);
// The bytes a token spells, or nothing when one of its characters is outside the alphabet.
std::optional<std::string> decode(std::string_view token);

}  // namespace trainyard::byte_level
