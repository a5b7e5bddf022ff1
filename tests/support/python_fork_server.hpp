#pragma once
// A Python process that imports a script once and runs its main() in a fresh fork per call
// (tools/parity/fork_server.py): what a test that replays many short runs in Python uses
// instead of starting the interpreter, and importing torch, for each.

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace trainyard::testing {

class PythonForkServer {
 public:
  // Nothing starts until the first run().
  PythonForkServer(std::filesystem::path python, std::filesystem::path script);
  ~PythonForkServer();
  PythonForkServer(const PythonForkServer&) = delete;
  PythonForkServer& operator=(const PythonForkServer&) = delete;

  // What `python script args...` would return: exit status and both streams. A call that runs
  // past `timeout_s` is killed with the server (the next call starts another).
  CommandResult run(const std::vector<std::string>& args, int timeout_s = 300);

 private:
  void start();
  void stop(bool kill);

  std::filesystem::path python_;
  std::filesystem::path script_;
  TempDir scratch_;  // the calls' streams, and the server's own
  pid_t pid_ = -1;
  int requests_ = -1;    // the server's stdin
  int replies_ = -1;     // its stdout
  std::string pending_;  // reply bytes read past the last line
  int calls_ = 0;
};

}  // namespace trainyard::testing
