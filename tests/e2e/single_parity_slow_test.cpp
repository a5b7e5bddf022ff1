// The rest of the four-rank grid of single_parity_test.cpp (labelled slow): ddp and the other
// fsdp sharding modes on four ranks against one process.

#include <gtest/gtest.h>

#include "single_parity.hpp"

namespace trainyard::testing {
namespace {

TEST(GptTextAgainstSingleSlow, DdpFourRanks) { expect_matches_single("ddp", {}, 4, 2); }
TEST(GptTextAgainstSingleSlow, FsdpGradOpFourRanks) {
  expect_matches_single("fsdp", sharding("grad_op"), 4, 2);
}
TEST(GptTextAgainstSingleSlow, FsdpNoneFourRanks) {
  expect_matches_single("fsdp", sharding("none"), 4, 2);
}

}  // namespace
}  // namespace trainyard::testing
