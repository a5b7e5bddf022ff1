#include "shard_pattern.hpp"

#include <algorithm>
#include <cctype>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

constexpr std::size_t kMaxShards = 1000000;

bool all_digits(const std::string& text) {
  return !text.empty() && text.size() <= 18 &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

std::string padded(long long value, std::size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// The alternatives one brace group stands for.
std::vector<std::string> alternatives(const std::string& group, const std::string& pattern) {
  const std::size_t dots = group.find("..");
  if (dots == std::string::npos) {
    std::vector<std::string> out;
    std::size_t from = 0;
    while (true) {
      const std::size_t comma = group.find(',', from);
      out.push_back(group.substr(from, comma - from));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
    if (out.size() < 2) {
      throw Error("shard pattern '" + pattern + "': {" + group +
                  "} is neither a range {A..B} nor a list {x,y}");
    }
    return out;
  }
  const std::string first = group.substr(0, dots);
  const std::string last = group.substr(dots + 2);
  if (!all_digits(first) || !all_digits(last)) {
    throw Error("shard pattern '" + pattern + "': the range {" + group +
                "} needs two decimal numbers");
  }
  const bool zero_padded =
      (first.size() > 1 && first[0] == '0') || (last.size() > 1 && last[0] == '0');
  const std::size_t width = zero_padded ? std::max(first.size(), last.size()) : 0;
  const long long a = std::stoll(first);
  const long long b = std::stoll(last);
  const long long step = a <= b ? 1 : -1;
  if ((b - a) * step >= static_cast<long long>(kMaxShards)) {
    throw Error("shard pattern '" + pattern + "': the range {" + group + "} names over " +
                std::to_string(kMaxShards) + " shards");
  }
  std::vector<std::string> out;
  for (long long value = a;; value += step) {
    out.push_back(padded(value, width));
    if (value == b) break;
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_shard_pattern(const std::string& pattern) {
  std::vector<std::string> names = {""};
  std::size_t from = 0;
  while (from <= pattern.size()) {
    const std::size_t open = pattern.find('{', from);
    const std::string literal = pattern.substr(from, open - from);
    for (auto& name : names) name += literal;
    if (open == std::string::npos) break;
    const std::size_t close = pattern.find('}', open);
    if (close == std::string::npos) {
      throw Error("shard pattern '" + pattern + "': '{' at character " + std::to_string(open + 1) +
                  " is never closed");
    }
    const std::vector<std::string> choices =
        alternatives(pattern.substr(open + 1, close - open - 1), pattern);
    if (names.size() * choices.size() > kMaxShards) {
      throw Error("shard pattern '" + pattern + "' names over " + std::to_string(kMaxShards) +
                  " shards");
    }
    std::vector<std::string> expanded;
    expanded.reserve(names.size() * choices.size());
    for (const auto& name : names) {
      for (const auto& choice : choices) expanded.push_back(name + choice);
    }
    names = std::move(expanded);
    from = close + 1;
  }
  return names;
}

}  // namespace trainyard
