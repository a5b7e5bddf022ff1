#pragma once
// The project venv's Python (tools/setup makes it), for cross-checks against reference readers.
// Its absence fails the test: CI always has it.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "test_support.hpp"

namespace trainyard::testing {

// Runs `script` with the venv's Python and `args`; a failure to run is a test failure.
inline CommandResult run_venv_python(const std::string& script,
                                     const std::vector<std::string>& args = {}) {
  const std::filesystem::path python = source_dir() / ".venv" / "bin" / "python";
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "no " << python << " (run tools/setup)";
    return {};
  }
  std::vector<std::string> argv = {python.string(), "-c", script};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, {}, 300);
}

}  // namespace trainyard::testing
