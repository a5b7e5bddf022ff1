#include "trainyard/runtime/cpu_binding.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

const std::vector<int> kEight = {0, 1, 2, 3, 4, 5, 6, 7};

TEST(CpuBinding, AutomaticBindsRanksThatFillTheMachine) {
  EXPECT_EQ(cpus_for_rank(CpuBinding::Automatic, {0, 1}, 0, 2, 1), (std::vector<int>{0}));
  EXPECT_EQ(cpus_for_rank(CpuBinding::Automatic, {0, 1}, 1, 2, 1), (std::vector<int>{1}));
  EXPECT_EQ(cpus_for_rank(CpuBinding::Automatic, kEight, 1, 2, 4), (std::vector<int>{4, 5, 6, 7}));
  // Taken in order from the CPUs allowed, whatever their numbers.
  EXPECT_EQ(cpus_for_rank(CpuBinding::Automatic, {2, 3, 8, 9}, 1, 2, 2), (std::vector<int>{8, 9}));
}

TEST(CpuBinding, AutomaticLeavesOtherShapesUnbound) {
  EXPECT_TRUE(cpus_for_rank(CpuBinding::Automatic, kEight, 0, 2, 1).empty());  // spare CPUs
  EXPECT_TRUE(cpus_for_rank(CpuBinding::Automatic, {0, 1}, 0, 4, 1).empty());  // too few
  EXPECT_TRUE(cpus_for_rank(CpuBinding::Automatic, {0, 1}, 0, 1, 2).empty());  // one rank
  EXPECT_TRUE(cpus_for_rank(CpuBinding::None, {0, 1}, 1, 2, 1).empty());
}

TEST(CpuBinding, CoresBindsWheneverThereAreEnoughCpus) {
  EXPECT_EQ(cpus_for_rank(CpuBinding::Cores, kEight, 2, 3, 2), (std::vector<int>{4, 5}));
  EXPECT_EQ(cpus_for_rank(CpuBinding::Cores, kEight, 0, 1, 3), (std::vector<int>{0, 1, 2}));
  try {
    cpus_for_rank(CpuBinding::Cores, {0, 1}, 0, 2, 2);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("needs 4 CPUs (2 local ranks x 2 threads)"),
              std::string::npos)
        << error.what();
  }
}

TEST(CpuBinding, ParsesTheOptionAndDescribesCpuLists) {
  EXPECT_EQ(parse_cpu_binding("auto", "run.cpu_binding"), CpuBinding::Automatic);
  EXPECT_EQ(parse_cpu_binding("cores", "run.cpu_binding"), CpuBinding::Cores);
  EXPECT_EQ(parse_cpu_binding("none", "run.cpu_binding"), CpuBinding::None);
  EXPECT_THROW(parse_cpu_binding("sockets", "run.cpu_binding"), Error);
  EXPECT_EQ(describe_cpus({0, 1, 2, 3, 6, 8, 9}), "0-3,6,8-9");
  EXPECT_EQ(describe_cpus({5}), "5");
  EXPECT_EQ(describe_cpus({}), "");
}

TEST(CpuBinding, BindingThisProcessNarrowsItsAllowedCpus) {
  const std::vector<int> before = allowed_cpus();
  ASSERT_FALSE(before.empty());
  bind_process_to_cpus({before.back()});
  EXPECT_EQ(allowed_cpus(), (std::vector<int>{before.back()}));
  bind_process_to_cpus(before);
  EXPECT_EQ(allowed_cpus(), before);
}

// The CPUs a thread started now may run on.
std::vector<int> cpus_of_a_new_thread() {
  std::vector<int> cpus;
  std::thread([&] { cpus = allowed_cpus(); }).join();
  return cpus;
}

TEST(CpuBinding, ThreadsStartedUnboundRunOnTheProcessesCpusAndTheCallerStaysBound) {
  const std::vector<int> before = allowed_cpus();
  ASSERT_GE(before.size(), 2u) << "the test needs 2 CPUs to tell bound from unbound";
  bind_process_to_cpus({before.front()});
  {
    const ThreadsStartedUnbound unbound(before);
    EXPECT_EQ(cpus_of_a_new_thread(), before);
  }
  // The caller is bound again, and so are the threads it starts after.
  EXPECT_EQ(allowed_cpus(), (std::vector<int>{before.front()}));
  EXPECT_EQ(cpus_of_a_new_thread(), (std::vector<int>{before.front()}));
  {
    const ThreadsStartedUnbound nothing({});  // a process never bound changes nothing
    EXPECT_EQ(cpus_of_a_new_thread(), (std::vector<int>{before.front()}));
  }
  bind_process_to_cpus(before);
}

}  // namespace
}  // namespace trainyard
