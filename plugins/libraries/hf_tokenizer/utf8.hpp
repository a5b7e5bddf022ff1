#pragma once
// UTF-8 helpers of the tokenizers: validation, code points, and Rust's from_utf8_lossy.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace trainyard::utf8 {

// The offset of the first byte that is not part of well-formed UTF-8, or nothing when all is.
std::optional<std::size_t> first_invalid(std::string_view text);

// Throws std::runtime_error "<what>: not valid UTF-8 at byte N" unless `text` is well formed.
void require_valid(std::string_view text, std::string_view what);

// The length of the character starting with lead byte `lead` (of well-formed text).
inline std::size_t char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// The code point at `text[at]` (well-formed text).
char32_t decode_at(std::string_view text, std::size_t at);

void append(std::string& out, char32_t code_point);

// `bytes` with each maximal ill-formed subsequence replaced by U+FFFD, as Rust's
// String::from_utf8_lossy (and Python's bytes.decode(errors="replace")).
std::string lossy(std::string_view bytes);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_white_space(char32_t c);

}  // namespace trainyard::utf8
