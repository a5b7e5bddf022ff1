// Fuzzes the checkpoint manifest reader, and checks that a manifest it accepts is written back
// (manifest_text) to one that reads the same.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/checkpoint_manifest.hpp"

namespace {

bool same(const trainyard::CheckpointManifest& a, const trainyard::CheckpointManifest& b) {
  if (a.step != b.step || a.backend != b.backend || a.framework_version != b.framework_version ||
      a.world_size != b.world_size || a.files.size() != b.files.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.files.size(); ++i) {
    if (a.files[i].name != b.files[i].name || a.files[i].bytes != b.files[i].bytes ||
        a.files[i].crc32 != b.files[i].crc32) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  trainyard::CheckpointManifest manifest;
  try {
    manifest = trainyard::parse_manifest(text, "manifest.toml");
  } catch (const trainyard::Error&) {
    return 0;
  }
  if (manifest.step < 0 || manifest.world_size < 1 ||
      manifest.world_size > trainyard::kMaxManifestWorldSize) {
    std::fprintf(stderr, "accepted a manifest with step %lld and world size %d\n",
                 static_cast<long long>(manifest.step), manifest.world_size);
    std::abort();
  }
  for (const auto& file : manifest.files) {
    if (file.bytes < 0 || file.name.empty() || file.name.find('/') != std::string::npos ||
        file.name == "." || file.name == "..") {
      std::fprintf(stderr, "accepted a manifest entry '%s' of %lld bytes\n", file.name.c_str(),
                   static_cast<long long>(file.bytes));
      std::abort();
    }
  }
  const std::string written = trainyard::manifest_text(manifest);
  try {
    if (!same(trainyard::parse_manifest(written, "written.toml"), manifest)) {
      std::fprintf(stderr, "manifest reads back differently:\n%s", written.c_str());
      std::abort();
    }
  } catch (const trainyard::Error& error) {
    std::fprintf(stderr, "written manifest does not read back: %s\n", error.what());
    std::abort();
  }
  return 0;
}
