#pragma once
// Factories of plugin components, keyed by (kind, name).

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/api/component.hpp"
#include "trainyard/api/config.hpp"

namespace trainyard {

struct BuildContext;

using ComponentFactory =
    std::function<std::unique_ptr<Component>(const Config& options, const BuildContext& context)>;

// What the registry knows of one component: enough for `trainyard plugins` and for errors.
struct ComponentInfo {
  std::string kind;
  std::string name;
  std::string help;
  OptionSpecs options;
  std::string plugin;          // the library's plugin name
  std::string plugin_version;
  std::string library_path;    // empty for components built into the host or a test
};

// The registry every plugin library registers into. A duplicate (kind, name) is an error naming
// both libraries. A library's registrations are staged and take effect together when its register
// callback returns, so a callback that throws half-way leaves nothing registered. Objects it
// creates hold their library loaded until they are destroyed (and know it: Component::library()),
// and exceptions thrown by plugin factories are turned into trainyard::Error while the library is
// still loaded.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers a factory for interface T (which names its kind in T::kKind).
  template <typename T, typename Factory>
  void add(std::string name, OptionSpecs options, std::string help, Factory factory) {
    add_factory(T::kKind, std::move(name), std::move(options), std::move(help),
                [factory = std::move(factory)](const Config& config, const BuildContext& context)
                    -> std::unique_ptr<Component> { return factory(config, context); });
  }

  // Validates `section` against the component's options, builds the component and returns it
  // with its library kept alive. Throws Error for an unknown name (listing the known ones and
  // the places searched, and how to add one), for
  // invalid options, and for anything the factory throws.
  template <typename T>
  std::shared_ptr<T> create(const std::string& name, const Config& section,
                            const BuildContext& context) const {
    std::shared_ptr<Component> object = create_component(T::kKind, name, section, context);
    auto typed = std::dynamic_pointer_cast<T>(object);
    if (!typed) throw_wrong_interface(T::kKind, name);
    return typed;
  }

  // The section with the component's defaults filled in, after the same checks as create().
  Config resolve(const std::string& kind, const std::string& name, const Config& section) const;

  bool contains(const std::string& kind, const std::string& name) const;
  const ComponentInfo& info(const std::string& kind, const std::string& name) const;
  std::vector<ComponentInfo> list(const std::string& kind = {}) const;
  std::vector<std::string> names(const std::string& kind) const;

  // Set by the plugin loader around a library's register callback: components added meanwhile
  // belong to that library and keep `keep_alive` referenced. They are staged until
  // end_library() registers them all; abandon_library() drops them (the callback failed).
  void begin_library(std::shared_ptr<void> keep_alive, std::string path, std::string plugin,
                     std::string version);
  void end_library();
  void abandon_library();
  // The folders and libraries plugins were loaded from, which an unknown-plugin error lists.
  void note_searched(std::string place);
  const std::vector<std::string>& searched() const { return searched_; }

  void add_factory(std::string kind, std::string name, OptionSpecs options, std::string help,
                   ComponentFactory factory);

 private:
  struct Entry {
    ComponentInfo info;
    ComponentFactory factory;
    std::shared_ptr<void> library;
  };
  const Entry& entry(const std::string& kind, const std::string& name) const;
  std::shared_ptr<Component> create_component(const std::string& kind, const std::string& name,
                                              const Config& section,
                                              const BuildContext& context) const;
  [[noreturn]] static void throw_wrong_interface(const std::string& kind, const std::string& name);

  std::map<std::pair<std::string, std::string>, Entry> entries_;
  struct Loading {
    // Declared first, destroyed last: the staged factories' code lives in the library.
    std::shared_ptr<void> keep_alive;
    std::string path, plugin, version;
    std::map<std::pair<std::string, std::string>, Entry> staged;
  };
  std::unique_ptr<Loading> loading_;
  std::vector<std::string> searched_;
};

}  // namespace trainyard
