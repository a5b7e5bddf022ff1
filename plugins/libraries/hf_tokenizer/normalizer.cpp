#include "normalizer.hpp"

#include <stdexcept>

namespace trainyard {

void replace_all(std::string_view text, std::string_view from, std::string_view to,
                 std::string& out) {
  out.clear();
  out.reserve(text.size() + text.size() / 4);
  std::size_t at = 0;
  while (true) {
    const std::size_t found = text.find(from, at);
    if (found == std::string_view::npos) break;
    out.append(text.substr(at, found - at)).append(to);
    at = found + from.size();
  }
  out.append(text.substr(at));
}

void PrependNormalizer::normalize(std::string_view text, std::string& out) const {
  out.clear();
  if (!text.empty()) out.append(prefix_);
  out.append(text);
}

ReplaceNormalizer::ReplaceNormalizer(std::string literal, std::string content)
    : literal_(std::move(literal)), content_(std::move(content)) {
  if (literal_.empty()) throw std::runtime_error("Replace: the pattern is empty");
}

ReplaceNormalizer::ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string content)
    : regex_(std::move(regex)), content_(std::move(content)) {}

void ReplaceNormalizer::normalize(std::string_view text, std::string& out) const {
  if (!regex_) {
    replace_all(text, literal_, content_, out);
    return;
  }
  out.clear();
  RegexScratch scratch;
  std::size_t at = 0;
  regex_->for_each_match(text, scratch, [&](std::size_t begin, std::size_t end) {
    out.append(text.substr(at, begin - at)).append(content_);
    at = end;
  });
  out.append(text.substr(at));
}

void SequenceNormalizer::normalize(std::string_view text, std::string& out) const {
  std::string current(text), next;
  for (const auto& step : steps_) {
    step->normalize(current, next);
    current.swap(next);
  }
  out = std::move(current);
}

}  // namespace trainyard
