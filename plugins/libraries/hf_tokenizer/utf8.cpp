#include "utf8.hpp"

#include <stdexcept>

namespace trainyard::utf8 {
namespace {

// The length of the well-formed character at `text[at]`, or 0 when the bytes there are not
// one. `valid_prefix` receives how many bytes form a valid prefix of some character.
std::size_t well_formed_length(std::string_view text, std::size_t at, std::size_t& valid_prefix) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  valid_prefix = 0;
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  valid_prefix = 1;
  for (std::size_t i = 1; i < length; ++i) {
    if (at + i >= text.size()) return 0;
    const unsigned char next = byte(at + i);
    const unsigned char lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
    if (next < lo || next > hi) return 0;
    ++valid_prefix;
  }
  return length;
}

}  // namespace

std::optional<std::size_t> first_invalid(std::string_view text) {
  std::size_t at = 0;
  const std::size_t size = text.size();
  while (at < size) {
    // Eight ASCII bytes at a time.
    while (at + 8 <= size) {
      std::uint64_t word = 0;
      for (std::size_t i = 0; i < 8; ++i)
        word |= static_cast<std::uint64_t>(static_cast<unsigned char>(text[at + i])) << (8 * i);
      if (word & 0x8080808080808080ULL) break;
      at += 8;
    }
    if (at >= size) break;
    std::size_t prefix = 0;
    const std::size_t length = well_formed_length(text, at, prefix);
    if (length == 0) return at;
    at += length;
  }
  return std::nullopt;
}

void require_valid(std::string_view text, std::string_view what) {
  if (const auto bad = first_invalid(text)) {
    throw std::runtime_error(std::string(what) + ": not valid UTF-8 at byte " +
                             std::to_string(*bad));
  }
}

char32_t decode_at(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(text[at + i]));
  };
  const char32_t lead = byte(0);
  if (lead < 0x80) return lead;
  if (lead < 0xE0) return ((lead & 0x1F) << 6) | (byte(1) & 0x3F);
  if (lead < 0xF0) return ((lead & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
  return ((lead & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) |
         (byte(3) & 0x3F);
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t at = 0;
  while (at < bytes.size()) {
    std::size_t prefix = 0;
    const std::size_t length = well_formed_length(bytes, at, prefix);
    if (length > 0) {
      out.append(bytes.substr(at, length));
      at += length;
    } else {
      out.append("\xEF\xBF\xBD");  // one U+FFFD per maximal ill-formed subpart
      at += prefix > 0 ? prefix : 1;
    }
  }
  return out;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace trainyard::utf8
