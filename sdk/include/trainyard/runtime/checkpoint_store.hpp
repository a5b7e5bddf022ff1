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
#include <thread>
#include <vector>

#include "trainyard/api/checkpoint.hpp"
#include "trainyard/runtime/checkpoint_manifest.hpp"
#include "trainyard/runtime/optimizer_step_gate.hpp"
#include "trainyard/runtime/optimizer_stepped_memory.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

// How the ranks of a job take part in a save. Every rank calls all_ok at the same points of
// every save, in the same order; it returns true on every rank exactly when `ok` was true on
// every rank, and throws (never hangs) when a peer is gone. A single process needs none.
struct CheckpointPeers {
  int rank = 0;
  int world_size = 1;
  std::function<bool(bool ok)> all_ok;
};

// Multi-rank protocol of one save: rank 0 prepares the staging folder; every rank writes its own
// files (rank 0 also the shared one) and syncs them; the ranks agree that every write
// succeeded; rank 0 writes the manifest, renames the folder into place and prunes; the ranks
// agree that the commit happened. One rank's failure fails the save on every rank, and nothing
// uncommitted is ever listed or loaded.
class CheckpointStore {
 public:
  CheckpointStore(std::shared_ptr<CheckpointBackend> backend, std::string backend_name,
                  std::filesystem::path folder, int keep, CheckpointPeers peers = {});
  ~CheckpointStore();
  CheckpointStore(CheckpointStore&&) noexcept;
  CheckpointStore& operator=(CheckpointStore&&) = delete;

  // Writes `state` as checkpoint `step` and returns its folder. Older checkpoints beyond `keep`
  // are removed afterwards. Commits a pending background save first.
  std::filesystem::path save(std::int64_t step, const CheckpointState& state);

  // Writes `state` on a background thread. The caller waits only for the copy into host memory
  // of the entries outside `copy_later`. With a `gate`, the entries stored in `copy_later`
  // (parameters and optimizer state, which only the next optimizer step changes) are left to the
  // background thread, and the gate holds that step until they are no longer read: host tensors
  // are written from their own memory, device tensors copied to the host first. The written bytes
  // are those a synchronous save of `state` writes. The checkpoint is committed by the next
  // commit_pending() (the engine calls it at fixed steps, the same on every rank) or by the next
  // save.
  void save_async(std::int64_t step, const CheckpointState& state,
                  const OptimizerSteppedMemory& copy_later = {}, OptimizerStepGate* gate = nullptr);
  // True when a background save has finished writing and awaits its commit (never blocks).
  bool pending_written() const;
  bool has_pending() const;
  // Waits for the background save, agrees with the other ranks and commits it; returns its
  // folder, or nullopt when nothing was pending. Throws when any rank failed to write.
  std::optional<std::filesystem::path> commit_pending();

  // Reads a checkpoint folder, verifying the manifest, every file's size and checksum, before
  // any state is used. Throws Error naming the file at fault. A checkpoint written by another
  // number of ranks loads for resharding: `local` then holds every saved rank's entries under
  // saved_rank_key(rank, key) (each rank reads all of them) and shared.metadata records the
  // saved world size under kSavedWorldSizeKey; whoever uses the state decides whether it can
  // resume from it. With `every_rank` (a checkpoint written under another parallel layout on the
  // same number of ranks) every saved rank's entries are handed over as well, for strategies that
  // re-slice the placed pieces (placed_state.hpp).
  CheckpointState load(const std::filesystem::path& checkpoint, bool every_rank = false) const;

  // Committed checkpoints in `folder`, oldest first.
  std::vector<std::filesystem::path> list() const;
  // The newest checkpoint that verifies; unreadable ones are reported through `warn`.
  std::optional<std::filesystem::path> latest_valid(
      const std::function<void(const std::string&)>& warn) const;

  const std::filesystem::path& folder() const { return folder_; }

 private:
  struct Pending;
  void prepare_staging(std::int64_t step);
  // This process's files of the checkpoint, written and synced; what the manifest says of them.
  // `released`, when given, is called once no file reads `state`'s memory any more: every byte
  // written (the syncs may still be running) or the writing failed.
  std::vector<CheckpointFileInfo> write_files(std::int64_t step, const CheckpointState& state,
                                              const std::function<void()>& released = {}) const;
  // `written`: this process's files as write_files described them (others are read back).
  std::filesystem::path commit(std::int64_t step, const std::vector<CheckpointFileInfo>& written);
  bool agree(bool ok) const;

  std::shared_ptr<CheckpointBackend> backend_;
  std::string backend_name_;
  std::filesystem::path folder_;
  int keep_;
  CheckpointPeers peers_;
  std::unique_ptr<Pending> pending_;
  std::shared_ptr<CheckpointState> snapshot_buffers_;
};

// The state with every tensor copied to host memory, detached from whatever training does next.
// Tensors of `reuse` with the same name, shape and dtype are overwritten instead of allocating.
CheckpointState snapshot_to_host(const CheckpointState& state, CheckpointState* reuse = nullptr);

// Set in a loaded state's shared metadata when the checkpoint was written by another number of
// ranks: that number.
inline constexpr const char* kSavedWorldSizeKey = "checkpoint.saved_world_size";
// Shared metadata entries "export.<format>/<file>": the model's export_files() (model.hpp), which
// `trainyard checkpoint export` writes beside the weights it exports in that format.
inline constexpr const char* kExportFilePrefix = "export.";
// The key of saved rank `rank`'s local entry `key` in a state loaded for resharding.
std::string saved_rank_key(int rank, const std::string& key);

CheckpointManifest read_manifest(const std::filesystem::path& checkpoint);
// The problem with one file the manifest lists (missing, wrong size, bad checksum), if any.
std::optional<std::string> check_checkpoint_file(const std::filesystem::path& checkpoint,
                                                 const CheckpointFileInfo& expected);
// Checks sizes and checksums of every file the manifest lists; throws Error naming the first bad
// one.
void verify_checkpoint(const std::filesystem::path& checkpoint, const CheckpointManifest& manifest);

}  // namespace trainyard
