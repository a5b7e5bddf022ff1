#pragma once
// Command-line pieces every host command shares: plugin loading options and option parsing.

#include <sys/types.h>

#include <boost/program_options.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/runtime/plugin_loader.hpp"

namespace trainyard {

// Exit status of a command line that could not be understood.
constexpr int kUsageError = 2;

struct CommonOptions {
  std::vector<std::string> plugin_paths;
  bool no_default_plugins = false;
};

void add_common(boost::program_options::options_description& options, CommonOptions& common);

// This binary's own path (plugins and ranks are found relative to it).
std::filesystem::path executable_path();

// Starts this binary with `args` (after its name), stdin from /dev/null and both output streams
// into `log`, and returns the child's pid without waiting. `who` names the command in the Error
// thrown when it cannot start.
pid_t start_this_binary(const std::vector<std::string>& args, const std::filesystem::path& log,
                        const std::string& who);

// Loads plugins from the explicit places only: the install's folder and TRAINYARD_PLUGIN_PATH
// (unless disabled), --plugin-path, then the recipe's plugin_paths.
void load_plugins(PluginLoader& loader, const CommonOptions& common,
                  const std::vector<std::filesystem::path>& recipe_paths = {});

// Parses a command's options; returns nullopt (after printing help) when --help was given.
std::optional<boost::program_options::variables_map> parse(
    const std::vector<std::string>& args, boost::program_options::options_description& options,
    const boost::program_options::positional_options_description& positional,
    const std::string& usage);

}  // namespace trainyard
