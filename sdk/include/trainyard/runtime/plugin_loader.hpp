#pragma once
// Finds plugin libraries in explicit folders and loads them into a registry.

#include <filesystem>
#include <string>
#include <vector>

#include "trainyard/api/registry.hpp"

namespace trainyard {

struct LoadedPlugin {
  std::filesystem::path path;
  std::string name;
  std::string version;
};

// Loads plugin libraries by absolute path only, so nothing is ever picked up from the current
// directory. Before calling into a library it checks the entry point, the ABI version and the
// build tag; each failure is an Error naming the file (and both versions where they differ).
class PluginLoader {
 public:
  explicit PluginLoader(Registry& registry) : registry_(registry) {}

  void load_library(const std::filesystem::path& path);
  // Loads every shared library in `folder` (sorted by name, not recursive).
  void load_folder(const std::filesystem::path& folder);
  // A folder is loaded as a folder, a file as a library; missing paths are errors.
  void load_path(const std::filesystem::path& path);
  bool is_loaded(const std::filesystem::path& path) const;
  const std::vector<LoadedPlugin>& loaded() const { return loaded_; }

 private:
  Registry& registry_;
  std::vector<LoadedPlugin> loaded_;
};

// The folder of plugins that ships with the binary at `executable`: <prefix>/lib/trainyard/plugins
// for <prefix>/bin/trainyard (the build tree has the same layout).
std::filesystem::path bundled_plugin_folder(const std::filesystem::path& executable);

// The shared libraries directly in `folder`, sorted by name; throws Error when it is unreadable.
std::vector<std::filesystem::path> plugin_libraries(const std::filesystem::path& folder);

// Entries of a colon-separated list such as TRAINYARD_PLUGIN_PATH, made absolute.
std::vector<std::filesystem::path> split_search_path(const std::string& list);

}  // namespace trainyard
