#include "image_transforms.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "image_resize.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/sample_timing.hpp"

namespace trainyard {
namespace {

using Size = std::array<std::int64_t, 2>;

// Python's round(): halves go to the even neighbour (the default floating-point rounding mode).
std::int64_t round_half_even(double value) {
  return static_cast<std::int64_t>(std::nearbyint(value));
}

// A [s] or [h, w] size list as height and width.
Size square(const std::vector<std::int64_t>& size) {
  return size.size() == 1 ? Size{size[0], size[0]} : Size{size[0], size[1]};
}

// torchvision's _compute_resized_output_size: [s] sets the shorter side and truncates the
// longer one's s * long / short; [h, w] is taken as it is.
Size resized_size(std::int64_t height, std::int64_t width, const std::vector<std::int64_t>& size) {
  if (size.size() != 1) return square(size);
  const std::int64_t shorter = std::min(height, width);
  const std::int64_t longer = std::max(height, width);
  const auto other = static_cast<std::int64_t>(static_cast<double>(size[0] * longer) /
                                               static_cast<double>(shorter));
  return width <= height ? Size{other, size[0]} : Size{size[0], other};
}

// torchvision's crop: the box may reach outside the image, which reads as zeros there.
DecodedImage crop(const DecodedImage& image, std::int64_t top, std::int64_t left,
                  std::int64_t height, std::int64_t width) {
  const std::int64_t channels = image.channels;
  DecodedImage out{height, width, channels, {}};
  out.pixels.assign(static_cast<std::size_t>(height * width * channels), 0);
  const std::int64_t first_x = std::max<std::int64_t>(0, -left);
  const std::int64_t end_x = std::min(width, image.width - left);
  if (end_x <= first_x) return out;
  const auto row_bytes = static_cast<std::size_t>((end_x - first_x) * channels);
  for (std::int64_t y = std::max<std::int64_t>(0, -top); y < height && top + y < image.height;
       ++y) {
    const std::uint8_t* from =
        image.pixels.data() + ((top + y) * image.width + left + first_x) * channels;
    std::memcpy(out.pixels.data() + (y * width + first_x) * channels, from, row_bytes);
  }
  return out;
}

// torchvision v2's center_crop_image: an axis the crop is larger along is zero-padded by
// (crop - image) // 2 before and the rest after; a smaller one starts at round((image - crop) / 2).
std::int64_t center_crop_start(std::int64_t image_size, std::int64_t crop_size) {
  if (crop_size > image_size) return -((crop_size - image_size) / 2);
  return round_half_even(static_cast<double>(image_size - crop_size) / 2.0);
}

DecodedImage flip_horizontally(const DecodedImage& image) {
  DecodedImage out = image;
  const std::int64_t channels = image.channels;
  for (std::int64_t y = 0; y < image.height; ++y) {
    const std::uint8_t* row = image.pixels.data() + y * image.width * channels;
    std::uint8_t* flipped = out.pixels.data() + y * image.width * channels;
    for (std::int64_t x = 0; x < image.width; ++x) {
      std::memcpy(flipped + (image.width - 1 - x) * channels, row + x * channels,
                  static_cast<std::size_t>(channels));
    }
  }
  return out;
}

// The colour operations below repeat torchvision.transforms.v2.functional's tensor kernels
// operation for operation (the same ATen calls, scalars and order), so that the float rounding,
// and the truncation back to uint8 it leads to, is torchvision's.

// _blend: image * ratio + other * (1 - ratio), clamped and truncated to uint8.
at::Tensor blend(const at::Tensor& image, const at::Tensor& other, double ratio) {
  return image.mul(ratio).add_(other, 1.0 - ratio).clamp_(0, 255).to(at::kByte);
}

// _rgb_to_grayscale_image without preserving the dtype, floored as the uint8 kernels floor it.
at::Tensor floored_gray(const at::Tensor& image) {
  const std::vector<at::Tensor> rgb = image.unbind(-3);
  return rgb[0].mul(0.2989).add_(rgb[1], 0.587).add_(rgb[2], 0.114).unsqueeze(-3).floor_();
}

at::Tensor adjust_brightness(const at::Tensor& image, double factor) {
  return image.mul(factor).clamp_(0, 255).to(at::kByte);
}

// Towards the mean of the grayscale image (of the image itself with one channel).
at::Tensor adjust_contrast(const at::Tensor& image, double factor) {
  const at::Tensor gray = image.size(-3) == 3 ? floored_gray(image) : image.to(at::kFloat);
  return blend(image, gray.mean({-3, -2, -1}, /*keepdim=*/true), factor);
}

// Towards the grayscale image; one channel has no saturation to change (as Pillow has it).
at::Tensor adjust_saturation(const at::Tensor& image, double factor) {
  if (image.size(-3) == 1) return image;
  return blend(image, floored_gray(image), factor);
}

// _rgb_to_hsv on floats in [0, 1] (Pillow's algorithm, hue and saturation 0 where r = g = b).
at::Tensor rgb_to_hsv(const at::Tensor& image) {
  const std::vector<at::Tensor> rgb = image.unbind(-3);
  const auto [minc, maxc] = at::aminmax(image, -3);
  const at::Tensor equal = maxc == minc;
  const at::Tensor range = maxc - minc;
  const at::Tensor ones = at::ones_like(maxc);
  const at::Tensor saturation = range / at::where(equal, ones, maxc);
  const at::Tensor divisor = at::where(equal, ones, range).unsqueeze_(-3);
  // rc, gc and bc are views of one tensor that the hue terms below update in place, in
  // torchvision's order.
  std::vector<at::Tensor> c = ((maxc.unsqueeze(-3) - image) / divisor).unbind(-3);
  at::Tensor max_not_r = maxc != rgb[0];
  at::Tensor max_is_g = maxc == rgb[1];
  const at::Tensor hg = c[0].add(2.0).sub_(c[2]).mul_(max_is_g & max_not_r);
  const at::Tensor hr = c[2].sub_(c[1]).mul_(~max_not_r);
  const at::Tensor hb =
      c[1].add_(4.0).sub_(c[0]).mul_(max_not_r.logical_and_(max_is_g.logical_not_()));
  at::Tensor hue = hr.add_(hg).add_(hb);
  hue = hue.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0);
  return at::stack({hue, saturation, maxc}, -3);
}

at::Tensor hsv_to_rgb(const at::Tensor& image) {
  const std::vector<at::Tensor> hsv = image.unbind(-3);
  const at::Tensor& s = hsv[1];
  const at::Tensor& v = hsv[2];
  at::Tensor h6 = hsv[0].mul(6);
  at::Tensor sector = at::floor(h6);
  const at::Tensor f = h6.sub_(sector);
  sector = sector.to(at::kInt);
  at::Tensor sxf = s * f;
  at::Tensor one_minus_s = 1.0 - s;
  const at::Tensor q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0);
  const at::Tensor t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0);
  const at::Tensor p = one_minus_s.mul_(v).clamp_(0.0, 1.0);
  sector.remainder_(6);
  const at::Tensor vpqt = at::stack({v, p, q, t}, -3);
  // Which of v, p, q, t each of r, g, b takes in each of the six sectors of the hue circle.
  const at::Tensor select =
      at::tensor({0, 2, 1, 1, 3, 0, 3, 0, 0, 2, 1, 1, 1, 1, 3, 0, 0, 2}, at::kLong).view({3, 6});
  return vpqt.gather(-3, select.index({at::indexing::Slice(), sector.to(at::kLong)}));
}

// Rotates the hue circle by `factor` (in turns): to floats in [0, 1], to HSV and back, and to
// uint8 by torchvision's to_dtype (times 255.999, truncated).
at::Tensor adjust_hue(const at::Tensor& image, double factor) {
  if (image.size(-3) == 1) return image;
  const at::Tensor hsv = rgb_to_hsv(image.to(at::kFloat).mul_(1.0 / 255));
  std::vector<at::Tensor> planes = hsv.unbind(-3);
  planes[0].add_(factor).remainder_(1.0);
  return hsv_to_rgb(at::stack(planes, -3)).mul(255.0 + 1.0 - 1e-3).to(at::kByte);
}

// Draws from a 64-bit Mersenne Twister, with the uniform doubles and integers computed here
// rather than by <random>'s distributions, whose algorithms differ between standard libraries:
// a draw seed gives the same sample on every platform.
class DrawSource {
 public:
  explicit DrawSource(std::uint64_t seed) : engine_(seed) {}
  // Uniform in [low, high): the top 53 bits of one output as a fraction.
  double uniform(double low, double high) {
    const double unit = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
    return low + (high - low) * unit;
  }
  // Uniform in [0, count), without modulo bias (outputs below 2^64 mod count are redrawn).
  std::int64_t below(std::int64_t count) {
    const auto n = static_cast<std::uint64_t>(count);
    const std::uint64_t threshold = (0 - n) % n;
    for (;;) {
      const std::uint64_t value = engine_();
      if (value >= threshold) return static_cast<std::int64_t>(value % n);
    }
  }

 private:
  std::mt19937_64 engine_;
};

// RandomResizedCrop.get_params' fallback: the central box of the whole image clamped to the
// ratio range (at least one pixel each way).
void fallback_crop(const std::array<double, 2>& ratio, std::int64_t height, std::int64_t width,
                   ImageDraw& out) {
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  const double low = std::min(ratio[0], ratio[1]);
  const double high = std::max(ratio[0], ratio[1]);
  std::int64_t w = width;
  std::int64_t h = height;
  if (in_ratio < low) {
    h = std::max<std::int64_t>(1, round_half_even(static_cast<double>(w) / low));
  } else if (in_ratio > high) {
    w = std::max<std::int64_t>(1, round_half_even(static_cast<double>(h) * high));
  }
  out.crop_top = (height - h) / 2;
  out.crop_left = (width - w) / 2;
  out.crop_height = h;
  out.crop_width = w;
}

// RandomResizedCrop.get_params: ten tries at an area and a log-uniform ratio that fit.
void draw_crop(DrawSource& source, const ImageTransformSpec& spec, std::int64_t height,
               std::int64_t width, ImageDraw& out) {
  const double area = static_cast<double>(height * width);
  const double log_low = std::log(spec.crop_ratio[0]);
  const double log_high = std::log(spec.crop_ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * source.uniform(spec.crop_scale[0], spec.crop_scale[1]);
    const double aspect_ratio = std::exp(source.uniform(log_low, log_high));
    const std::int64_t w = round_half_even(std::sqrt(target_area * aspect_ratio));
    const std::int64_t h = round_half_even(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      out.crop_top = source.below(height - h + 1);
      out.crop_left = source.below(width - w + 1);
      out.crop_height = h;
      out.crop_width = w;
      return;
    }
  }
  fallback_crop(spec.crop_ratio, height, width, out);
}

// ColorJitter.make_params: a random order of the four operations (Fisher-Yates), then a factor
// for each enabled one, uniform in [max(0, 1 - x), 1 + x] (hue: [-x, x]).
void draw_jitter(DrawSource& source, const ImageTransformSpec& spec, ImageDraw& out) {
  for (int i = 3; i > 0; --i) std::swap(out.jitter_order[i], out.jitter_order[source.below(i + 1)]);
  const auto factor = [&](double amount) {
    return source.uniform(std::max(0.0, 1.0 - amount), 1.0 + amount);
  };
  if (spec.brightness > 0) out.brightness_factor = factor(spec.brightness);
  if (spec.contrast > 0) out.contrast_factor = factor(spec.contrast);
  if (spec.saturation > 0) out.saturation_factor = factor(spec.saturation);
  if (spec.hue > 0) out.hue_factor = source.uniform(-spec.hue, spec.hue);
}

bool jitters(const ImageTransformSpec& spec) {
  return spec.brightness > 0 || spec.contrast > 0 || spec.saturation > 0 || spec.hue > 0;
}

void check_size(const std::vector<std::int64_t>& size, const char* name) {
  const bool counted = size.empty() || size.size() == 1 || size.size() == 2;
  if (!counted || std::any_of(size.begin(), size.end(), [](std::int64_t s) { return s < 1; })) {
    throw Error(std::string("image transforms: ") + name +
                " must be [size] or [height, width] of positive numbers");
  }
}

// The checks a spec made in code needs as much as one read from a recipe.
void check_spec(const ImageTransformSpec& spec, std::int64_t channels) {
  if (channels != 1 && channels != 3) {
    throw Error("image transforms: images must have 1 or 3 channels, got " +
                std::to_string(channels));
  }
  check_size(spec.resize, "resize");
  check_size(spec.center_crop, "center_crop");
  check_size(spec.random_resized_crop, "random_resized_crop");
  check_size(spec.final_resize, "final_resize");
  const auto fits = [&](std::size_t n) {
    return n == 1 || n == static_cast<std::size_t>(channels);
  };
  if (spec.mean.size() != spec.std.size() || (!spec.mean.empty() && !fits(spec.mean.size()))) {
    throw Error("image transforms: mean and std must both have 1 or " + std::to_string(channels) +
                " values (one per channel), got " + std::to_string(spec.mean.size()) + " and " +
                std::to_string(spec.std.size()));
  }
  for (double s : spec.std) {
    if (!(s > 0)) throw Error("image transforms: std values must be > 0");
  }
}

// Normalize's mean or std as float32 [n, 1, 1], n broadcasting over the channels when 1.
at::Tensor per_channel(const std::vector<double>& values) {
  std::vector<float> narrowed(values.begin(), values.end());
  return at::tensor(narrowed, at::kFloat).view({-1, 1, 1});
}

// The [C, H, W] view torchvision has of a PIL image (channels interleaved in memory).
at::Tensor chw_view(const DecodedImage& image) {
  return at::from_blob(const_cast<std::uint8_t*>(image.pixels.data()),
                       {image.height, image.width, image.channels}, at::kByte)
      .permute({2, 0, 1});
}

// A size option: [s] or [h, w] (each >= 1, as declared), or empty.
std::vector<std::int64_t> read_size(const Config& config, const std::string& key) {
  std::vector<std::int64_t> size = config.get_int_list(key);
  if (size.size() > 2) {
    config.fail(
        key, "must be [size] or [height, width], got " + std::to_string(size.size()) + " numbers");
  }
  return size;
}

// A [low, high] range option (each > 0, as declared).
std::array<double, 2> read_range(const Config& config, const std::string& key) {
  const std::vector<double> range = config.get_float_list(key);
  if (range.size() != 2) {
    config.fail(key, "must be [low, high], got " + std::to_string(range.size()) + " numbers");
  }
  if (range[0] > range[1]) {
    config.fail(key, "must be [low, high] with low <= high, got [" + std::to_string(range[0]) +
                         ", " + std::to_string(range[1]) + "]");
  }
  return {range[0], range[1]};
}

void read_normalize(const Config& config, ImageTransformSpec& spec) {
  spec.mean = config.get_float_list("mean");
  spec.std = config.get_float_list("std");
  if (spec.std.empty() && !spec.mean.empty()) config.fail("mean", "is given without std");
  if (spec.mean.empty() && !spec.std.empty()) config.fail("std", "is given without mean");
  if (spec.mean.size() != spec.std.size()) {
    config.fail("std", "must have as many values as mean (" + std::to_string(spec.mean.size()) +
                           "), got " + std::to_string(spec.std.size()));
  }
}

}  // namespace

OptionSpecs image_transform_options() {
  using Ints = std::vector<std::int64_t>;
  using Floats = std::vector<double>;
  return {
      option("resize", Ints{},
             "[s]: the shorter side to s, keeping the aspect ratio; [h, w]: exactly that size "
             "(antialiased bilinear, as torchvision's Resize)")
          .at_least(1),
      option("center_crop", Ints{},
             "[s] or [h, w]: the central box of that size, zero-padded where the image is smaller "
             "(CenterCrop)")
          .at_least(1),
      option("random_resized_crop", Ints{},
             "[s] or [h, w]: a random box of the image resized to that size (RandomResizedCrop); "
             "evaluation without transforms of its own resizes the whole image instead")
          .at_least(1),
      option("crop_scale", Floats{0.08, 1.0},
             "[low, high]: the random box's area as a fraction of the image's")
          .greater_than(0),
      option("crop_ratio", Floats{3.0 / 4.0, 4.0 / 3.0},
             "[low, high]: the random box's aspect ratio (width / height), drawn log-uniformly")
          .greater_than(0),
      option("horizontal_flip", 0.0, "the probability of a horizontal flip").at_least(0).at_most(1),
      option("brightness", 0.0, "ColorJitter: a brightness factor in [max(0, 1 - b), 1 + b]")
          .at_least(0),
      option("contrast", 0.0, "ColorJitter: a contrast factor in [max(0, 1 - c), 1 + c]")
          .at_least(0),
      option("saturation", 0.0, "ColorJitter: a saturation factor in [max(0, 1 - s), 1 + s]")
          .at_least(0),
      option("hue", 0.0, "ColorJitter: a hue shift in [-h, h] turns of the colour circle")
          .at_least(0)
          .at_most(0.5),
      option("mean", Floats{},
             "Normalize: the per-channel mean of pixels scaled to [0, 1] (one value: every "
             "channel); with std"),
      option("std", Floats{}, "Normalize: the per-channel standard deviation; with mean")
          .greater_than(0),
      option("channels_last", false, "batches in channels-last memory format"),
  };
}

ImageTransformSpec read_image_transforms(const Config& table) {
  const Config config = validate_section(table, image_transform_options(), {});
  ImageTransformSpec spec;
  spec.resize = read_size(config, "resize");
  spec.center_crop = read_size(config, "center_crop");
  spec.random_resized_crop = read_size(config, "random_resized_crop");
  spec.crop_scale = read_range(config, "crop_scale");
  spec.crop_ratio = read_range(config, "crop_ratio");
  spec.horizontal_flip = config.get_float("horizontal_flip");
  spec.brightness = config.get_float("brightness");
  spec.contrast = config.get_float("contrast");
  spec.saturation = config.get_float("saturation");
  spec.hue = config.get_float("hue");
  read_normalize(config, spec);
  spec.channels_last = config.get_bool("channels_last");
  return spec;
}

bool ImageTransformSpec::random() const {
  return !random_resized_crop.empty() || horizontal_flip > 0 || jitters(*this);
}

ImageTransformSpec without_random_steps(const ImageTransformSpec& spec) {
  ImageTransformSpec fixed = spec;
  if (!fixed.random_resized_crop.empty()) {
    if (fixed.final_resize.empty()) {
      const Size size = square(fixed.random_resized_crop);
      fixed.final_resize = {size[0], size[1]};
    }
    fixed.random_resized_crop.clear();
  }
  fixed.horizontal_flip = 0;
  fixed.brightness = fixed.contrast = fixed.saturation = fixed.hue = 0;
  return fixed;
}

ImageTransforms::ImageTransforms(ImageTransformSpec spec, std::int64_t channels)
    : spec_(std::move(spec)), channels_(channels) {
  check_spec(spec_, channels_);
  if (!spec_.mean.empty()) {
    mean_ = per_channel(spec_.mean);
    std_ = per_channel(spec_.std);
  }
}

Size ImageTransforms::size_before_random_crop(std::int64_t height, std::int64_t width) const {
  Size size{height, width};
  if (!spec_.resize.empty()) size = resized_size(height, width, spec_.resize);
  if (!spec_.center_crop.empty()) size = square(spec_.center_crop);
  return size;
}

ImageDraw ImageTransforms::draw(std::uint64_t draw_seed, std::int64_t height,
                                std::int64_t width) const {
  if (height < 1 || width < 1) {
    throw Error("image transforms: cannot draw for a " + std::to_string(height) + " x " +
                std::to_string(width) + " image");
  }
  // One engine, drawn from in a fixed order: the crop, the flip, the jitter. A step that is off
  // draws nothing, so each step's outcome depends on the seed and the steps before it.
  DrawSource source(draw_seed);
  ImageDraw out;
  if (!spec_.random_resized_crop.empty()) draw_crop(source, spec_, height, width, out);
  if (spec_.horizontal_flip > 0) out.flip = source.uniform(0, 1) < spec_.horizontal_flip;
  if (jitters(spec_)) draw_jitter(source, spec_, out);
  return out;
}

at::Tensor ImageTransforms::apply(const DecodedImage& image, std::uint64_t draw_seed) const {
  SampleTimer timer(SampleStage::kTransform);
  const Size size = size_before_random_crop(image.height, image.width);
  return scaled(shaped_pixels(image, draw(draw_seed, size[0], size[1])));
}

at::Tensor ImageTransforms::apply(const DecodedImage& image, const ImageDraw& draw) const {
  SampleTimer timer(SampleStage::kTransform);
  return scaled(shaped_pixels(image, draw));
}

at::Tensor ImageTransforms::pixels(const DecodedImage& image, std::uint64_t draw_seed) const {
  SampleTimer timer(SampleStage::kTransform);
  const Size size = size_before_random_crop(image.height, image.width);
  return shaped_pixels(image, draw(draw_seed, size[0], size[1]));
}

at::Tensor ImageTransforms::to_input(const at::Tensor& pixels) const {
  SampleTimer timer(SampleStage::kTransform);
  return scaled(pixels);
}

at::Tensor ImageTransforms::shaped_pixels(const DecodedImage& image, const ImageDraw& draw) const {
  if (image.channels != channels_) {
    throw Error("image transforms: expected images with " + std::to_string(channels_) +
                " channels, got " + std::to_string(image.channels));
  }
  DecodedImage held;
  const DecodedImage& shaped = geometry(image, draw, held);
  // A copy of its own: the view may be of `held`, which goes with this call.
  return jitter(chw_view(shaped), draw).clone(at::MemoryFormat::Contiguous);
}

at::Tensor ImageTransforms::scaled(const at::Tensor& pixels) const {
  // torchvision's to_dtype(float32, scale=True) (times 1 / 255), then Normalize.
  at::Tensor out = pixels.to(at::kFloat).mul_(1.0 / 255);
  if (mean_.defined()) out.sub_(mean_).div_(std_);
  return out;
}

const DecodedImage& ImageTransforms::geometry(const DecodedImage& image, const ImageDraw& draw,
                                              DecodedImage& held) const {
  const DecodedImage* current = &image;
  const auto replace = [&](DecodedImage next) {
    held = std::move(next);
    current = &held;
  };
  const auto resize_to = [&](const Size& size) {
    if (size[0] != current->height || size[1] != current->width) {
      replace(resize_image(*current, size[0], size[1]));
    }
  };
  if (!spec_.resize.empty()) resize_to(resized_size(image.height, image.width, spec_.resize));
  if (!spec_.center_crop.empty()) {
    const Size size = square(spec_.center_crop);
    if (size[0] != current->height || size[1] != current->width) {
      replace(crop(*current, center_crop_start(current->height, size[0]),
                   center_crop_start(current->width, size[1]), size[0], size[1]));
    }
  }
  if (!spec_.random_resized_crop.empty()) {
    if (draw.crop_height < 1 || draw.crop_width < 1) {
      throw Error("image transforms: the random-resized crop's box is empty");
    }
    replace(crop(*current, draw.crop_top, draw.crop_left, draw.crop_height, draw.crop_width));
    resize_to(square(spec_.random_resized_crop));
  }
  if (!spec_.final_resize.empty()) resize_to(square(spec_.final_resize));
  if (draw.flip) replace(flip_horizontally(*current));
  return *current;
}

at::Tensor ImageTransforms::jitter(at::Tensor pixels, const ImageDraw& draw) const {
  for (int step : draw.jitter_order) {
    if (step == 0 && spec_.brightness > 0) {
      pixels = adjust_brightness(pixels, draw.brightness_factor);
    } else if (step == 1 && spec_.contrast > 0) {
      pixels = adjust_contrast(pixels, draw.contrast_factor);
    } else if (step == 2 && spec_.saturation > 0) {
      pixels = adjust_saturation(pixels, draw.saturation_factor);
    } else if (step == 3 && spec_.hue > 0) {
      pixels = adjust_hue(pixels, draw.hue_factor);
    }
  }
  return pixels;
}

std::vector<std::int64_t> ImageTransforms::output_shape() const {
  std::vector<std::int64_t> size;
  if (spec_.resize.size() == 2) size = spec_.resize;
  if (!spec_.center_crop.empty()) size = spec_.center_crop;
  if (!spec_.random_resized_crop.empty()) size = spec_.random_resized_crop;
  if (!spec_.final_resize.empty()) size = spec_.final_resize;
  if (size.empty()) return {};
  const Size fixed = square(size);
  return {channels_, fixed[0], fixed[1]};
}

ImageTransformSpec read_test_transforms(const Config& table, const ImageTransformSpec& train) {
  if (table.table().empty()) return without_random_steps(train);
  return read_image_transforms(table);
}

void check_sample_shape(const at::Tensor& sample, const std::vector<std::int64_t>& shape,
                        const std::string& source) {
  if (sample.sizes() == at::IntArrayRef(shape)) return;
  auto text = [](at::IntArrayRef extents) {
    std::string out = "[";
    for (std::size_t i = 0; i < extents.size(); ++i) {
      out += (i ? ", " : "") + std::to_string(extents[i]);
    }
    return out + "]";
  };
  throw Error(source + ": the image makes a sample of " + text(sample.sizes()) +
              " where the split's first makes " + text(shape) +
              "; give dataset.transforms a two-number resize or a crop so every sample has one "
              "size");
}

at::Tensor collate_images(const std::vector<at::Tensor>& images, bool channels_last) {
  SampleTimer timer(SampleStage::kCollate);
  if (images.empty()) throw Error("collate_images: no images");
  if (images.front().dim() != 3) throw Error("collate_images: images must be [C, H, W]");
  for (const at::Tensor& image : images) {
    if (image.sizes() != images.front().sizes()) {
      throw Error("collate_images: images of different sizes in one batch (" +
                  std::to_string(image.size(-2)) + " x " + std::to_string(image.size(-1)) +
                  " and " + std::to_string(images.front().size(-2)) + " x " +
                  std::to_string(images.front().size(-1)) +
                  "); give the transforms a crop or a [height, width] resize");
    }
  }
  std::vector<std::int64_t> shape{static_cast<std::int64_t>(images.size())};
  shape.insert(shape.end(), images.front().sizes().begin(), images.front().sizes().end());
  at::Tensor batch = at::empty(
      shape, images.front().options().memory_format(channels_last ? at::MemoryFormat::ChannelsLast
                                                                  : at::MemoryFormat::Contiguous));
  for (std::size_t i = 0; i < images.size(); ++i) {
    batch[static_cast<std::int64_t>(i)].copy_(images[i]);
  }
  return batch;
}

}  // namespace trainyard
