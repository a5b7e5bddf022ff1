#include "test_support.hpp"

#include "build_paths.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "trainyard/parallel/distributed.hpp"
#include "trainyard/support/files.hpp"
#include "trainyard/runtime/plugin_loader.hpp"

extern char** environ;

namespace trainyard::testing {

namespace fs = std::filesystem;

fs::path plugin_folder() { return build_paths::plugin_dir(); }
fs::path test_plugin_folder() { return build_paths::test_plugin_dir(); }
fs::path host_binary() { return build_paths::host_binary(); }
fs::path source_dir() { return build_paths::source_dir(); }
fs::path binary_dir() { return build_paths::binary_dir(); }

void load_bundled_plugins(Registry& registry) {
  PluginLoader loader(registry);
  loader.load_folder(plugin_folder());
}

Registry& bundled_registry() {
  static Registry* registry = [] {
    auto* instance = new Registry();
    load_bundled_plugins(*instance);
    return instance;
  }();
  return *registry;
}

CommandResult run_command(const std::vector<std::string>& argv, const fs::path& cwd, int timeout_s,
                          const std::vector<std::string>& env,
                          const std::function<bool()>& kill_when, int kill_signal) {
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(127);
    for (const auto& entry : env) ::putenv(const_cast<char*>(entry.c_str()));
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  CommandResult result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int open_streams = 2;
  char buffer[65536];
  while (open_streams > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    if (kill_when && !result.killed && kill_when()) {
      result.killed = true;
      if (kill_signal == SIGKILL) {
        ::kill(-pid, SIGKILL);
      } else {
        ::kill(pid, kill_signal);
      }
    }
    int ready = ::poll(fds, 2, static_cast<int>(std::min<long long>(left, kill_when ? 2 : 1000)));
    if (ready < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = ::read(fds[i].fd, buffer, sizeof buffer);
      if (got <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_streams;
      } else {
        sinks[i]->append(buffer, static_cast<std::size_t>(got));
      }
    }
  }
  for (auto& fd : fds) {
    if (fd.fd >= 0) ::close(fd.fd);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

CommandResult run_host(const std::vector<std::string>& args, const fs::path& cwd, int timeout_s) {
  std::vector<std::string> argv = {host_binary().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, cwd.empty() ? source_dir() : cwd, timeout_s);
}

TempDir::TempDir() {
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    fs::path candidate = fs::temp_directory_path() / ("trainyard-test-" + std::to_string(random()));
    if (fs::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary folder");
}

TempDir::~TempDir() {
  try {
    remove_tree(path_);
  } catch (const std::exception&) {
    // A folder left in /tmp is no reason to fail a test.
  }
}

fs::path TempDir::write(const std::string& name, const std::string& text) const {
  fs::path file = path_ / name;
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  out << text;
  return file;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected \"" << part << "\" in: " << text;
}

std::vector<std::string> read_lines(const fs::path& file) {
  std::vector<std::string> lines;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string describe(const CommandResult& result) {
  return "exit " + std::to_string(result.exit_code) + "\nstdout:\n" + result.out + "\nstderr:\n" +
         result.err;
}

int free_loopback_port() {
  ListeningSocket socket = listen_on("127.0.0.1", 0);
  ::close(socket.fd);
  return socket.port;
}

bool strict_mode() {
  const char* value = std::getenv("TRAINYARD_STRICT");
  return value != nullptr && std::string(value) == "1";
}

::testing::TestPartResult::Type missing_environment_outcome() {
  return strict_mode() ? ::testing::TestPartResult::kFatalFailure
                       : ::testing::TestPartResult::kSkip;
}

const char* missing_environment_prefix() {
  return strict_mode() ? "strict mode (TRAINYARD_STRICT=1) fails what would be skipped: the "
                         "environment lacks what this test needs (tools/setup provides it)"
                       : "the environment lacks what this test needs (tools/setup provides it)";
}

}  // namespace trainyard::testing
