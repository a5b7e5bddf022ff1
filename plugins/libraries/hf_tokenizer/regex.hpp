#pragma once
// A regular expression written for Oniguruma (what Hugging Face tokenizers compiles its
// patterns with), run by PCRE2 in UTF and UCP mode with its JIT: \s, \S, \v and \uHHHH are
// rewritten to Oniguruma's meaning (\s is exactly the White_Space property), ^ and $ match at
// every \n as in Ruby syntax, and the escapes whose meaning PCRE2 cannot take over are refused.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "function_ref.hpp"

namespace trainyard {

// The per-thread state of matching: PCRE2 match data and a JIT stack. One per encoding call.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class Regex;
  struct State;
  std::unique_ptr<State> state_;
};

class Regex {
 public:
  // Throws std::runtime_error naming the pattern and PCRE2's message when it does not compile,
  // or the escape when it matches otherwise in PCRE2 (\w \W \b \B: Oniguruma's word characters
  // differ; \h \H: a hex digit there; \V \Q \E) or \S sits inside a class.
  explicit Regex(std::string_view oniguruma_pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls `on_match(begin, end)` for each match, left to right, as Oniguruma's find_iter:
  // an empty match right after the previous match is skipped. `text` must be valid UTF-8.
  void for_each_match(std::string_view text, RegexScratch& scratch,
                      FunctionRef<void(std::size_t, std::size_t)> on_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace trainyard
