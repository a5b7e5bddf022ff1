#pragma once
// Resizing decoded pixels as torchvision's Resize(size, antialias=True) resizes an image tensor
// made from a PIL image (bilinear, antialiased when shrinking, half-pixel centres): LibTorch's
// own antialiased bilinear kernel on the same 8-bit, channels-last layout, so the pixels are
// torchvision's.

#include <cstdint>

#include "decoded_image.hpp"

namespace trainyard {

// `image` at `height` x `width` (each >= 1); the same image when the size is already that.
DecodedImage resize_image(const DecodedImage& image, std::int64_t height, std::int64_t width);

}  // namespace trainyard
