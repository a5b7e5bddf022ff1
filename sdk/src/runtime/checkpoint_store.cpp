#include "trainyard/runtime/checkpoint_store.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <future>
#include <iomanip>
#include <mutex>
#include <optional>
#include <sstream>

#include "trainyard/api/error.hpp"
#include "trainyard/support/files.hpp"
#include "trainyard/runtime/crc32.hpp"
#include "trainyard/api/version.hpp"

namespace trainyard {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.toml";
constexpr const char* kPrefix = "step-";
// Room for the largest world size's file list (about 60 bytes a file).
constexpr std::uintmax_t kMaxManifestBytes = 128u << 20;

CheckpointFileInfo describe_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read checkpoint file " + file.string());
  std::uint32_t crc = 0;
  std::vector<char> buffer(1 << 20);
  std::int64_t bytes = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    std::streamsize got = in.gcount();
    if (got <= 0) break;
    crc = update_crc32(crc, buffer.data(), static_cast<std::size_t>(got));
    bytes += got;
  }
  return CheckpointFileInfo{file.filename().string(), bytes, crc};
}

std::string step_folder_name(std::int64_t step) {
  std::ostringstream name;
  name << kPrefix << std::setw(9) << std::setfill('0') << step;
  return name.str();
}

std::string rank_file_stem(int rank) {
  std::ostringstream name;
  name << "rank-" << std::setw(5) << std::setfill('0') << rank;
  return name.str();
}

void write_manifest(const fs::path& file, const CheckpointManifest& manifest) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << manifest_text(manifest);
  out.flush();
  if (!out) throw Error("cannot write " + file.string());
}

std::string staging_name(std::int64_t step) { return "." + step_folder_name(step) + ".partial"; }

constexpr const char* kDiscardedSuffix = ".discarded";

// Removes a committed checkpoint so that no crash can leave it half deleted and still listed:
// it is first renamed out of the listing (atomic), then deleted.
void discard_checkpoint(const fs::path& folder, const fs::path& checkpoint) {
  const fs::path trash = folder / ("." + checkpoint.filename().string() + kDiscardedSuffix);
  remove_tree(trash);
  fs::rename(checkpoint, trash);
  sync_to_disk(folder);
  remove_tree(trash);
}

// Deletes what crashed deletions left behind.
void remove_discarded(const fs::path& folder) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > std::strlen(kDiscardedSuffix) &&
        name.compare(name.size() - std::strlen(kDiscardedSuffix), std::string::npos,
                     kDiscardedSuffix) == 0) {
      remove_tree(it->path());
    }
  }
}

}  // namespace

struct CheckpointStore::Pending {
  std::int64_t step = 0;
  std::shared_ptr<CheckpointState> snapshot;
  std::thread writer;
  std::atomic<bool> written{false};
  std::vector<CheckpointFileInfo> files;
  std::exception_ptr error;
};

namespace {

// Copies `source` into `buffer` (host memory, same shape and dtype, contiguous). Host tensors are
// copied with one memcpy on this thread: LibTorch's copy splits a large tensor over its intra-op
// threads, which on a machine whose cores are busy (training's own threads, other processes) waits
// on the slowest and is many times slower than a single thread's memcpy.
void copy_into(at::Tensor& buffer, const at::Tensor& source) {
  if (source.device().is_cpu() && source.is_contiguous() && !source.is_conj() &&
      !source.is_neg()) {
    if (source.nbytes() > 0) {
      std::memcpy(buffer.data_ptr(), source.const_data_ptr(), source.nbytes());
    }
  } else {
    buffer.copy_(source);
  }
}

}  // namespace

namespace {

// `source` copied into host memory, into `buffers`' tensor of the same name when its shape and
// dtype fit (the previous snapshot's memory, already touched: copying into it costs no page
// faults, which dominate a fresh copy of a large state).
at::Tensor snapshot_tensor(const std::string& name, const at::Tensor& tensor,
                           const StateDict* buffers) {
  at::Tensor source = tensor.detach();
  if (buffers) {
    auto it = buffers->tensors.find(name);
    if (it != buffers->tensors.end() && it->second.sizes().equals(source.sizes()) &&
        it->second.scalar_type() == source.scalar_type() && it->second.is_contiguous()) {
      at::Tensor buffer = it->second;
      copy_into(buffer, source);
      return buffer;
    }
  }
  // A copy even on the host: training goes on changing the original in place. Copies from a
  // GPU land in page-locked memory, which the device writes at full speed, and which the next
  // snapshot reuses.
  at::Tensor buffer = at::empty(
      source.sizes(),
      at::TensorOptions().dtype(source.scalar_type()).pinned_memory(source.is_cuda()));
  copy_into(buffer, source);
  return buffer;
}

// An entry of a state whose copy waits for the background thread.
struct DeferredEntry {
  StateDict* into;  // the snapshot's dict
  const StateDict* buffers;
  std::string name;
  at::Tensor source;
};

// Copies `dict` into `out` at once, except entries in `later`, which are listed in `deferred`.
void snapshot_dict(const StateDict& dict, const StateDict* buffers,
                   const OptimizerSteppedMemory& later, StateDict& out,
                   std::vector<DeferredEntry>& deferred) {
  out.metadata = dict.metadata;
  for (const auto& [name, tensor] : dict.tensors) {
    if (later.holds(tensor)) {
      deferred.push_back({&out, buffers, name, tensor});
    } else {
      out.tensors.emplace(name, snapshot_tensor(name, tensor, buffers));
    }
  }
}

}  // namespace

CheckpointState snapshot_to_host(const CheckpointState& state, CheckpointState* reuse) {
  CheckpointState out;
  std::vector<DeferredEntry> none;
  snapshot_dict(state.shared, reuse ? &reuse->shared : nullptr, {}, out.shared, none);
  snapshot_dict(state.local, reuse ? &reuse->local : nullptr, {}, out.local, none);
  return out;
}

CheckpointStore::CheckpointStore(std::shared_ptr<CheckpointBackend> backend,
                                 std::string backend_name, fs::path folder, int keep,
                                 CheckpointPeers peers)
    : backend_(std::move(backend)),
      backend_name_(std::move(backend_name)),
      folder_(std::move(folder)),
      keep_(keep),
      peers_(std::move(peers)) {
  if (peers_.world_size < 1 || peers_.rank < 0 || peers_.rank >= peers_.world_size) {
    throw Error("checkpoint store: rank " + std::to_string(peers_.rank) + " of " +
                std::to_string(peers_.world_size) + " is not a valid place");
  }
  if (peers_.world_size > 1 && !peers_.all_ok) {
    throw Error("checkpoint store: a multi-process run needs a way for ranks to agree");
  }
}

CheckpointStore::CheckpointStore(CheckpointStore&&) noexcept = default;

CheckpointStore::~CheckpointStore() {
  // An uncommitted background save stays a staging folder: never listed, replaced next time.
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

bool CheckpointStore::agree(bool ok) const { return peers_.all_ok ? peers_.all_ok(ok) : ok; }

void CheckpointStore::prepare_staging(std::int64_t step) {
  bool ok = true;
  std::string problem;
  if (peers_.rank == 0) {
    try {
      fs::create_directories(folder_);
      remove_discarded(folder_);
      const fs::path staging = folder_ / staging_name(step);
      remove_tree(staging);  // left by a save that never committed
      fs::create_directories(staging);
    } catch (const std::exception& error) {
      ok = false;
      problem = error.what();
    }
  }
  // Nobody writes into the folder before it exists.
  if (!agree(ok)) {
    throw Error("checkpoint of step " + std::to_string(step) + " not saved: " +
                (problem.empty() ? "rank 0 could not prepare " + folder_.string() : problem));
  }
}

namespace {

// Counts down the files still reading the state's memory, and calls `released` when none is
// left, whether they wrote every byte or failed part way.
class ReleaseCountdown {
 public:
  ReleaseCountdown(int files, const std::function<void()>& released)
      : left_(files), released_(released) {}
  void one_done() {
    if (left_.fetch_sub(1) == 1 && released_) released_();
  }

 private:
  std::atomic<int> left_;
  const std::function<void()>& released_;
};

// Counts one file down when it leaves scope.
struct CountDownOnExit {
  ReleaseCountdown& countdown;
  ~CountDownOnExit() { countdown.one_done(); }
};

}  // namespace

std::vector<CheckpointFileInfo> CheckpointStore::write_files(
    std::int64_t step, const CheckpointState& state, const std::function<void()>& released) const {
  const fs::path staging = folder_ / staging_name(step);
  ReleaseCountdown countdown(peers_.rank == 0 ? 2 : 1, released);
  auto write_one = [&](const std::string& stem, const StateDict& dict) {
    std::optional<CheckpointFileWriter> out;
    {
      CountDownOnExit done{countdown};
      out.emplace(staging / (stem + backend_->extension()));
      if (released) out->start_writeback_at_finish();
      backend_->write_to(*out, dict);
      out->flush();
    }
    return out->finish();
  };
  if (peers_.rank != 0) return {write_one(rank_file_stem(peers_.rank), state.local)};
  // Rank 0 writes two files: side by side, each with its own fsync.
  auto own = std::async(std::launch::async,
                        [&] { return write_one(rank_file_stem(peers_.rank), state.local); });
  std::vector<CheckpointFileInfo> files;
  std::exception_ptr shared_error;
  try {
    files.push_back(write_one("shared", state.shared));
  } catch (...) {
    shared_error = std::current_exception();
  }
  files.push_back(own.get());  // waits for the other file even when this one failed
  if (shared_error) std::rethrow_exception(shared_error);
  return files;
}

fs::path CheckpointStore::commit(std::int64_t step,
                                 const std::vector<CheckpointFileInfo>& written) {
  const fs::path final_path = folder_ / step_folder_name(step);
  const fs::path staging = folder_ / staging_name(step);
  bool ok = true;
  std::string problem;
  if (peers_.rank == 0) {
    try {
      CheckpointManifest manifest;
      manifest.step = step;
      manifest.backend = backend_name_;
      manifest.framework_version = kFrameworkVersion;
      manifest.world_size = peers_.world_size;
      // This process's files are described as they were written; other ranks' files are read.
      auto describe = [&](const std::string& stem) {
        const std::string name = stem + backend_->extension();
        for (const auto& info : written) {
          if (info.name == name) return info;
        }
        return describe_file(staging / name);
      };
      manifest.files.push_back(describe("shared"));
      for (int rank = 0; rank < peers_.world_size; ++rank) {
        manifest.files.push_back(describe(rank_file_stem(rank)));
      }
      write_manifest(staging / kManifest, manifest);
      sync_to_disk(staging / kManifest);
      sync_to_disk(staging);
      // Re-saving a step replaces the old folder; the rename below is the commit point.
      if (fs::exists(final_path)) {
        discard_checkpoint(folder_, final_path);
        if (fs::exists(final_path)) throw Error("cannot replace checkpoint " + final_path.string());
      }
      fs::rename(staging, final_path);
      sync_to_disk(folder_);
      if (keep_ > 0) {
        auto committed = list();
        while (static_cast<int>(committed.size()) > keep_) {
          discard_checkpoint(folder_, committed.front());
          committed.erase(committed.begin());
        }
      }
    } catch (const std::exception& error) {
      ok = false;
      problem = error.what();
    }
  }
  if (!agree(ok)) {
    throw Error("checkpoint of step " + std::to_string(step) + " not committed: " +
                (problem.empty() ? "rank 0 could not commit it" : problem));
  }
  return final_path;
}

fs::path CheckpointStore::save(std::int64_t step, const CheckpointState& state) {
  commit_pending();
  prepare_staging(step);
  bool ok = true;
  std::string problem;
  std::vector<CheckpointFileInfo> written;
  try {
    written = write_files(step, state);
  } catch (const std::exception& error) {
    ok = false;
    problem = error.what();
  }
  if (!agree(ok)) {
    throw Error("checkpoint of step " + std::to_string(step) + " not saved: " +
                (problem.empty() ? "another rank failed to write its files" : problem));
  }
  return commit(step, written);
}

namespace {

// Whether the file can take `tensor`'s bytes from where they live: one piece of host memory whose
// bytes are its values (no device to copy from, no lazy conjugation or negation to apply).
bool writable_in_place(const at::Tensor& tensor) {
  return tensor.device().is_cpu() && tensor.layout() == at::kStrided && tensor.is_contiguous() &&
         !tensor.is_conj() && !tensor.is_neg();
}

// Opens the optimizer step gate once, from whichever thread gets there first.
class GateRelease {
 public:
  std::shared_future<void> opened() { return promise_.get_future().share(); }
  void operator()() {
    std::call_once(once_, [this] { promise_.set_value(); });
  }

 private:
  std::promise<void> promise_;
  std::once_flag once_;
};

}  // namespace

void CheckpointStore::save_async(std::int64_t step, const CheckpointState& state,
                                 const OptimizerSteppedMemory& copy_later,
                                 OptimizerStepGate* gate) {
  commit_pending();
  auto pending = std::make_unique<Pending>();
  pending->step = step;
  // The previous snapshot's buffers, reused: they stay alive until the copies below are done.
  std::shared_ptr<CheckpointState> buffers = std::move(snapshot_buffers_);
  auto snapshot = std::make_shared<CheckpointState>();
  std::vector<DeferredEntry> deferred;
  const OptimizerSteppedMemory& later = gate ? copy_later : OptimizerSteppedMemory();
  snapshot_dict(state.shared, buffers ? &buffers->shared : nullptr, later, snapshot->shared,
                deferred);
  snapshot_dict(state.local, buffers ? &buffers->local : nullptr, later, snapshot->local, deferred);
  // Deferred entries in host memory are not copied at all: the files take their bytes from the
  // live tensors while the next forward and backward run, and the gate holds the optimizer step
  // until every byte is written. That spares the copy's traffic through memory, which the
  // training steps share. Entries on a device are copied to the host first, as before.
  const bool hold_gate = !deferred.empty();
  auto in_place = std::make_shared<std::vector<DeferredEntry>>();
  auto to_copy = std::make_shared<std::vector<DeferredEntry>>();
  for (DeferredEntry& entry : deferred) {
    if (writable_in_place(entry.source)) {
      entry.into->tensors.emplace(entry.name, entry.source.detach());
      in_place->push_back(std::move(entry));
    } else {
      to_copy->push_back(std::move(entry));
    }
  }
  prepare_staging(step);
  auto release = std::make_shared<GateRelease>();
  if (hold_gate) gate->hold(release->opened());
  Pending* raw = pending.get();
  pending->snapshot = snapshot;
  pending->writer = std::thread([this, raw, snapshot, to_copy, in_place, buffers, release] {
    try {
      for (DeferredEntry& entry : *to_copy) {
        entry.into->tensors.emplace(entry.name,
                                    snapshot_tensor(entry.name, entry.source, entry.buffers));
        entry.source = at::Tensor();
      }
    } catch (...) {
      raw->error = std::current_exception();
    }
    if (in_place->empty() || raw->error) (*release)();
    std::function<void()> released;
    if (!in_place->empty()) released = [&release] { (*release)(); };
    try {
      if (!raw->error) raw->files = write_files(raw->step, *snapshot, released);
    } catch (...) {
      raw->error = std::current_exception();
    }
    (*release)();  // never left holding the optimizer, whatever failed
    // The live tensors are no snapshot's memory: the next save must not copy into them.
    for (const DeferredEntry& entry : *in_place) entry.into->tensors.erase(entry.name);
    raw->written = true;
  });
  pending_ = std::move(pending);
}

bool CheckpointStore::has_pending() const { return pending_ != nullptr; }

bool CheckpointStore::pending_written() const { return pending_ && pending_->written; }

std::optional<fs::path> CheckpointStore::commit_pending() {
  if (!pending_) return std::nullopt;
  std::unique_ptr<Pending> pending = std::move(pending_);
  pending->writer.join();
  snapshot_buffers_ = std::move(pending->snapshot);  // written: reusable by the next snapshot
  std::string problem;
  if (pending->error) {
    try {
      std::rethrow_exception(pending->error);
    } catch (const std::exception& error) {
      problem = error.what();
    }
  }
  if (!agree(problem.empty())) {
    throw Error("checkpoint of step " + std::to_string(pending->step) + " not saved: " +
                (problem.empty() ? "another rank failed to write its files" : problem));
  }
  return commit(pending->step, pending->files);
}

std::string saved_rank_key(int rank, const std::string& key) {
  return rank_file_stem(rank) + "/" + key;
}

CheckpointManifest read_manifest(const fs::path& checkpoint) {
  const fs::path file = checkpoint / kManifest;
  if (!fs::exists(file)) {
    throw Error("checkpoint " + checkpoint.string() + " has no manifest (" + file.string() +
                "): it was never committed");
  }
  // A manifest is a small regular file; anything else in its place (a device such as /dev/zero,
  // a folder, a huge file) is refused before reading.
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    throw Error("corrupt checkpoint manifest " + file.string() + ": not a regular file");
  }
  const std::uintmax_t size = fs::file_size(file, ec);
  if (ec || size > kMaxManifestBytes) {
    throw Error("corrupt checkpoint manifest " + file.string() + ": " +
                (ec ? ec.message()
                    : std::to_string(size) + " bytes, more than a manifest's " +
                          std::to_string(kMaxManifestBytes)));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read checkpoint manifest " + file.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_manifest(text.str(), file.string());
}

std::optional<std::string> check_checkpoint_file(const fs::path& checkpoint,
                                                 const CheckpointFileInfo& expected) {
  const fs::path file = checkpoint / expected.name;
  if (!fs::exists(file)) return "checkpoint file missing: " + file.string();
  CheckpointFileInfo actual = describe_file(file);
  if (actual.bytes != expected.bytes) {
    return "checkpoint file " + file.string() + " has " + std::to_string(actual.bytes) +
           " bytes, the manifest says " + std::to_string(expected.bytes) +
           " (truncated or overwritten)";
  }
  if (actual.crc32 != expected.crc32) {
    return "checkpoint file " + file.string() + " fails its checksum (corrupt)";
  }
  return std::nullopt;
}

void verify_checkpoint(const fs::path& checkpoint, const CheckpointManifest& manifest) {
  for (const auto& expected : manifest.files) {
    if (auto problem = check_checkpoint_file(checkpoint, expected)) throw Error(*problem);
  }
}

CheckpointState CheckpointStore::load(const fs::path& checkpoint, bool every_rank) const {
  CheckpointManifest manifest = read_manifest(checkpoint);
  if (manifest.backend != backend_name_) {
    throw Error("checkpoint " + checkpoint.string() + " was written by the '" + manifest.backend +
                "' backend, this run uses '" + backend_name_ + "'");
  }
  verify_checkpoint(checkpoint, manifest);
  CheckpointState state;
  state.shared = backend_->read(checkpoint / ("shared" + backend_->extension()));
  if (manifest.world_size == peers_.world_size) {
    state.local =
        backend_->read(checkpoint / (rank_file_stem(peers_.rank) + backend_->extension()));
    if (!every_rank) return state;
  } else {
    // Written by another number of ranks: every rank's own entries, for the caller to reshard.
    state.shared.metadata[kSavedWorldSizeKey] = std::to_string(manifest.world_size);
  }
  for (int rank = 0; rank < manifest.world_size; ++rank) {
    StateDict local = backend_->read(checkpoint / (rank_file_stem(rank) + backend_->extension()));
    for (auto& [name, tensor] : local.tensors) {
      state.local.tensors.emplace(saved_rank_key(rank, name), std::move(tensor));
    }
    for (auto& [name, text] : local.metadata) {
      state.local.metadata.emplace(saved_rank_key(rank, name), std::move(text));
    }
  }
  return state;
}

std::vector<fs::path> CheckpointStore::list() const {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(folder_, ec)) return out;
  for (const auto& item : fs::directory_iterator(folder_, ec)) {
    std::string name = item.path().filename().string();
    if (item.is_directory() && name.rfind(kPrefix, 0) == 0) out.push_back(item.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<fs::path> CheckpointStore::latest_valid(
    const std::function<void(const std::string&)>& warn) const {
  auto committed = list();
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    try {
      verify_checkpoint(*it, read_manifest(*it));
      return *it;
    } catch (const Error& error) {
      if (warn) warn(std::string("skipping checkpoint: ") + error.what());
    }
  }
  return std::nullopt;
}

}  // namespace trainyard
