#include "image_decode.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <vector>

#include "trainyard/api/error.hpp"
#include "trainyard/api/sample_timing.hpp"

namespace trainyard {
namespace {

constexpr std::array<std::uint8_t, 3> kJpegSignature = {0xFF, 0xD8, 0xFF};
constexpr std::array<std::uint8_t, 8> kPngSignature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

template <std::size_t N>
bool starts_with(std::span<const std::uint8_t> bytes, const std::array<std::uint8_t, N>& prefix) {
  return bytes.size() >= N && std::equal(prefix.begin(), prefix.end(), bytes.begin());
}

}  // namespace

DecodedImage gray_to_rgb(const DecodedImage& gray) {
  DecodedImage rgb{gray.height, gray.width, 3, {}};
  rgb.pixels.reserve(gray.pixels.size() * 3);
  for (std::uint8_t value : gray.pixels) rgb.pixels.insert(rgb.pixels.end(), 3, value);
  return rgb;
}

DecodedImage rgb_to_gray(const DecodedImage& rgb) {
  DecodedImage gray{rgb.height, rgb.width, 1, {}};
  gray.pixels.resize(rgb.pixels.size() / 3);
  for (std::size_t i = 0; i < gray.pixels.size(); ++i) {
    const std::uint8_t* pixel = &rgb.pixels[3 * i];
    // Pillow's L24: the weights in 16-bit fixed point, rounded half up.
    const std::uint32_t luma = pixel[0] * 19595u + pixel[1] * 38470u + pixel[2] * 7471u + 0x8000u;
    gray.pixels[i] = static_cast<std::uint8_t>(luma >> 16);
  }
  return gray;
}

DecodedImage decode_image(std::span<const std::uint8_t> bytes, const std::string& source,
                          ColorMode mode) {
  const SampleTimer timer(SampleStage::kDecode);
  if (bytes.empty()) throw Error(source + ": empty file, not an image");
  DecodedImage image;
  if (starts_with(bytes, kJpegSignature)) {
    image = decode_jpeg(bytes, source);
  } else if (starts_with(bytes, kPngSignature)) {
    image = decode_png(bytes, source);
  } else {
    throw Error(source + ": neither a JPEG nor a PNG file (unknown signature)");
  }
  if (mode == ColorMode::kGray && image.channels == 3) return rgb_to_gray(image);
  if (mode == ColorMode::kRgb && image.channels == 1) return gray_to_rgb(image);
  return image;
}

ImageHeader read_image_header(std::span<const std::uint8_t> bytes, const std::string& source) {
  if (bytes.empty()) throw Error(source + ": empty file, not an image");
  if (starts_with(bytes, kJpegSignature)) return read_jpeg_header(bytes, source);
  if (starts_with(bytes, kPngSignature)) return read_png_header(bytes, source);
  throw Error(source + ": neither a JPEG nor a PNG file (unknown signature)");
}

std::vector<std::uint8_t> read_image_bytes(const std::string& path) {
  const SampleTimer timer(SampleStage::kRead);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(path + ": cannot read the image");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  if (!bytes.empty() && !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()))) {
    throw Error(path + ": cannot read the image");
  }
  return bytes;
}

DecodedImage decode_image_file(const std::string& path, ColorMode mode) {
  return decode_image(read_image_bytes(path), path, mode);
}

}  // namespace trainyard
