#pragma once
// Recipes: TOML files composed with `extends`, overridden with --set, validated against the
// options the runtime and every named plugin declare.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "trainyard/api/config.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard {

struct Recipe {
  std::shared_ptr<const Table> root;
  std::filesystem::path path;  // the file named on the command line
  // What resolving changed on its own, one line each, for the user to see (options of a plugin
  // that a --set X.plugin=... replaced, dropped because the new plugin does not declare them).
  std::vector<std::string> notes;

  Config section(const std::string& name) const;
  bool has_section(const std::string& name) const;
  // The recipe's name: its `name` key, else the file's stem.
  std::string name() const;
};

// Parses `file`, follows `extends` chains (paths relative to the file that names them; a cycle
// is an error listing the chain), then applies `overrides` ("section.key=value", the value in
// TOML syntax or a bare string; "section.key=!" removes the key). Parse errors carry
// file:line:column.
Recipe load_recipe(const std::filesystem::path& file,
                   const std::vector<std::string>& overrides = {});

// Parses TOML text (for tests and tools); `name` stands for the file in locations.
std::shared_ptr<const Table> parse_toml(const std::string& text, const std::string& name);

// Checks every section against the runtime's and the plugins' declared options and returns the
// recipe with every default filled in (`plugin` keys included). Throws Error on the first
// problem, located in its file. When a --set replaced a section's plugin, the recipe file's
// options that the new plugin does not declare are dropped, each with a line in `notes`.
Recipe resolve_recipe(const Recipe& recipe, const Registry& registry);

// Plugin paths the recipe names (top-level `plugin_paths`), resolved against its folder.
std::vector<std::filesystem::path> recipe_plugin_paths(const Recipe& recipe);

// The recipe as TOML, tables as [section] headers, in written order.
std::string to_toml(const Table& root);

// Options of the sections the runtime owns.
const OptionSpecs& run_options();
const OptionSpecs& loader_options();
const OptionSpecs& checkpoint_policy_options();
const OptionSpecs& sink_common_options();
const OptionSpecs& comm_options();
const OptionSpecs& parallel_options();

// The mesh sizes a [parallel] section asks for, checked against parallel_options() (and against
// the world size when the run starts: MeshLayout::resolve).
MeshRequest mesh_request(const Config& parallel);

// A plugin's own options: `section` without the keys the runtime owns there (`runtime`, such as
// checkpoint_policy_options()), which the plugin does not declare.
Config plugin_options(const Config& section, const OptionSpecs& runtime);

// The plugin sections and the plugin each defaults to ("" = the section is required).
struct PluginSection {
  std::string section;
  std::string kind;
  std::string default_plugin;
  bool optional = false;  // may be absent altogether
};
const std::vector<PluginSection>& plugin_sections();

}  // namespace trainyard
