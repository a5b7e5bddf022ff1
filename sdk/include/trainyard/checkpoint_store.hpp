#pragma once
// Where checkpoints live and how they are committed: one folder per checkpoint, written under a
// temporary name, every file fsynced, a manifest with sizes and checksums written last, then the
// folder renamed into place. A checkpoint therefore exists whole or not at all.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/checkpoint.hpp"
#include "trainyard/state.hpp"

namespace trainyard {

struct CheckpointFileInfo {
  std::string name;
  std::int64_t bytes = 0;
  std::uint32_t crc32 = 0;
};

struct CheckpointManifest {
  std::int64_t step = 0;
  std::string backend;
  std::string framework_version;
  int world_size = 1;
  std::vector<CheckpointFileInfo> files;
};

class CheckpointStore {
 public:
  CheckpointStore(std::shared_ptr<CheckpointBackend> backend, std::string backend_name,
                  std::filesystem::path folder, int keep, int rank = 0, int world_size = 1);

  // Writes `state` as checkpoint `step` and returns its folder. Older checkpoints beyond `keep`
  // are removed afterwards.
  std::filesystem::path save(std::int64_t step, const CheckpointState& state);

  // Reads a checkpoint folder, verifying the manifest, every file's size and checksum, before
  // any state is used. Throws Error naming the file at fault.
  CheckpointState load(const std::filesystem::path& checkpoint) const;

  // Committed checkpoints in `folder`, oldest first.
  std::vector<std::filesystem::path> list() const;
  // The newest checkpoint that verifies; unreadable ones are reported through `warn`.
  std::optional<std::filesystem::path> latest_valid(
      const std::function<void(const std::string&)>& warn) const;

  const std::filesystem::path& folder() const { return folder_; }

 private:
  std::shared_ptr<CheckpointBackend> backend_;
  std::string backend_name_;
  std::filesystem::path folder_;
  int keep_;
  int rank_;
  int world_size_;
};

CheckpointManifest read_manifest(const std::filesystem::path& checkpoint);
// The problem with one file the manifest lists (missing, wrong size, bad checksum), if any.
std::optional<std::string> check_checkpoint_file(const std::filesystem::path& checkpoint,
                                                 const CheckpointFileInfo& expected);
// Checks sizes and checksums of every file the manifest lists; throws Error naming the first bad
// one.
void verify_checkpoint(const std::filesystem::path& checkpoint, const CheckpointManifest& manifest);

}  // namespace trainyard
