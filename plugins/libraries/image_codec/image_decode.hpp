#pragma once
// Decoding an image file's bytes: JPEG or PNG, told apart by their signatures, into the pixels
// Pillow gives for the same file (Image.open(f).convert(mode)). Damage (a truncated JPEG, a PNG
// chunk with a bad CRC, an empty or foreign file) is refused in one line naming the file, never
// decoded into a partly gray image.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "decoded_image.hpp"

namespace trainyard {

// Throws Error "<source>: <why>" for what it cannot decode whole.
DecodedImage decode_image(std::span<const std::uint8_t> bytes, const std::string& source,
                          ColorMode mode = ColorMode::kAsStored);

// The size and channels of a JPEG or PNG from its header, without decoding the pixels; throws
// as decode_image does for what is not a readable header.
struct ImageHeader {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::int64_t channels = 0;
};
ImageHeader read_image_header(std::span<const std::uint8_t> bytes, const std::string& source);
ImageHeader read_jpeg_header(std::span<const std::uint8_t> bytes, const std::string& source);
ImageHeader read_png_header(std::span<const std::uint8_t> bytes, const std::string& source);

// Reads `path` whole; throws Error naming it when it cannot.
std::vector<std::uint8_t> read_image_bytes(const std::string& path);

// Reads `path` and decodes it, as above.
DecodedImage decode_image_file(const std::string& path, ColorMode mode = ColorMode::kAsStored);

// The JPEG and PNG decoders decode_image dispatches to; each gives the file's own channels (1 or
// 3; a PNG's alpha is composed away as Pillow's convert("RGB") drops it).
DecodedImage decode_jpeg(std::span<const std::uint8_t> bytes, const std::string& source);
DecodedImage decode_png(std::span<const std::uint8_t> bytes, const std::string& source);

// Pillow's conversions between its "L" and "RGB" modes: gray replicated into three channels, and
// ITU-R 601-2 luma (L = R 299/1000 + G 587/1000 + B 114/1000) rounded as Pillow rounds it.
DecodedImage gray_to_rgb(const DecodedImage& gray);
DecodedImage rgb_to_gray(const DecodedImage& rgb);

}  // namespace trainyard
