#include "image_resize.hpp"

#include <ATen/ATen.h>

#include <cstring>

#include "trainyard/api/error.hpp"

namespace trainyard {

DecodedImage resize_image(const DecodedImage& image, std::int64_t height, std::int64_t width) {
  if (height < 1 || width < 1) {
    throw Error("resize: the size must be at least 1 x 1, got " + std::to_string(height) + " x " +
                std::to_string(width));
  }
  if (height == image.height && width == image.width) return image;
  const std::int64_t channels = image.channels;
  // A [1, C, H, W] view of the rows of interleaved channels: channels-last, strided as
  // torchvision strides a single image so that the kernel keeps that layout.
  const at::Tensor pixels = at::from_blob(const_cast<std::uint8_t*>(image.pixels.data()),
                                          {image.height, image.width, channels}, at::kByte);
  const at::Tensor input = pixels.as_strided(
      {1, channels, image.height, image.width},
      {image.height * image.width * channels, 1, image.width * channels, channels});
  const at::Tensor resized =
      at::_upsample_bilinear2d_aa(input, {height, width}, /*align_corners=*/false);
  const at::Tensor rows = resized[0].permute({1, 2, 0}).contiguous();
  DecodedImage out{height, width, channels, {}};
  out.pixels.resize(static_cast<std::size_t>(rows.numel()));
  std::memcpy(out.pixels.data(), rows.data_ptr<std::uint8_t>(), out.pixels.size());
  return out;
}

}  // namespace trainyard
