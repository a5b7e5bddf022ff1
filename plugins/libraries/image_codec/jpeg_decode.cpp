// JPEG through libjpeg-turbo's TurboJPEG API, with the settings Pillow's decoder leaves at
// libjpeg's defaults: the accurate integer IDCT and smooth ("fancy") chroma upsampling, so the
// pixels are Pillow's. A warning (a truncated file, corrupt data libjpeg would paper over with
// gray) stops the decode.

#include <turbojpeg.h>

#include <memory>

#include "image_decode.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

struct HandleCloser {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using Decompressor = std::unique_ptr<void, HandleCloser>;

// The header through `handle`: size and channels, CMYK refused.
ImageHeader header_of(void* handle, std::span<const std::uint8_t> bytes, const std::string& source) {
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(handle, bytes.data(), static_cast<unsigned long>(bytes.size()), &width,
                          &height, &subsampling, &colorspace) != 0) {
    throw Error(source + ": not a readable JPEG: " + tjGetErrorStr2(handle));
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    throw Error(source + ": a CMYK JPEG; only grayscale and colour (YCbCr, RGB) JPEGs are read");
  }
  return {height, width, colorspace == TJCS_GRAY ? 1 : 3};
}

Decompressor decompressor(const std::string& source) {
  Decompressor handle(tjInitDecompress());
  if (!handle) throw Error(source + ": cannot start the JPEG decoder: " + tjGetErrorStr2(nullptr));
  return handle;
}

}  // namespace

ImageHeader read_jpeg_header(std::span<const std::uint8_t> bytes, const std::string& source) {
  return header_of(decompressor(source).get(), bytes, source);
}

DecodedImage decode_jpeg(std::span<const std::uint8_t> bytes, const std::string& source) {
  Decompressor handle = decompressor(source);
  const ImageHeader header = header_of(handle.get(), bytes, source);
  const int width = static_cast<int>(header.width);
  const int height = static_cast<int>(header.height);
  DecodedImage image;
  image.height = header.height;
  image.width = header.width;
  image.channels = header.channels;
  image.pixels.resize(static_cast<std::size_t>(image.height * image.width * image.channels));
  const int format = image.channels == 1 ? TJPF_GRAY : TJPF_RGB;
  if (tjDecompress2(handle.get(), bytes.data(), static_cast<unsigned long>(bytes.size()),
                    image.pixels.data(), width, 0, height, format,
                    TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING) != 0) {
    throw Error(source + ": damaged JPEG: " + tjGetErrorStr2(handle.get()));
  }
  return image;
}

}  // namespace trainyard
