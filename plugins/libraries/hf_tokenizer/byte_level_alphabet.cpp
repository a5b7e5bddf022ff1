#include "byte_level_alphabet.hpp"

#include "utf8.hpp"

namespace trainyard::byte_level {
namespace {

struct Alphabet {
  std::array<char32_t, 256> chars{};
  std::array<std::int16_t, 324> bytes{};  // by code point; -1 for none
  Alphabet() {
    bytes.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      chars[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      bytes[chars[b]] = static_cast<std::int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

}  // namespace

char32_t char_of(std::uint8_t b) { return alphabet().chars[b]; }

std::optional<std::uint8_t> byte_of(char32_t c) {
  if (c >= alphabet().bytes.size() || alphabet().bytes[c] < 0) return std::nullopt;
  return static_cast<std::uint8_t>(alphabet().bytes[c]);
}

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char b : bytes) utf8::append(out, char_of(static_cast<std::uint8_t>(b)));
  return out;
}

std::optional<std::string> decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (std::size_t at = 0; at < token.size();) {
    const auto b = byte_of(utf8::decode_at(token, at));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    at += utf8::char_length(static_cast<unsigned char>(token[at]));
  }
  return out;
}

}  // namespace trainyard::byte_level
