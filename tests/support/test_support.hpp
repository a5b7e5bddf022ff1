#pragma once
// Shared helpers of the test suites: where things are, running the host, temporary folders.

#include <gtest/gtest.h>

#include <csignal>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard::testing {

std::filesystem::path plugin_folder();       // the bundled plugins of this build
std::filesystem::path test_plugin_folder();  // plugins that exist only for tests
std::filesystem::path host_binary();         // build/bin/trainyard
std::filesystem::path source_dir();          // the repository
std::filesystem::path binary_dir();          // the build folder

// A loopback port free a moment ago, for a rendezvous store.
int free_loopback_port();

// Loads every bundled plugin into `registry`.
void load_bundled_plugins(Registry& registry);
// Every bundled plugin, loaded once and kept for the whole process (never destroyed: it outlives
// every object its plugins make).
Registry& bundled_registry();

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal or timed out
  bool timed_out = false;
  bool killed = false;  // kill_when asked for it
  std::string out;
  std::string err;
};

// Runs argv[0] with arguments, without a shell, capturing both streams. Killed after
// `timeout_s`. Environment entries in `env` ("NAME=value") are added to the current one.
// `kill_when`, polled every few milliseconds while the command runs, sends SIGKILL to it (and
// its process group) the first time it returns true: a crash at a moment the test chooses.
// Another `kill_signal` goes to the command alone (a scheduler's SIGTERM to a launcher), which
// is then waited for as usual.
CommandResult run_command(const std::vector<std::string>& argv,
                          const std::filesystem::path& cwd = {}, int timeout_s = 600,
                          const std::vector<std::string>& env = {},
                          const std::function<bool()>& kill_when = {}, int kill_signal = SIGKILL);

// Exit status and both streams, for assertion messages.
std::string describe(const CommandResult& result);

// The host with `args` (cwd defaults to the repository).
CommandResult run_host(const std::vector<std::string>& args, const std::filesystem::path& cwd = {},
                       int timeout_s = 600);

// A fresh folder removed with everything in it when the object goes out of scope.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  // Writes `text` to a file in the folder and returns its path.
  std::filesystem::path write(const std::string& name, const std::string& text) const;

 private:
  std::filesystem::path path_;
};

std::string read_text(const std::filesystem::path& file);

// Success when `text` contains `part`; the failure shows both.
::testing::AssertionResult contains(const std::string& text, const std::string& part);

// Runs `body`, which must throw trainyard::Error, and returns the message (failing otherwise).
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected trainyard::Error, got another exception: " << error.what();
    return {};
  }
  ADD_FAILURE() << "expected trainyard::Error, nothing was thrown";
  return {};
}
// Lines of a file.
std::vector<std::string> read_lines(const std::filesystem::path& file);

// Strict mode (TRAINYARD_STRICT=1, which tools/test sets when CI=true): a test that cannot run
// because the machine lacks something tools/setup provides (the venv's Python packages, chromium,
// a corpus, CPUs) fails instead of skipping, so a broken setup cannot pass CI silently.
bool strict_mode();
// How TRAINYARD_SKIP_MISSING ends the test: a fatal failure in strict mode, else a skip.
::testing::TestPartResult::Type missing_environment_outcome();
// The prefix of its message, naming the mode that turned the skip into a failure.
const char* missing_environment_prefix();

}  // namespace trainyard::testing

// Ends the test because the environment lacks what it needs; stream the reason into it:
//   if (!fs::exists(python)) TRAINYARD_SKIP_MISSING() << "no " << python;
// A skip normally, a failure under strict mode (see strict_mode()).
#define TRAINYARD_SKIP_MISSING()                                                     \
  return GTEST_MESSAGE_(::trainyard::testing::missing_environment_prefix(),         \
                        ::trainyard::testing::missing_environment_outcome())

// Ends a test that needs a GPU (a CUDA device, NCCL) on a machine without one: always a skip,
// also in strict mode, with the reason, marked so that tools/test's summary and tools/gpu/check
// can tell GPU-only tests from the rest.
#define TRAINYARD_SKIP_WITHOUT_GPU() GTEST_SKIP() << "[gpu only] "

#define EXPECT_HAS(text, part) EXPECT_TRUE(::trainyard::testing::contains((text), (part)))
