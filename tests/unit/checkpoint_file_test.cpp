// Unit tests of trainyard/api/checkpoint_file.hpp (bytes land in order, counted and checksummed) and
// trainyard/crc32.hpp (zlib's CRC-32, whatever the length and alignment).

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/checkpoint_file.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/crc32.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;

std::string pattern(std::size_t bytes, unsigned seed) {
  std::string text(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) text[i] = static_cast<char>((i * 131 + seed) >> 3);
  return text;
}

std::uint32_t crc_of(const std::string& bytes) {
  return static_cast<std::uint32_t>(crc32(crc32(0L, Z_NULL, 0),
                                          reinterpret_cast<const Bytef*>(bytes.data()),
                                          static_cast<uInt>(bytes.size())));
}

TEST(Crc32, EqualsZlibAtEveryLengthAlignmentAndStartingValue) {
  const std::string bytes = pattern(3 << 20, 11);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::vector<std::size_t> lengths;
  for (std::size_t length = 0; length <= 300; ++length) lengths.push_back(length);
  for (std::size_t length : {1023u, 1024u, 4097u, 65536u, 65600u, 1000003u, 3u << 20}) {
    lengths.push_back(length);
  }
  for (std::size_t offset : {0u, 1u, 7u, 15u, 16u, 33u}) {
    for (std::size_t length : lengths) {
      if (offset + length > bytes.size()) continue;
      for (uLong start : {0ul, 0xdeadbeeful}) {
        const auto expected =
            static_cast<std::uint32_t>(crc32(start, data + offset, static_cast<uInt>(length)));
        ASSERT_EQ(update_crc32(static_cast<std::uint32_t>(start), data + offset, length), expected)
            << "offset " << offset << ", length " << length << ", start " << start;
      }
    }
  }
  // Chained over pieces equals one pass.
  std::uint32_t chained = 0;
  for (std::size_t at = 0; at < bytes.size(); at += 100'001) {
    chained = update_crc32(chained, data + at, std::min<std::size_t>(100'001, bytes.size() - at));
  }
  EXPECT_EQ(chained, crc_of(bytes));
}

TEST(CheckpointFileWriter, SmallAndLargePiecesLandInOrderCountedAndChecksummed) {
  TempDir dir;
  // Gathered pieces around direct ones, one larger than a write stretch, one just under the
  // gathering bound, and enough small ones to fill the gathering buffer more than once.
  std::vector<std::string> pieces = {pattern(8, 1),
                                     pattern(100, 2),
                                     pattern(20 << 20, 3),
                                     pattern(3, 4),
                                     pattern((64 << 10) - 1, 5),
                                     pattern(64 << 10, 6)};
  for (unsigned i = 0; i < 40; ++i) pieces.push_back(pattern(40000, 7 + i));
  pieces.push_back(pattern(1, 99));
  std::string expected;
  CheckpointFileWriter out(dir / "file.bin");
  for (const auto& piece : pieces) {
    out.append(piece);
    expected += piece;
    EXPECT_EQ(out.size(), expected.size());
  }
  const CheckpointFileInfo info = out.finish();
  EXPECT_EQ(info.name, "file.bin");
  EXPECT_EQ(info.bytes, static_cast<std::int64_t>(expected.size()));
  EXPECT_EQ(info.crc32, crc_of(expected));
  EXPECT_TRUE(testing::read_text(dir / "file.bin") == expected) << "the file's bytes differ";
}

// flush() hands every appended byte to the file, so that the memory they came from may change
// before the file is finished; holding the disk back until finish() changes no byte.
TEST(CheckpointFileWriter, FlushedBytesAreInTheFileBeforeItIsFinished) {
  TempDir dir;
  for (const bool hold_writeback : {false, true}) {
    const fs::path file = dir / (hold_writeback ? "held.bin" : "started.bin");
    CheckpointFileWriter out(file);
    if (hold_writeback) out.start_writeback_at_finish();
    std::string source = pattern(3 << 20, 5);
    const std::string expected = source + "tail";
    out.append(source);
    out.append("tail");
    out.flush();
    EXPECT_TRUE(testing::read_text(file) == expected) << file << " before finish()";
    source.assign(source.size(), 'x');  // the caller's memory, free again
    const CheckpointFileInfo info = out.finish();
    EXPECT_EQ(info.bytes, static_cast<std::int64_t>(expected.size()));
    EXPECT_EQ(info.crc32, crc_of(expected));
    EXPECT_TRUE(testing::read_text(file) == expected) << file;
  }
}

TEST(CheckpointFileWriter, EmptyFile) {
  TempDir dir;
  CheckpointFileWriter out(dir / "empty.bin");
  const CheckpointFileInfo info = out.finish();
  EXPECT_EQ(info.bytes, 0);
  EXPECT_EQ(info.crc32, crc_of(""));
  EXPECT_EQ(fs::file_size(dir / "empty.bin"), 0u);
}

TEST(CheckpointFileWriter, ReplacesAnOlderFile) {
  TempDir dir;
  const fs::path file = dir.write("file.bin", pattern(5000, 1));
  CheckpointFileWriter out(file);
  out.append("new");
  EXPECT_EQ(out.finish().bytes, 3);
  EXPECT_EQ(testing::read_text(file), "new");
}

TEST(CheckpointFileWriter, FailuresAreErrorsNamingTheFileAndTheReason) {
  TempDir dir;
  const fs::path nowhere = dir / "missing" / "file.bin";
  EXPECT_HAS(error_of([&] { CheckpointFileWriter out(nowhere); }),
             "cannot create checkpoint file " + nowhere.string() + ": No such file or directory");
  // A full disk: a large piece fails as it is written, a small one when it is flushed.
  CheckpointFileWriter large("/dev/full");
  EXPECT_HAS(error_of([&] { large.append(pattern(1 << 20, 1)); }),
             "cannot write checkpoint file /dev/full: No space left on device");
  CheckpointFileWriter small("/dev/full");
  small.append("header");
  EXPECT_HAS(error_of([&] { small.finish(); }), "No space left on device");
}

TEST(CheckpointFileWriter, AFinishedFileTakesNoMoreBytes) {
  TempDir dir;
  CheckpointFileWriter out(dir / "file.bin");
  out.finish();
  EXPECT_HAS(error_of([&] { out.append("late"); }), "already finished");
  EXPECT_HAS(error_of([&] { out.finish(); }), "already finished");
}

}  // namespace
}  // namespace trainyard
