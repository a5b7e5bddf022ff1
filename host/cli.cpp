#include "cli.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "trainyard/api/error.hpp"

extern char** environ;

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trainyard {

void add_common(po::options_description& options, CommonOptions& common) {
  options.add_options()(
      "plugin-path", po::value(&common.plugin_paths)->composing(),
      "load plugins from this folder or library (repeatable)")(
      "no-default-plugins", po::bool_switch(&common.no_default_plugins),
      "skip the install's plugin folder and TRAINYARD_PLUGIN_PATH");
}

fs::path executable_path() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self;
}

pid_t start_this_binary(const std::vector<std::string>& args, const fs::path& log,
                        const std::string& who) {
  std::vector<std::string> argv = {"trainyard"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& arg : argv) c_argv.push_back(arg.data());
  c_argv.push_back(nullptr);
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    throw Error(who + ": cannot write " + log.string() + ": " + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  fs::path self = executable_path();
  if (self.empty()) self = "/proc/self/exe";
  pid_t pid = 0;
  const int failed = ::posix_spawn(&pid, self.c_str(), &actions, nullptr, c_argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(log_fd);
  if (failed != 0) {
    throw Error(who + ": cannot run " + self.string() + ": " + std::strerror(failed));
  }
  return pid;
}

void load_plugins(PluginLoader& loader, const CommonOptions& common,
                  const std::vector<fs::path>& recipe_paths) {
  if (!common.no_default_plugins) {
    fs::path bundled = bundled_plugin_folder(executable_path());
    std::error_code ec;
    if (fs::is_directory(bundled, ec)) loader.load_folder(bundled);
    if (const char* env = std::getenv("TRAINYARD_PLUGIN_PATH")) {
      for (const auto& path : split_search_path(env)) loader.load_path(path);
    }
  }
  for (const auto& path : common.plugin_paths) loader.load_path(fs::absolute(path));
  for (const auto& path : recipe_paths) loader.load_path(path);
}

std::optional<po::variables_map> parse(const std::vector<std::string>& args,
                                       po::options_description& options,
                                       const po::positional_options_description& positional,
                                       const std::string& usage) {
  options.add_options()("help,h", "show this help");
  po::variables_map values;
  po::store(po::command_line_parser(args).options(options).positional(positional).run(), values);
  if (values.count("help")) {
    std::cout << usage << "\n" << options << std::endl;
    return std::nullopt;
  }
  po::notify(values);
  return values;
}

}  // namespace trainyard
