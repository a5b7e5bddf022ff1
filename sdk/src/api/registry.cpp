#include "trainyard/api/registry.hpp"

#include <algorithm>
#include <exception>

#include "trainyard/api/error.hpp"

namespace trainyard {

Component::~Component() = default;

Registry::Registry() = default;
// Entries hold the libraries; dropping them releases every library not kept alive by an object.
// A factory's code (and whatever its options allocated) lives in its library, so every entry is
// destroyed first and the library references are dropped last.
Registry::~Registry() {
  std::vector<std::shared_ptr<void>> libraries;
  libraries.reserve(entries_.size());
  for (auto& [key, entry] : entries_) libraries.push_back(std::move(entry.library));
  entries_.clear();
  loading_.reset();
}

void Registry::begin_library(std::shared_ptr<void> keep_alive, std::string path,
                             std::string plugin, std::string version) {
  loading_ = std::make_unique<Loading>(
      Loading{std::move(keep_alive), std::move(path), std::move(plugin), std::move(version), {}});
}

void Registry::end_library() {
  if (!loading_) return;
  for (auto& [key, entry] : loading_->staged) entries_.emplace(key, std::move(entry));
  loading_.reset();
}

void Registry::abandon_library() { loading_.reset(); }

std::shared_ptr<void> hold_library(std::shared_ptr<void> object, std::shared_ptr<void> library) {
  void* raw = object.get();
  return std::shared_ptr<void>(raw, [object = std::move(object),
                                     library = std::move(library)](void*) mutable {
    object.reset();
    library.reset();
  });
}

void Registry::add_factory(std::string kind, std::string name, OptionSpecs options,
                           std::string help, ComponentFactory factory) {
  auto key = std::make_pair(kind, name);
  std::string library = loading_ ? loading_->path : std::string();
  const Entry* existing = nullptr;
  if (auto it = entries_.find(key); it != entries_.end()) existing = &it->second;
  if (loading_) {
    if (auto it = loading_->staged.find(key); it != loading_->staged.end()) existing = &it->second;
  }
  if (existing) {
    auto describe = [](const std::string& path) {
      return path.empty() ? std::string("the host") : path;
    };
    throw Error("duplicate " + kind + " plugin '" + name + "': registered by " +
                describe(existing->info.library_path) + " and again by " + describe(library));
  }
  Entry entry;
  entry.info.kind = std::move(kind);
  entry.info.name = std::move(name);
  entry.info.help = std::move(help);
  entry.info.options = std::move(options);
  if (loading_) {
    entry.info.plugin = loading_->plugin;
    entry.info.plugin_version = loading_->version;
    entry.info.library_path = loading_->path;
    entry.library = loading_->keep_alive;
  }
  entry.factory = std::move(factory);
  auto& destination = loading_ ? loading_->staged : entries_;
  destination.emplace(std::move(key), std::move(entry));
}

const Registry::Entry& Registry::entry(const std::string& kind, const std::string& name) const {
  auto it = entries_.find({kind, name});
  if (it != entries_.end()) return it->second;
  std::string known;
  for (const auto& candidate : names(kind)) known += (known.empty() ? "" : ", ") + candidate;
  std::string places;
  for (const auto& place : searched_) places += (places.empty() ? "" : ", ") + place;
  throw Error("unknown " + kind + " plugin '" + name + "' (known: " +
              (known.empty() ? "none loaded" : known) +
              "; searched: " + (places.empty() ? "no plugin folder" : places) +
              "); load its library with --plugin-path FOLDER_OR_FILE, TRAINYARD_PLUGIN_PATH or "
              "the recipe's plugin_paths");
}

void Registry::note_searched(std::string place) {
  if (std::find(searched_.begin(), searched_.end(), place) == searched_.end()) {
    searched_.push_back(std::move(place));
  }
}

bool Registry::contains(const std::string& kind, const std::string& name) const {
  return entries_.count({kind, name}) != 0;
}

const ComponentInfo& Registry::info(const std::string& kind, const std::string& name) const {
  return entry(kind, name).info;
}

std::vector<ComponentInfo> Registry::list(const std::string& kind) const {
  std::vector<ComponentInfo> out;
  for (const auto& [key, value] : entries_) {
    if (kind.empty() || key.first == kind) out.push_back(value.info);
  }
  return out;
}

std::vector<std::string> Registry::names(const std::string& kind) const {
  std::vector<std::string> out;
  for (const auto& [key, value] : entries_) {
    if (key.first == kind) out.push_back(key.second);
  }
  return out;
}

Config Registry::resolve(const std::string& kind, const std::string& name,
                         const Config& section) const {
  return validate_section(section, entry(kind, name).info.options);
}

std::shared_ptr<Component> Registry::create_component(const std::string& kind,
                                                      const std::string& name,
                                                      const Config& section,
                                                      const BuildContext& context) const {
  const Entry& found = entry(kind, name);
  Config options = validate_section(section, found.info.options);
  std::unique_ptr<Component> object;
  std::string origin = found.info.library_path.empty()
                           ? std::string()
                           : " (" + found.info.library_path + ")";
  try {
    object = found.factory(options, context);
  } catch (const Error& error) {
    // Errors meant for the user keep their message; the copy is made while the library is
    // still loaded, so nothing refers back into it afterwards.
    throw Error(std::string(error.what()));
  } catch (const std::exception& error) {
    throw Error(kind + " plugin '" + name + "'" + origin + " failed: " + error.what());
  } catch (...) {
    throw Error(kind + " plugin '" + name + "'" + origin + " failed with an unknown exception");
  }
  if (!object) throw Error(kind + " plugin '" + name + "'" + origin + " returned nothing");
  // The deleter holds the library: the object is destroyed first, then the library reference
  // is dropped. The control block is created here, in the SDK, not in the plugin.
  std::shared_ptr<void> library = found.library;
  object->library_ = library;
  return std::shared_ptr<Component>(object.release(),
                                    [library](Component* component) { delete component; });
}

void Registry::throw_wrong_interface(const std::string& kind, const std::string& name) {
  throw Error(kind + " plugin '" + name + "' does not implement the " + kind + " interface");
}

}  // namespace trainyard
