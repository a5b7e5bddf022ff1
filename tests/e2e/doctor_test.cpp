// `trainyard doctor`: passes on a working install, and names what is missing.

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <gtest/gtest.h>

#include <string>

#include "test_support.hpp"

namespace trainyard::testing {
namespace {

TEST(DoctorTest, PassesHereWithOneLinePerCheck) {
  auto result = run_host({"doctor", "recipes/fashion_mnist_cnn.toml"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.out, "ok    libtorch 2.11.0");
  EXPECT_HAS(result.out, "Gloo yes");
  EXPECT_HAS(result.out, "ok    threads:");
  // The host's own malloc, not glibc's, serves the run (host/CMakeLists.txt says why).
  EXPECT_HAS(result.out, "ok    malloc: libtcmalloc_minimal.so.4 (linked by the host)");
  EXPECT_HAS(result.out, "ok    plugin folder " + plugin_folder().string());
  EXPECT_HAS(result.out, "ok    plugin single ");
  EXPECT_HAS(result.out, "ok    device cpu: ");
  EXPECT_HAS(result.out, "tensor round trip ok");
  EXPECT_HAS(result.out, "ok    recipe dataset fashion_mnist opens");
  EXPECT_EQ(result.out.find("FAIL"), std::string::npos) << result.out;
}

// A malloc preloaded with LD_PRELOAD takes the place of the tcmalloc the host links, and doctor
// says so: here glibc's own, the way to time a run without tcmalloc.
TEST(DoctorTest, NamesAPreloadedMallocInPlaceOfTcmalloc) {
  Dl_info libc{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&gnu_get_libc_version), &libc), 0);
  const CommandResult result = run_command({host_binary().string(), "doctor"}, source_dir(), 600,
                                           {std::string("LD_PRELOAD=") + libc.dli_fname});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.out, "info  malloc: libc.so.6 (preloaded in place of the host's tcmalloc)");
}

// The peak FLOP/s a run would divide by: measured and cached by the first doctor, read back by
// the next.
TEST(DoctorTest, PrintsTheCachedPeakOrMeasuresIt) {
  TempDir cache;
  auto doctor = [&] {
    return run_command({host_binary().string(), "doctor"}, source_dir(), 600,
                       {"TRAINYARD_CACHE=" + cache.path().string()});
  };
  const CommandResult first = doctor();
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  EXPECT_HAS(first.out, "ok    device cpu peak float32: ");
  EXPECT_HAS(first.out, "TFLOP/s (measured, float32 matmul probe, " + cache.path().string());
  const CommandResult second = doctor();
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_HAS(second.out, "TFLOP/s (cached, float32 matmul probe, " + cache.path().string());
}

TEST(DoctorTest, NamesAnEmptyPluginFolderAndFails) {
  TempDir empty;
  auto result = run_host({"doctor", "--no-default-plugins", "--plugin-path", empty.path().string()});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_HAS(result.out, "FAIL  plugin folder " + empty.path().string() + " holds no plugin libraries");
  EXPECT_HAS(result.out, "FAIL  device cpu: no plugin provides it");
}

TEST(DoctorTest, NamesABrokenPluginAndWhatARecipeLacks) {
  TempDir dir;
  auto recipe = dir.write("r.toml", "[dataset]\nplugin = \"nonexistent\"\n[model]\nplugin = \"mlp\"\n"
                                    "[optimizer]\nplugin = \"sgd\"\n");
  auto result = run_host({"doctor", recipe.string(), "--plugin-path",
                          (test_plugin_folder() / "libwrong_abi.so").string()});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_HAS(result.out, "FAIL  ");
  EXPECT_HAS(result.out, "libwrong_abi.so");
  EXPECT_HAS(result.out, "FAIL  recipe " + recipe.string());
  EXPECT_HAS(result.out, "nonexistent");
}

}  // namespace
}  // namespace trainyard::testing
