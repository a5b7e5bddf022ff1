#include "shard_index.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "member_name.hpp"
#include "tar_reader.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

bool is_image(const std::string& extension) {
  return extension == "jpg" || extension == "jpeg" || extension == "png";
}

bool is_label(const std::string& extension) { return extension == "cls" || extension == "json"; }

std::string shown(const std::vector<std::uint8_t>& bytes) {
  std::string text(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(
                                                      std::min<std::size_t>(bytes.size(), 40)));
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return "'" + text + (bytes.size() > 40 ? "...'" : "'");
}

// A .cls member: a decimal integer, white space around it allowed.
std::int64_t parse_cls(const std::vector<std::uint8_t>& bytes, const std::string& member) {
  const auto* begin = reinterpret_cast<const char*>(bytes.data());
  const auto* end = begin + bytes.size();
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (begin != end && space(*begin)) ++begin;
  while (end != begin && space(end[-1])) --end;
  std::int64_t value = 0;
  const auto [stop, error] = std::from_chars(begin, end, value);
  if (begin == end || error != std::errc() || stop != end) {
    throw Error(member + " holds " + shown(bytes) + ", not a decimal class index");
  }
  return value;
}

// A .json member: an object whose "label" is an integer.
std::int64_t parse_json(const std::vector<std::uint8_t>& bytes, const std::string& member) {
  const nlohmann::json json = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) throw Error(member + " is not a JSON object");
  const auto label = json.find("label");
  if (label == json.end() || !label->is_number_integer()) {
    throw Error(member + " has no integer \"label\"");
  }
  if (label->is_number_unsigned() && label->get<std::uint64_t>() > INT64_MAX) {
    throw Error(member + " has a \"label\" beyond 64 bits");
  }
  return label->get<std::int64_t>();
}

// A label member of one kind (.cls or .json) as the scan found it.
struct FoundLabel {
  bool present = false;
  std::int64_t value = 0;
  std::string problem;  // why it does not parse, if it does not
};

// One key's members as the scan finds them.
struct Group {
  std::string key;
  std::string image;
  std::int64_t member = -1;
  FoundLabel cls;
  FoundLabel json;
  std::string problem;  // the first thing wrong with it, if any

  void note(std::string why) {
    if (problem.empty()) problem = std::move(why);
  }
  // A .cls member when there is one (WebDataset's class label); else the .json's "label".
  const FoundLabel& label() const { return cls.present ? cls : json; }
};

// The members of one shard grouped by key, in the order the keys first appear.
class ShardScan {
 public:
  explicit ShardScan(TarReader& tar) : tar_(tar) {}

  void run() {
    while (tar_.next()) {
      if (!tar_.regular()) continue;
      const MemberName name = split_member_name(tar_.name());
      if (is_image(name.extension)) {
        Group& group = find(name.key);
        if (group.member >= 0) {
          group.note("two image members, '" + group.image + "' and '" + tar_.name() + "'");
        }
        group.image = tar_.name();
        group.member = tar_.member();
      } else if (is_label(name.extension)) {
        add_label(find(name.key), name.extension);
      }
    }
  }

  // After damage: marks the sample whose member was being read (its bytes may be cut short) with
  // `error`'s reason. False when no sample's member was being read.
  bool cut_off(const std::string& error) {
    if (tar_.member() < 0) return false;
    const auto it = by_key_.find(split_member_name(tar_.name()).key);
    if (it == by_key_.end()) return false;
    Group& group = groups_[it->second];
    const std::string prefix = tar_.path().string() + ": " + group.key + ": ";
    group.note(error.starts_with(prefix) ? error.substr(prefix.size()) : error);
    return true;
  }

  std::vector<Group>& groups() { return groups_; }

 private:
  Group& find(const std::string& key) {
    auto [it, added] = by_key_.try_emplace(key, groups_.size());
    if (added) {
      Group group;
      group.key = key;
      groups_.push_back(std::move(group));
    }
    return groups_[it->second];
  }

  void add_label(Group& group, const std::string& extension) {
    FoundLabel& found = extension == "cls" ? group.cls : group.json;
    if (found.present) {
      group.note("two ." + extension + " members, the second '" + tar_.name() + "'");
      return;
    }
    found.present = true;
    // A .json beside a .cls is the sample's metadata, not its label: left unread.
    if (extension == "json" && group.cls.present) return;
    const std::string member = tar_.name();
    const std::vector<std::uint8_t> bytes = tar_.read();
    try {
      found.value = extension == "cls" ? parse_cls(bytes, member) : parse_json(bytes, member);
    } catch (const Error& error) {
      found.problem = error.what();
    }
  }

  TarReader& tar_;
  std::unordered_map<std::string, std::size_t> by_key_;
  std::vector<Group> groups_;
};

// Why a complete scan's group is not a sample; empty when it is one.
std::string fault(const Group& group, std::int64_t classes) {
  if (!group.problem.empty()) return group.problem;
  if (group.member < 0) return "no image member (.jpg, .jpeg or .png)";
  const FoundLabel& label = group.label();
  if (!label.present) return "no label member (.cls or .json)";
  if (!label.problem.empty()) return label.problem;
  if (label.value < 0 || label.value >= classes) {
    return "label " + std::to_string(label.value) + " is outside [0, " + std::to_string(classes) +
           ") (dataset.classes = " + std::to_string(classes) + ")";
  }
  return {};
}

// One shard's samples; what is wrong goes to `skipped` (skip_bad) or is thrown.
IndexedShard index_shard(const std::filesystem::path& path, std::int64_t classes, bool skip_bad,
                         std::vector<std::string>& skipped) {
  IndexedShard shard{path, {}};
  std::unique_ptr<TarReader> tar;
  try {
    tar = std::make_unique<TarReader>(path);
  } catch (const Error& error) {
    if (!skip_bad) throw;
    skipped.push_back(error.what());
    return shard;
  }
  ShardScan scan(*tar);
  try {
    scan.run();
  } catch (const Error& error) {
    // The samples before the damage stay: they read as well as any other shard's.
    if (!skip_bad) throw;
    if (!scan.cut_off(error.what())) skipped.push_back(error.what());
  }
  for (const Group& group : scan.groups()) {
    const std::string why = fault(group, classes);
    if (why.empty()) {
      shard.samples.push_back({group.key, group.image, group.member, group.label().value});
      continue;
    }
    const std::string message = path.string() + ": " + group.key + ": " + why;
    if (!skip_bad) throw Error(message);
    skipped.push_back(message);
  }
  std::sort(shard.samples.begin(), shard.samples.end(),
            [](const IndexedSample& a, const IndexedSample& b) { return a.member < b.member; });
  return shard;
}

}  // namespace

ShardIndex index_shards(const std::vector<std::filesystem::path>& shards, std::int64_t classes,
                        bool skip_bad) {
  ShardIndex index;
  index.first.push_back(0);
  for (const auto& path : shards) {
    index.shards.push_back(index_shard(path, classes, skip_bad, index.skipped));
    index.first.push_back(index.first.back() +
                          static_cast<std::int64_t>(index.shards.back().samples.size()));
  }
  return index;
}

}  // namespace trainyard
