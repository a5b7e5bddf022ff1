#include "decoder.hpp"

#include <optional>

#include "byte_level_alphabet.hpp"
#include "normalizer.hpp"
#include "utf8.hpp"

namespace trainyard {
namespace {

// Rust's u8::from_str_radix(text, 16) for the two characters of a <0xNN> token.
std::optional<unsigned char> hex_byte(std::string_view text) {
  std::size_t at = 0;
  if (!text.empty() && text[0] == '+') at = 1;
  if (at == text.size()) return std::nullopt;
  unsigned value = 0;
  for (; at < text.size(); ++at) {
    const char c = text[at];
    unsigned digit = 0;
    if (c >= '0' && c <= '9') {
      digit = static_cast<unsigned>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<unsigned>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      digit = static_cast<unsigned>(c - 'A' + 10);
    } else {
      return std::nullopt;
    }
    value = value * 16 + digit;
  }
  return static_cast<unsigned char>(value);
}

std::vector<char32_t> code_points(std::string_view text) {
  std::vector<char32_t> out;
  for (std::size_t at = 0; at < text.size();
       at += utf8::char_length(static_cast<unsigned char>(text[at])))
    out.push_back(utf8::decode_at(text, at));
  return out;
}

}  // namespace

void ByteLevelDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::string bytes;
  for (const std::string& token : tokens) {
    if (const auto decoded = byte_level::decode(token)) {
      bytes += *decoded;
    } else {
      bytes += token;
    }
  }
  tokens.assign(1, utf8::lossy(bytes));
}

void ReplaceDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::string out;
  for (std::string& token : tokens) {
    if (!regex_) {
      replace_all(token, literal_, content_, out);
    } else {
      out.clear();
      RegexScratch scratch;
      std::size_t at = 0;
      regex_->for_each_match(token, scratch, [&](std::size_t begin, std::size_t end) {
        out.append(token, at, begin - at).append(content_);
        at = end;
      });
      out.append(token, at);
    }
    token.swap(out);
  }
}

void ByteFallbackDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::vector<std::string> out;
  std::string bytes;
  std::size_t byte_tokens = 0;
  const auto flush = [&] {
    if (byte_tokens == 0) return;
    if (!utf8::first_invalid(bytes)) {
      out.push_back(bytes);
    } else {
      for (std::size_t i = 0; i < byte_tokens; ++i) out.emplace_back("\xEF\xBF\xBD");
    }
    bytes.clear();
    byte_tokens = 0;
  };
  for (std::string& token : tokens) {
    std::optional<unsigned char> byte;
    if (token.size() == 6 && token.rfind("<0x", 0) == 0 && token.back() == '>')
      byte = hex_byte(std::string_view(token).substr(3, 2));
    if (byte) {
      bytes.push_back(static_cast<char>(*byte));
      ++byte_tokens;
    } else {
      flush();
      out.push_back(std::move(token));
    }
  }
  flush();
  tokens = std::move(out);
}

void FuseDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::string joined;
  for (const std::string& token : tokens) joined += token;
  tokens.assign(1, std::move(joined));
}

void StripDecoder::decode_chain(std::vector<std::string>& tokens) const {
  for (std::string& token : tokens) {
    const std::vector<char32_t> chars = code_points(token);
    std::size_t start_cut = 0;
    for (std::size_t i = 0; i < start_ && i < chars.size() && chars[i] == content_; ++i)
      start_cut = i + 1;
    std::size_t stop_cut = chars.size();
    for (std::size_t i = 0; i < stop_ && i < chars.size(); ++i) {
      const std::size_t index = chars.size() - i - 1;
      if (chars[index] != content_) break;
      stop_cut = index;
    }
    std::string out;
    for (std::size_t i = start_cut; i < stop_cut; ++i) utf8::append(out, chars[i]);
    token = std::move(out);
  }
}

void MetaspaceDecoder::decode_chain(std::vector<std::string>& tokens) const {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::string out;
    for (const char32_t c : code_points(tokens[i])) {
      if (c != replacement_) {
        utf8::append(out, c);
      } else if (!(i == 0 && prepend_ != PrependScheme::never)) {
        out.push_back(' ');
      }
    }
    tokens[i] = std::move(out);
  }
}

void SequenceDecoder::decode_chain(std::vector<std::string>& tokens) const {
  for (const auto& step : steps_) step->decode_chain(tokens);
}

}  // namespace trainyard
