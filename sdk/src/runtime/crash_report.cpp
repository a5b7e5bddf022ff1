#include "trainyard/runtime/crash_report.hpp"

#include <execinfo.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>

namespace trainyard {
namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
constexpr int kMaxFrames = 64;
constexpr std::size_t kLabelSize = 128;

char g_label[kLabelSize] = "trainyard";
std::atomic<bool> g_reporting{false};
// The handler's own stack for the installing thread, so that a stack overflow there is
// reported too.
alignas(16) char g_alternate_stack[64 * 1024];

// Only write(2) below: the handler may run with the heap or stdio locks held by the thread
// that crashed.
void write_text(const char* text) {
  std::size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t written = ::write(STDERR_FILENO, text, left);
    if (written <= 0) return;
    text += written;
    left -= static_cast<std::size_t>(written);
  }
}

void write_number(std::uintptr_t value, unsigned base) {
  char digits[32];
  char* end = digits + sizeof digits;
  char* at = end;
  *--at = '\0';
  do {
    *--at = "0123456789abcdef"[value % base];
    value /= base;
  } while (value != 0);
  if (base == 16) write_text("0x");
  write_text(at);
}

const char* describe(int signal) {
  switch (signal) {
    case SIGSEGV:
      return "segmentation fault (SIGSEGV)";
    case SIGBUS:
      return "bus error (SIGBUS)";
    case SIGILL:
      return "illegal instruction (SIGILL)";
    case SIGFPE:
      return "arithmetic exception (SIGFPE)";
    case SIGABRT:
      return "abort (SIGABRT)";
    default:
      return "fatal signal";
  }
}

void on_fatal_signal(int signal, siginfo_t* info, void*) {
  // One report at a time: a second crashing thread waits here until the process ends.
  bool expected = false;
  if (!g_reporting.compare_exchange_strong(expected, true)) {
    for (;;) ::pause();
  }
  write_text("trainyard: fatal: ");
  write_text(describe(signal));
  write_text(" in ");
  write_text(g_label);
  write_text(" (pid ");
  write_number(static_cast<std::uintptr_t>(::getpid()), 10);
  write_text(", thread ");
  write_number(static_cast<std::uintptr_t>(::syscall(SYS_gettid)), 10);
  write_text(")");
  if (signal == SIGSEGV || signal == SIGBUS) {
    write_text(" at address ");
    write_number(reinterpret_cast<std::uintptr_t>(info->si_addr), 16);
  }
  write_text("; call stack:\n");
  void* frames[kMaxFrames];
  const int count = ::backtrace(frames, kMaxFrames);
  ::backtrace_symbols_fd(frames, count, STDERR_FILENO);
  // The handler was installed with SA_RESETHAND, so the signal's default action is back: a
  // fault repeats when the instruction runs again, and a sent signal is raised once more.
  ::raise(signal);
}

}  // namespace

void install_crash_report(const char* label) {
  std::strncpy(g_label, label, kLabelSize - 1);
  g_label[kLabelSize - 1] = '\0';
  // backtrace() loads its unwinder on first use, which allocates: done here, not in a handler.
  void* warm_up[1];
  ::backtrace(warm_up, 1);
  stack_t stack{};
  stack.ss_sp = g_alternate_stack;
  stack.ss_size = sizeof g_alternate_stack;
  ::sigaltstack(&stack, nullptr);
  struct sigaction action {};
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (int signal : kFatalSignals) ::sigaction(signal, &action, nullptr);
}

}  // namespace trainyard
