#pragma once
// The samples of a split's tar shards, found once at the start from the members' headers: each
// sample is a key with one image member (.jpg, .jpeg or .png) and a label: its .cls member (a
// decimal class index), or without one its .json member's integer "label" (a .json beside a .cls
// is metadata, left unread). Other members are ignored. Image bytes are skipped, never read here
// (a seek per member on an uncompressed tar); the small label members are read, so that a label
// outside [0, classes) is found before training. Damage inside the images themselves (a header
// that does not read, pixels that do not decode) surfaces when a reader decodes them.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace trainyard {

struct IndexedSample {
  std::string key;
  std::string image;        // the image member's path, checked again when it is read
  std::int64_t member = 0;  // the image member's position among the shard's members
  std::int64_t label = 0;
};

struct IndexedShard {
  std::filesystem::path path;
  std::vector<IndexedSample> samples;  // in the order of their image members
};

struct ShardIndex {
  std::vector<IndexedShard> shards;  // in the order they were listed
  // first[s]: the index (in the split) of shard s's first sample; first.back(): the split's size.
  // A sample's index in the split is its shard's first plus its place in the shard.
  std::vector<std::int64_t> first;
  // What was left out with skip_bad, each "<shard>: <key>: <why>" (or "<shard>: <why>" for a
  // shard that does not open).
  std::vector<std::string> skipped;

  std::int64_t size() const { return first.empty() ? 0 : first.back(); }
};

// Throws Error "<shard>: <key>: <why>" for a sample without its image or label, with two images
// (or two .cls, two .json), with a label that does not parse or lies outside [0, classes), and for
// a shard that does not open or is damaged; with skip_bad such samples (and a damaged shard's
// samples from the damage on, an unopenable shard whole) are left out and listed in `skipped`.
ShardIndex index_shards(const std::vector<std::filesystem::path>& shards, std::int64_t classes,
                        bool skip_bad);

}  // namespace trainyard
