// The main of every test binary: GoogleTest's, after two process-wide settings.

#include <gtest/gtest.h>

#include <cstdlib>

#include "trainyard/runtime/crash_report.hpp"

int main(int argc, char** argv) {
  // A test that crashes prints its call stack: a crash seen once in a long run is then
  // diagnosed from the log instead of waiting for it to happen again.
  trainyard::install_crash_report(argc > 0 ? argv[0] : "test");
  // Tests run several ranks as threads of one process, each rank with its own process groups.
  // PyTorch's flight recorder is one per process and registers each group the first time the
  // group enqueues a collective, without holding its lock: groups of two ranks enqueueing at
  // once can corrupt that registry and crash the process (in about one run in a thousand). The
  // recorder keeps a history of collectives for PyTorch's own hang dumps, which no test reads;
  // the rank processes of a job issue their collectives from one thread and keep it. Setting
  // TORCH_FR_BUFFER_SIZE in the environment overrides this.
  setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
