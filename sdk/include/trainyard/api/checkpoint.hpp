#pragma once
// Checkpoint backends: how a set of named tensors becomes a file and back.

#include <filesystem>
#include <string>

#include "trainyard/api/checkpoint_file.hpp"
#include "trainyard/api/component.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

// A checkpoint backend plugin writes and reads one file of a checkpoint. The runtime owns the
// rest: temporary names, fsync, atomic rename, the manifest, which ranks write what (one shared
// file plus one file per rank, which is also the layout sharded strategies use), and retention.
// read() must detect a truncated or malformed file and throw Error naming it.
class CheckpointBackend : public Component {
 public:
  static constexpr const char* kKind = "checkpoint";
  // File name extension, with the dot (".pt").
  virtual std::string extension() const = 0;
  // Appends the file's bytes to `out` in order, a tensor's data straight from its memory (no
  // copy into a buffer first); the caller finishes the file.
  virtual void write_to(CheckpointFileWriter& out, const StateDict& state) const = 0;
  virtual StateDict read(const std::filesystem::path& file) const = 0;

  // `state` as `file`, on the disk when this returns.
  void write(const std::filesystem::path& file, const StateDict& state) const {
    CheckpointFileWriter out(file);
    write_to(out, state);
    out.finish();
  }
};

}  // namespace trainyard
