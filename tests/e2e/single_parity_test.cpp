// gpt_text under ddp and fsdp (every sharding mode) against one process (single_parity.hpp): two
// ranks, and one four-rank case; the rest of the four-rank grid is in single_parity_slow_test.cpp.

#include <gtest/gtest.h>

#include "single_parity.hpp"

namespace trainyard::testing {
namespace {

TEST(GptTextAgainstSingle, DdpTwoRanks) { expect_matches_single("ddp", {}, 2, 4); }
TEST(GptTextAgainstSingle, FsdpFullTwoRanks) {
  expect_matches_single("fsdp", sharding("full"), 2, 4);
}
TEST(GptTextAgainstSingle, FsdpGradOpTwoRanks) {
  expect_matches_single("fsdp", sharding("grad_op"), 2, 4);
}
TEST(GptTextAgainstSingle, FsdpNoneTwoRanks) {
  expect_matches_single("fsdp", sharding("none"), 2, 4);
}
TEST(GptTextAgainstSingle, FsdpFullFourRanks) {
  expect_matches_single("fsdp", sharding("full"), 4, 2);
}

}  // namespace
}  // namespace trainyard::testing
