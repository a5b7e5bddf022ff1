// The crash report: a child process crashes on purpose and the parent reads what it printed
// and how it ended.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>

#include "trainyard/runtime/crash_report.hpp"

namespace trainyard::testing {
namespace {

struct Ended {
  int signal = 0;  // the signal that ended the child, 0 when it exited
  std::string err;
};

// Runs `crash` in a child process with the report installed under `label`.
Ended run_crashing_child(const char* label, const std::function<void()>& crash) {
  int pipe_ends[2];
  if (::pipe(pipe_ends) != 0) ADD_FAILURE() << "pipe failed";
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(pipe_ends[1], STDERR_FILENO);
    ::close(pipe_ends[0]);
    install_crash_report(label);
    crash();
    std::_Exit(0);
  }
  ::close(pipe_ends[1]);
  Ended ended;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_ends[0], buffer, sizeof buffer)) > 0;)
    ended.err.append(buffer, n);
  ::close(pipe_ends[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (WIFSIGNALED(status)) ended.signal = WTERMSIG(status);
  return ended;
}

volatile std::uintptr_t g_unmapped_address = 0x18;

[[gnu::noinline]] void write_to_unmapped_page() {
  *reinterpret_cast<volatile int*>(g_unmapped_address) = 1;
}

TEST(CrashReport, ASegfaultPrintsSignalAddressAndCallStackThenEndsBySignal) {
  Ended ended = run_crashing_child("rank 7", [] { write_to_unmapped_page(); });
  EXPECT_EQ(ended.signal, SIGSEGV) << ended.err;
  EXPECT_EQ(ended.err.rfind("trainyard: fatal: segmentation fault (SIGSEGV) in rank 7 (pid ", 0),
            0u)
      << ended.err;
  EXPECT_NE(ended.err.find(") at address 0x18; call stack:\n"), std::string::npos) << ended.err;
  // At least the handler's frame and the ones that led to the fault, one line each.
  std::size_t lines = 0;
  for (char c : ended.err) lines += c == '\n' ? 1 : 0;
  EXPECT_GE(lines, 4u) << ended.err;
}

TEST(CrashReport, AnAbortIsReportedAndStillEndsTheProcessBySigabrt) {
  Ended ended = run_crashing_child("abort test", [] { std::abort(); });
  EXPECT_EQ(ended.signal, SIGABRT) << ended.err;
  EXPECT_NE(ended.err.find("trainyard: fatal: abort (SIGABRT) in abort test (pid "),
            std::string::npos)
      << ended.err;
  EXPECT_EQ(ended.err.find("at address"), std::string::npos) << ended.err;
}

TEST(CrashReport, AProcessThatDoesNotCrashPrintsNothing) {
  Ended ended = run_crashing_child("quiet", [] {});
  EXPECT_EQ(ended.signal, 0);
  EXPECT_TRUE(ended.err.empty()) << ended.err;
}

}  // namespace
}  // namespace trainyard::testing
