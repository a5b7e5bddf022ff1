#pragma once
// A checkpoint's manifest.toml: the step, the backend, the framework version, the number of
// ranks and every file's size and CRC-32. Written last when a checkpoint is committed, and read
// before anything else when one is loaded, so its reader trusts nothing in it.

#include <cstdint>
#include <string>
#include <vector>

#include "trainyard/api/checkpoint_file.hpp"

namespace trainyard {

struct CheckpointManifest {
  std::int64_t step = 0;
  std::string backend;
  std::string framework_version;
  int world_size = 1;
  std::vector<CheckpointFileInfo> files;
};

// The largest world size a manifest may record (the device mesh's bound on a dimension).
inline constexpr std::int64_t kMaxManifestWorldSize = 1 << 20;

// The manifest's TOML text.
std::string manifest_text(const CheckpointManifest& manifest);

// Parses manifest text; `name` stands for the file in errors. Throws Error "corrupt checkpoint
// manifest <name>: <reason>" unless it is format 1 with a step >= 0, a world size in
// [1, kMaxManifestWorldSize], and files each named by a plain file name (no folder, not . or ..)
// with a size >= 0 and a CRC-32 in [0, 2^32).
CheckpointManifest parse_manifest(const std::string& text, const std::string& name);

}  // namespace trainyard
