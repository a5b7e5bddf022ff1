#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.hpp"

#include <pcre2.h>

#include <stdexcept>

namespace trainyard {
namespace {

// Oniguruma's \s: the White_Space property (PCRE2's \s also takes U+180E, which Unicode no
// longer counts as white space; utf8::is_white_space is the same list).
constexpr std::string_view kWhiteSpace =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

[[noreturn]] void refuse(std::string_view pattern, const std::string& why) {
  throw std::runtime_error("regex '" + std::string(pattern) + "': " + why);
}

bool is_hex_digit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// The PCRE2 spelling of Oniguruma's escape `\<letter>` at pattern[at] (the letter), advancing
// `at` past what it reads; refuses the escapes whose meaning PCRE2 cannot take over exactly.
std::string translate_escape(std::string_view pattern, std::size_t& at, bool in_class) {
  const char letter = pattern[at];
  switch (letter) {
    case 's':
      return in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
    case 'S':
      if (in_class) refuse(pattern, "\\S inside a character class is not supported");
      return "[^" + std::string(kWhiteSpace) + "]";
    case 'v':  // a vertical tab in Oniguruma, any vertical space in PCRE2
      return "\\x{0B}";
    case 'u':  // \uHHHH, which PCRE2 spells \x{HHHH}
      if (at + 4 >= pattern.size() || !is_hex_digit(pattern[at + 1]) ||
          !is_hex_digit(pattern[at + 2]) || !is_hex_digit(pattern[at + 3]) ||
          !is_hex_digit(pattern[at + 4]))
        refuse(pattern, "\\u must be followed by four hex digits");
      at += 4;
      return "\\x{" + std::string(pattern.substr(at - 3, 4)) + "}";
    case 'w':
    case 'W':
    case 'b':
    case 'B':
      // Oniguruma's word characters are letters, marks, numbers and connector punctuation,
      // and it treats them differently inside negated classes: PCRE2's differ.
      refuse(pattern, std::string("\\") + letter + " (word characters) is not supported");
    case 'h':
    case 'H':
      refuse(pattern, std::string("\\") + letter + " (Oniguruma's hex digit) is not supported");
    case 'V':
    case 'Q':
    case 'E':
      refuse(pattern, std::string("\\") + letter + " means something else to PCRE2");
    default:
      return std::string("\\") + letter;
  }
}

// Oniguruma's (Ruby syntax) pattern as PCRE2's, or refused where the two would match
// differently.
std::string to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      out += translate_escape(pattern, ++i, in_class);
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[') refuse(pattern, "nested character classes are not supported");
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct RegexScratch::State {
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
};

RegexScratch::RegexScratch() : state_(std::make_unique<State>()) {
  state_->match = pcre2_match_data_create(16, nullptr);
  state_->context = pcre2_match_context_create(nullptr);
  state_->stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  if (!state_->match || !state_->context || !state_->stack) throw std::bad_alloc();
  pcre2_jit_stack_assign(state_->context, nullptr, state_->stack);
}

RegexScratch::~RegexScratch() {
  pcre2_jit_stack_free(state_->stack);
  pcre2_match_context_free(state_->context);
  pcre2_match_data_free(state_->match);
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view oniguruma_pattern)
    : pattern_(oniguruma_pattern), code_(std::make_unique<Code>()) {
  const std::string translated = to_pcre2(oniguruma_pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  // Lines end at \n alone, as in Oniguruma, whatever newline PCRE2 was built to default to.
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  if (!context) throw std::bad_alloc();
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, context);
  pcre2_compile_context_free(context);
  if (!code_->code) refuse(pattern_, pcre2_message(error));
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // the interpreter runs it otherwise
}

Regex::~Regex() = default;

void Regex::for_each_match(std::string_view text, RegexScratch& scratch,
                           FunctionRef<void(std::size_t, std::size_t)> on_match) const {
  auto& state = *scratch.state_;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t from = 0;
  std::size_t last_end = static_cast<std::size_t>(-1);
  while (from <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), from, PCRE2_NO_UTF_CHECK,
                               state.match, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) refuse(pattern_, "matching failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match);
    const std::size_t begin = ovector[0], end = ovector[1];
    if (begin == end && end == last_end) {
      // Oniguruma's find_iter: step over one character and search again.
      if (from >= text.size()) return;
      from += 1;
      while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    on_match(begin, end);
    last_end = end;
    from = end;
  }
}

}  // namespace trainyard
