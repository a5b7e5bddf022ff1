#pragma once
// What a process prints when it crashes. A segfault inside a plugin, LibTorch or a
// communication library otherwise ends a rank with nothing but "killed by signal 11" from its
// launcher; with the report, its stderr names the signal, the faulting address and the call
// stack (function names from the shared libraries, offsets elsewhere), which is what a bug
// report needs.

namespace trainyard {

// Installs handlers for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT that write
//   trainyard: fatal: <what> in <label> (pid P, thread T) [at address A]; call stack:
// followed by one line per frame to stderr, and then end the process by the same signal, so
// exit statuses, core dumps and launchers see the crash as before. `label` names the process
// (a program name, "rank 3"); it is copied. Idempotent; only async-signal-safe calls run in the
// handler. Other threads crashing while one report is written wait for it to finish.
void install_crash_report(const char* label);

}  // namespace trainyard
