// Strict mode: the test binary runs its own probe test, which lacks something of the environment
// (TRAINYARD_SKIP_MISSING) or a GPU (TRAINYARD_SKIP_WITHOUT_GPU), with and without
// TRAINYARD_STRICT=1. The probes are disabled, so that only these tests run them.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.hpp"

namespace trainyard::testing {
namespace {

TEST(StrictModeProbe, DISABLED_LacksSomethingOfTheEnvironment) {
  TRAINYARD_SKIP_MISSING() << "no such corpus: /nonexistent/corpus";
}

TEST(StrictModeProbe, DISABLED_LacksAGpu) { TRAINYARD_SKIP_WITHOUT_GPU() << "no CUDA device"; }

CommandResult run_probe(const std::string& probe, bool strict) {
  const std::vector<std::string> argv = {"/proc/self/exe", "--gtest_also_run_disabled_tests",
                                         "--gtest_filter=StrictModeProbe.DISABLED_" + probe};
  return run_command(argv, {}, 60, {strict ? "TRAINYARD_STRICT=1" : "TRAINYARD_STRICT=0"});
}

TEST(StrictMode, AMissingEnvironmentSkipsOutsideStrictModeAndFailsInIt) {
  const CommandResult relaxed = run_probe("LacksSomethingOfTheEnvironment", false);
  EXPECT_EQ(relaxed.exit_code, 0) << describe(relaxed);
  EXPECT_HAS(relaxed.out, "[  SKIPPED ]");
  EXPECT_HAS(relaxed.out, "no such corpus: /nonexistent/corpus");

  const CommandResult strict = run_probe("LacksSomethingOfTheEnvironment", true);
  EXPECT_NE(strict.exit_code, 0) << describe(strict);
  EXPECT_HAS(strict.out, "[  FAILED  ]");
  EXPECT_HAS(strict.out, "strict mode (TRAINYARD_STRICT=1)");
  EXPECT_HAS(strict.out, "no such corpus: /nonexistent/corpus");
}

TEST(StrictMode, AMissingGpuSkipsEvenInStrictModeAndSaysSo) {
  for (bool strict : {false, true}) {
    const CommandResult result = run_probe("LacksAGpu", strict);
    EXPECT_EQ(result.exit_code, 0) << describe(result);
    EXPECT_HAS(result.out, "[  SKIPPED ]");
    EXPECT_HAS(result.out, "[gpu only] no CUDA device");
  }
}

}  // namespace
}  // namespace trainyard::testing
