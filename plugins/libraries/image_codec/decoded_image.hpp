#pragma once
// An image as 8-bit pixels, rows of interleaved channels (height x width x channels), as Pillow's
// and torchvision's decoders hand them over.

#include <cstdint>
#include <vector>

namespace trainyard {

// The channels a caller wants: what the file stores (1 for grayscale, 3 for colour), or one of
// the two whatever the file stores (Pillow's convert("L") / convert("RGB")).
enum class ColorMode { kAsStored, kGray, kRgb };

struct DecodedImage {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::int64_t channels = 0;  // 1 or 3
  std::vector<std::uint8_t> pixels;
};

}  // namespace trainyard
