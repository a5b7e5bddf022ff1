#pragma once
// Checkpoint backends: how a set of named tensors becomes a file and back.

#include <filesystem>
#include <string>

#include "trainyard/component.hpp"
#include "trainyard/state.hpp"

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
  virtual void write(const std::filesystem::path& file, const StateDict& state) const = 0;
  virtual StateDict read(const std::filesystem::path& file) const = 0;
};

}  // namespace trainyard
