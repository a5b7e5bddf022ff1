#pragma once
// How WebDataset groups a tar's members into samples: a member's key is its path up to the first
// dot of its file name, its extension the rest ("train/n01440764_10026.JPEG": key
// "train/n01440764_10026", extension "jpeg"), lower-cased as WebDataset's default grouping does.
// Members of one key form one sample.

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

namespace trainyard {

struct MemberName {
  std::string key;
  std::string extension;  // empty: the file name has no dot, or starts with one (not a sample's)
};

inline MemberName split_member_name(std::string_view name) {
  const std::size_t slash = name.rfind('/');
  const std::size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const std::size_t dot = name.find('.', base);
  if (dot == std::string_view::npos || dot == base) return {std::string(name), ""};
  MemberName out{std::string(name.substr(0, dot)), std::string(name.substr(dot + 1))};
  std::transform(out.extension.begin(), out.extension.end(), out.extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace trainyard
