#include "trainyard/runtime/plugin_loader.hpp"

#include <boost/dll/shared_library.hpp>
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>

#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {

namespace fs = std::filesystem;

namespace {

bool is_shared_library(const fs::path& path) {
  std::string name = path.filename().string();
  return path.extension() == ".so" || name.find(".so.") != std::string::npos;
}

}  // namespace

bool PluginLoader::is_loaded(const fs::path& path) const {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(path, ec);
  return std::any_of(loaded_.begin(), loaded_.end(),
                     [&](const LoadedPlugin& plugin) { return plugin.path == canonical; });
}

void PluginLoader::load_library(const fs::path& requested) {
  if (!requested.is_absolute()) {
    throw Error("plugin path must be absolute: " + requested.string());
  }
  std::error_code ec;
  fs::path path = fs::weakly_canonical(requested, ec);
  if (ec || !fs::is_regular_file(path)) throw Error("plugin library not found: " + requested.string());
  if (is_loaded(path)) return;

  auto library = std::make_shared<boost::dll::shared_library>();
  boost::dll::fs::error_code load_error;
  // RTLD_LOCAL keeps plugins from resolving each other's symbols; RTLD_NOW reports missing
  // symbols here rather than in the middle of a run.
  library->load(boost::dll::fs::path(path.string()),
                boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now, load_error);
  if (load_error) {
    // Boost keeps only an error code; the loader's own words (a missing symbol, a wrong ELF
    // class) come from a second, plain dlopen.
    std::string detail = load_error.message();
    if (void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      ::dlclose(handle);
    } else if (const char* message = ::dlerror()) {
      detail = message;
    }
    throw Error("failed to load plugin " + path.string() + ": " + detail);
  }
  if (!library->has(kPluginEntryPoint)) {
    throw Error("not a trainyard plugin: " + path.string() + " has no entry point '" +
                kPluginEntryPoint + "' (define one with TRAINYARD_PLUGIN)");
  }
  const PluginDescriptor* descriptor = nullptr;
  try {
    auto& entry = library->get_alias<PluginEntryPoint>(kPluginEntryPoint);
    descriptor = entry();
  } catch (const std::exception& error) {
    throw Error("failed to load plugin " + path.string() + ": " + error.what());
  }
  if (!descriptor) throw Error("plugin " + path.string() + " returned no descriptor");
  if (descriptor->abi_version != kAbiVersion) {
    throw Error("wrong ABI version on plugin " + path.string() + ": it has version " +
                std::to_string(descriptor->abi_version) + ", this host supports version " +
                std::to_string(kAbiVersion));
  }
  std::string tag = descriptor->build_tag ? descriptor->build_tag : "";
  if (tag != kBuildTag) {
    throw Error("plugin " + path.string() + " was built for " + (tag.empty() ? "?" : tag) +
                ", this host is built for " + kBuildTag);
  }
  std::string name = descriptor->name ? descriptor->name : "";
  std::string version = descriptor->version ? descriptor->version : "";
  if (name.empty() || !descriptor->register_components) {
    throw Error("plugin " + path.string() + " has an incomplete descriptor");
  }

  // Registrations are staged: a callback that throws half-way leaves nothing registered.
  registry_.begin_library(library, path.string(), name, version);
  try {
    descriptor->register_components(registry_);
  } catch (const Error& error) {
    registry_.abandon_library();
    throw Error(std::string(error.what()));
  } catch (const std::exception& error) {
    registry_.abandon_library();
    throw Error("plugin " + path.string() + " failed to register: " + error.what());
  } catch (...) {
    registry_.abandon_library();
    throw Error("plugin " + path.string() + " failed to register with an unknown exception");
  }
  registry_.end_library();
  loaded_.push_back({path, name, version});
}

std::vector<fs::path> plugin_libraries(const fs::path& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) throw Error("plugin folder not found: " + folder.string());
  std::vector<fs::path> libraries;
  for (const auto& item : fs::directory_iterator(folder, ec)) {
    if (item.is_regular_file() && is_shared_library(item.path())) {
      libraries.push_back(fs::absolute(item.path()));
    }
  }
  if (ec) throw Error("cannot read plugin folder " + folder.string() + ": " + ec.message());
  std::sort(libraries.begin(), libraries.end());
  return libraries;
}

void PluginLoader::load_folder(const fs::path& folder) {
  registry_.note_searched(fs::absolute(folder).string());
  for (const auto& library : plugin_libraries(folder)) load_library(library);
}

void PluginLoader::load_path(const fs::path& path) {
  fs::path absolute = fs::absolute(path);
  std::error_code ec;
  if (fs::is_directory(absolute, ec)) {
    load_folder(absolute);
  } else if (fs::exists(absolute, ec)) {
    registry_.note_searched(absolute.string());
    load_library(absolute);
  } else {
    throw Error("plugin path not found: " + path.string());
  }
}

fs::path bundled_plugin_folder(const fs::path& executable) {
  return executable.parent_path().parent_path() / "lib" / "trainyard" / "plugins";
}

std::vector<fs::path> split_search_path(const std::string& list) {
  std::vector<fs::path> out;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ':')) {
    if (!item.empty()) out.push_back(fs::absolute(item));
  }
  return out;
}

}  // namespace trainyard
