// The image codec library against Python's: JPEG and PNG files Pillow wrote (colour, grayscale,
// 4:2:0 and 4:4:4 chroma, transparency, a palette) decode to the pixels Pillow decodes, in the
// file's own channels and converted to L and RGB; resized as torchvision's v2 Resize(antialias=
// True) resizes them (down, up, to non-square sizes); damaged files are refused naming the file;
// the benchmark's JPEG fixture (data/fashion-mnist-jpeg224) decodes as Pillow decodes it. The
// files and the references are made at test time by image_codec/make_references.py.

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "image_decode.hpp"
#include "image_resize.hpp"
#include "test_support.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::vector<std::uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The references, made once for the whole suite.
struct References {
  TempDir folder;
  Json manifest;
  std::string error;
};

const References& references() {
  static const std::unique_ptr<References> made = [] {
    auto refs = std::make_unique<References>();
    const fs::path python = source_dir() / ".venv" / "bin" / "python";
    const CommandResult result = run_command(
        {python.string(), (source_dir() / "tests/unit/image_codec/make_references.py").string(),
         refs->folder.path().string(),
         (source_dir() / "data" / "fashion-mnist-jpeg224").string()},
        {}, 300);
    if (result.exit_code != 0) {
      refs->error = describe(result);
    } else {
      std::ifstream in(refs->folder / "manifest.json");
      refs->manifest = Json::parse(in);
    }
    return refs;
  }();
  return *made;
}

ColorMode mode_named(const std::string& mode) {
  if (mode == "L") return ColorMode::kGray;
  if (mode == "RGB") return ColorMode::kRgb;
  return ColorMode::kAsStored;
}

// The largest difference of two pixel buffers of one size, and how many pixels differ.
std::pair<int, std::size_t> difference(const std::vector<std::uint8_t>& ours,
                                       const std::vector<std::uint8_t>& theirs) {
  int largest = 0;
  std::size_t count = 0;
  for (std::size_t i = 0; i < ours.size() && i < theirs.size(); ++i) {
    const int gap = std::abs(static_cast<int>(ours[i]) - static_cast<int>(theirs[i]));
    largest = std::max(largest, gap);
    count += gap != 0;
  }
  return {largest, count};
}

class ImageCodec : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(references().error.empty()) << references().error; }
  fs::path file(const std::string& name) const { return references().folder / name; }
};

TEST_F(ImageCodec, DecodesThePixelsPillowDecodes) {
  const Json& entries = references().manifest["decoded"];
  ASSERT_EQ(entries.size(), 21u);
  for (const Json& entry : entries) {
    const std::string what =
        entry["file"].get<std::string>() + " as " + entry["mode"].get<std::string>();
    const DecodedImage image =
        decode_image_file(file(entry["file"]).string(), mode_named(entry["mode"]));
    EXPECT_EQ(image.height, entry["height"].get<std::int64_t>()) << what;
    EXPECT_EQ(image.width, entry["width"].get<std::int64_t>()) << what;
    EXPECT_EQ(image.channels, entry["channels"].get<std::int64_t>()) << what;
    const std::vector<std::uint8_t> pillow = read_bytes(file(entry["pixels"]));
    ASSERT_EQ(image.pixels.size(), pillow.size()) << what;
    const auto [largest, count] = difference(image.pixels, pillow);
    // libjpeg-turbo's accurate integer IDCT and fancy upsampling on both sides: the same bits.
    EXPECT_EQ(largest, 0) << what << ": " << count << " of " << pillow.size()
                          << " values differ, by up to " << largest;
  }
}

// The loader benchmark's fixture (tools/setup's 224x224 JPEGs, 4:2:0 chroma, quality 90): the
// same pixels as Pillow's, bit for bit.
TEST_F(ImageCodec, DecodesTheBenchmarkFixtureAsPillowDoes) {
  const Json& entries = references().manifest["fixture"];
  ASSERT_EQ(entries.size(), 16u) << "data/fashion-mnist-jpeg224 is missing: run tools/setup";
  for (const Json& entry : entries) {
    const std::string path = entry["file"].get<std::string>();
    const DecodedImage image = decode_image_file(path, ColorMode::kRgb);
    const std::vector<std::uint8_t> pillow = read_bytes(file(entry["pixels"]));
    ASSERT_EQ(image.pixels.size(), pillow.size()) << path;
    EXPECT_EQ(difference(image.pixels, pillow).first, 0) << path;
  }
}

TEST_F(ImageCodec, ResizesAsTorchvisionResizesWithAntialiasing) {
  const Json& entries = references().manifest["resized"];
  ASSERT_EQ(entries.size(), 8u);
  // The kernel splits rows over threads as torchvision's did; the result does not depend on it.
  at::set_num_threads(references().manifest["threads"].get<int>());
  for (const Json& entry : entries) {
    const std::string what = entry["file"].get<std::string>() + " at " +
                             std::to_string(entry["height"].get<int>()) + "x" +
                             std::to_string(entry["width"].get<int>());
    const DecodedImage decoded =
        decode_image_file(file(entry["file"]).string(), mode_named(entry["mode"]));
    const DecodedImage resized = resize_image(decoded, entry["height"].get<std::int64_t>(),
                                              entry["width"].get<std::int64_t>());
    const std::vector<std::uint8_t> torchvision = read_bytes(file(entry["pixels"]));
    ASSERT_EQ(resized.pixels.size(), torchvision.size()) << what;
    const auto [largest, count] = difference(resized.pixels, torchvision);
    // The same LibTorch kernel on the same 8-bit channels-last layout: the same bits.
    EXPECT_EQ(largest, 0) << what << ": " << count << " values differ, by up to " << largest;
  }
  const DecodedImage gray = decode_image_file(file("gray.png").string());
  EXPECT_EQ(resize_image(gray, 28, 28).pixels, gray.pixels);
  EXPECT_THROW(resize_image(gray, 0, 5), Error);
}

TEST_F(ImageCodec, DamagedFilesAreRefusedNamingTheFile) {
  for (const Json& entry : references().manifest["bad"]) {
    const std::string path = file(entry["file"]).string();
    try {
      decode_image_file(path);
      ADD_FAILURE() << path << " decoded";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_HAS(message, path);
      EXPECT_HAS(message, entry["says"].get<std::string>());
    }
  }
  EXPECT_THROW(decode_image_file(file("no_such_file.png").string()), Error);
}

TEST_F(ImageCodec, ConvertsBetweenGrayAndRgbAsPillowDoes) {
  DecodedImage rgb{1, 3, 3, {255, 0, 0, 0, 255, 0, 10, 20, 30}};
  const DecodedImage gray = rgb_to_gray(rgb);
  // Pillow: Image.new("RGB", ...) of these pixels .convert("L") -> 76, 150, 18.
  EXPECT_EQ(gray.pixels, (std::vector<std::uint8_t>{76, 150, 18}));
  const DecodedImage back = gray_to_rgb(gray);
  EXPECT_EQ(back.channels, 3);
  EXPECT_EQ(back.pixels, (std::vector<std::uint8_t>{76, 76, 76, 150, 150, 150, 18, 18, 18}));
}

}  // namespace
}  // namespace trainyard::testing
