// Unit tests of trainyard/checkpoint_manifest.hpp and read_manifest: what a manifest may say, and
// what it is refused for.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "test_support.hpp"
#include "trainyard/runtime/checkpoint_manifest.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;

CheckpointManifest two_ranks() {
  CheckpointManifest manifest;
  manifest.step = 2811;
  manifest.backend = "torch";
  manifest.framework_version = "0.1.0";
  manifest.world_size = 2;
  manifest.files = {{"shared.pt", 1356842, 3518839462u},
                    {"rank-00000.pt", 7112, 0},
                    {"rank-00001.pt", 0, 4294967295u}};
  return manifest;
}

// The written manifest with `from` replaced by `to`.
std::string edited(const std::string& from, const std::string& to) {
  std::string text = manifest_text(two_ranks());
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

std::string parse_error(const std::string& text) {
  return error_of([&] { parse_manifest(text, "m.toml"); });
}

TEST(CheckpointManifestTest, WrittenManifestReadsBack) {
  const CheckpointManifest read = parse_manifest(manifest_text(two_ranks()), "m.toml");
  EXPECT_EQ(read.step, 2811);
  EXPECT_EQ(read.backend, "torch");
  EXPECT_EQ(read.framework_version, "0.1.0");
  EXPECT_EQ(read.world_size, 2);
  ASSERT_EQ(read.files.size(), 3u);
  EXPECT_EQ(read.files[0].name, "shared.pt");
  EXPECT_EQ(read.files[0].bytes, 1356842);
  EXPECT_EQ(read.files[0].crc32, 3518839462u);
  EXPECT_EQ(read.files[2].crc32, 4294967295u);
}

TEST(CheckpointManifestTest, NamesOutsideTheFolderAreRefused) {
  for (const char* name : {"../../etc/passwd", "/etc/passwd", "sub/shared.pt", "..", ".", ""}) {
    const std::string quoted = std::string("\"") + name + "\"";
    std::string error = parse_error(edited("\"rank-00000.pt\"", quoted));
    EXPECT_HAS(error, "corrupt checkpoint manifest m.toml");
    EXPECT_HAS(error, "files.name must be a file name inside the checkpoint folder") << name;
  }
  EXPECT_HAS(parse_error(edited("\"rank-00000.pt\"", "\"a\\u0000b\"")), "files.name must be");
}

TEST(CheckpointManifestTest, NumbersOutOfRangeAreRefused) {
  EXPECT_HAS(parse_error(edited("world_size = 2", "world_size = 4294967297")),
             "world_size must be in [1, 1048576], got 4294967297");
  EXPECT_HAS(parse_error(edited("world_size = 2", "world_size = 0")), "world_size must be in");
  EXPECT_HAS(parse_error(edited("step = 2811", "step = -1")), "step must be in [0, ");
  EXPECT_HAS(parse_error(edited("bytes = 7112", "bytes = -7112")), "files.bytes must be in [0, ");
  EXPECT_HAS(parse_error(edited("crc32 = 0", "crc32 = 4294967296")),
             "files.crc32 must be in [0, 4294967295], got 4294967296");
}

TEST(CheckpointManifestTest, OtherFormatsAndShapesAreRefused) {
  EXPECT_HAS(parse_error(edited("format = 1", "format = 2")),
             "format is 2; this reader knows format 1");
  EXPECT_HAS(parse_error(edited("format = 1\n", "")), "missing option 'format'");
  EXPECT_HAS(parse_error("format = 1\nstep = 1\nbackend = \"torch\"\nframework_version = \"x\"\n"
                         "world_size = 1\nfiles = [1]\n"),
             "files must be an array of tables");
  EXPECT_HAS(parse_error("format = 1\nstep = 1\nbackend = \"torch\"\nframework_version = \"x\"\n"
                         "world_size = 1\nfiles = 3\n"),
             "files must be an array of tables");
  EXPECT_HAS(parse_error("step = = 1"), "m.toml:1:");
}

TEST(CheckpointManifestTest, ManifestThatIsNoFileIsRefusedBeforeReading) {
  TempDir dir;
  fs::create_directories(dir.path() / "step-000000001");
  fs::create_symlink("/dev/zero", dir.path() / "step-000000001" / "manifest.toml");
  EXPECT_HAS(error_of([&] { read_manifest(dir.path() / "step-000000001"); }),
             "manifest.toml: not a regular file");
  fs::create_directories(dir.path() / "step-000000002" / "manifest.toml");
  EXPECT_HAS(error_of([&] { read_manifest(dir.path() / "step-000000002"); }), "not a regular file");
}

}  // namespace
}  // namespace trainyard
