// PNG through libpng's simplified API: 8-bit grayscale, colour and palette images, with or
// without transparency, into the file's own channels. Alpha is dropped, not composed, as
// Pillow's convert("L") and convert("RGB") drop it. A CRC error or a truncated stream is an error
// (libpng refuses damaged critical chunks).

#include <png.h>

#include <vector>

#include "image_decode.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

// Frees what libpng holds for the image on every way out.
struct ImageReader {
  png_image image{};
  ImageReader() { image.version = PNG_IMAGE_VERSION; }
  ~ImageReader() { png_image_free(&image); }
  ImageReader(const ImageReader&) = delete;
  ImageReader& operator=(const ImageReader&) = delete;
};

// Reads the header into `reader`; refuses what is not an 8-bit PNG.
void begin_png(ImageReader& reader, std::span<const std::uint8_t> bytes,
               const std::string& source) {
  png_image& png = reader.image;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    throw Error(source + ": not a readable PNG: " + png.message);
  }
  if (png.format & PNG_FORMAT_FLAG_LINEAR) {
    // libpng's 16-to-8-bit conversion treats the samples as linear light; Pillow does not.
    throw Error(source + ": a 16-bit PNG; only 8-bit PNGs are read");
  }
}

}  // namespace

ImageHeader read_png_header(std::span<const std::uint8_t> bytes, const std::string& source) {
  ImageReader reader;
  begin_png(reader, bytes, source);
  const png_image& png = reader.image;
  return {png.height, png.width, (png.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1};
}

DecodedImage decode_png(std::span<const std::uint8_t> bytes, const std::string& source) {
  ImageReader reader;
  begin_png(reader, bytes, source);
  png_image& png = reader.image;
  const bool color = (png.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (png.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  png.format = color ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB)
                     : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
  std::vector<std::uint8_t> decoded(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, decoded.data(), 0, nullptr)) {
    throw Error(source + ": damaged PNG: " + png.message);
  }
  DecodedImage image;
  image.height = png.height;
  image.width = png.width;
  image.channels = color ? 3 : 1;
  if (!alpha) {
    image.pixels = std::move(decoded);
    return image;
  }
  const std::size_t stored = static_cast<std::size_t>(image.channels) + 1;
  image.pixels.reserve(decoded.size() / stored * static_cast<std::size_t>(image.channels));
  for (std::size_t i = 0; i < decoded.size(); i += stored) {
    image.pixels.insert(image.pixels.end(), decoded.begin() + static_cast<std::ptrdiff_t>(i),
                        decoded.begin() + static_cast<std::ptrdiff_t>(i) + image.channels);
  }
  return image;
}

}  // namespace trainyard
