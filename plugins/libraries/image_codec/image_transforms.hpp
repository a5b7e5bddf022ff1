#pragma once
// The augmentations of a recipe's [dataset.transforms], applied to decoded pixels in torchvision's
// order and arithmetic: resize (antialiased bilinear), center crop, random-resized crop,
// horizontal flip, color jitter, then scaling to [0, 1], normalize, and channels-last. Every
// random choice comes from one sample's draw seed (SampleDraws::for_sample), so a sample is the
// same whichever worker, rank or resumed run makes it.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "decoded_image.hpp"
#include "trainyard/api/config.hpp"

namespace trainyard {

// What [dataset.transforms] asks for; an empty size list leaves that step out.
struct ImageTransformSpec {
  // [s]: the shorter side to s, keeping the aspect ratio (torchvision's Resize(int)); [h, w].
  std::vector<std::int64_t> resize;
  // [s] or [h, w]: torchvision's CenterCrop (padding with zeros where the image is smaller).
  std::vector<std::int64_t> center_crop;
  // [s] or [h, w]: torchvision's RandomResizedCrop with `crop_scale` and `crop_ratio`.
  std::vector<std::int64_t> random_resized_crop;
  std::array<double, 2> crop_scale{0.08, 1.0};
  std::array<double, 2> crop_ratio{3.0 / 4.0, 4.0 / 3.0};
  // [h, w]: a resize after the crops, exactly to that size. Not a recipe key: what
  // without_random_steps makes of a random-resized crop (the whole image resized to its size).
  std::vector<std::int64_t> final_resize;
  // Probability of a horizontal flip (RandomHorizontalFlip(p)); 0: never.
  double horizontal_flip = 0;
  // torchvision's ColorJitter(brightness, contrast, saturation, hue); all 0: none.
  double brightness = 0;
  double contrast = 0;
  double saturation = 0;
  double hue = 0;
  // Per-channel mean and std of Normalize, after scaling to [0, 1]; empty: no Normalize.
  std::vector<double> mean;
  std::vector<double> std;
  // Batches in channels-last memory format (the layout convolutions prefer on most devices).
  bool channels_last = false;

  bool random() const;
};

// The keys [dataset.transforms] accepts, for validate_section.
OptionSpecs image_transform_options();
// A validated [dataset.transforms] table; throws Error naming the key for what cannot work
// (a size with three numbers, a mean without a std, a scale range upside down).
ImageTransformSpec read_image_transforms(const Config& table);
// What an evaluation split runs when the recipe gives no transforms for it: the same steps
// without chance (a random-resized crop becomes a resize to its size; no flip, no jitter).
ImageTransformSpec without_random_steps(const ImageTransformSpec& spec);
// An evaluation split's transforms: a validated [dataset.test_transforms] table, or when it is
// empty the training ones without chance (without_random_steps).
ImageTransformSpec read_test_transforms(const Config& table, const ImageTransformSpec& train);

// Throws Error "<source>: the image makes a sample of [C, H, W] where the split's first makes
// ..." unless `sample` has `shape` (the same size for every sample, so that they collate).
void check_sample_shape(const at::Tensor& sample, const std::vector<std::int64_t>& shape,
                        const std::string& source);

// The outcome of one sample's random draws, for an image of a given size.
struct ImageDraw {
  // The random-resized crop's box on the (resized, center-cropped) image.
  std::int64_t crop_top = 0;
  std::int64_t crop_left = 0;
  std::int64_t crop_height = 0;
  std::int64_t crop_width = 0;
  bool flip = false;
  // ColorJitter's order (0 brightness, 1 contrast, 2 saturation, 3 hue) and factors.
  std::array<int, 4> jitter_order{0, 1, 2, 3};
  double brightness_factor = 1;
  double contrast_factor = 1;
  double saturation_factor = 1;
  double hue_factor = 0;
};

class ImageTransforms {
 public:
  // `channels`: 1 or 3, the channels every decoded image has.
  ImageTransforms(ImageTransformSpec spec, std::int64_t channels);

  // The draws for an image of height x width (after resize and center crop) from `draw_seed`,
  // made as torchvision makes them (RandomResizedCrop.get_params' ten tries then its fallback;
  // a flip with probability p; ColorJitter's permutation and uniform factors), from a 64-bit
  // Mersenne Twister seeded with draw_seed.
  ImageDraw draw(std::uint64_t draw_seed, std::int64_t height, std::int64_t width) const;
  // The sample: float32 [C, H, W] (contiguous).
  at::Tensor apply(const DecodedImage& image, std::uint64_t draw_seed) const;
  at::Tensor apply(const DecodedImage& image, const ImageDraw& draw) const;
  // apply() in two halves, so that a batch is scaled and normalized at once: the sample's 8-bit
  // pixels after the geometric steps and the jitter, uint8 [C, H, W] (contiguous); and pixels
  // of any leading shape [..., C, H, W] scaled to [0, 1] and normalized, as float32 in their
  // memory format. Element by element the same arithmetic as apply(), so the same bits.
  at::Tensor pixels(const DecodedImage& image, std::uint64_t draw_seed) const;
  at::Tensor to_input(const at::Tensor& pixels) const;
  // The [C, H, W] every output has when that is fixed by the steps (a crop or a 2-number resize),
  // or empty when it follows the input image's size.
  std::vector<std::int64_t> output_shape() const;
  const ImageTransformSpec& spec() const { return spec_; }
  // The height and width draw() is asked about for an image of height x width: its size after
  // the resize and the center crop.
  std::array<std::int64_t, 2> size_before_random_crop(std::int64_t height,
                                                      std::int64_t width) const;

 private:
  // pixels() and to_input() without their timers.
  at::Tensor shaped_pixels(const DecodedImage& image, const ImageDraw& draw) const;
  at::Tensor scaled(const at::Tensor& pixels) const;
  // The geometric steps (resize, crops, flip) on 8-bit pixels: `image` itself when none changes
  // it, else the result, kept in `held`.
  const DecodedImage& geometry(const DecodedImage& image, const ImageDraw& draw,
                               DecodedImage& held) const;
  // The enabled ColorJitter operations in the draw's order, on uint8 [C, H, W].
  at::Tensor jitter(at::Tensor pixels, const ImageDraw& draw) const;

  ImageTransformSpec spec_;
  std::int64_t channels_;
  at::Tensor mean_;  // float32 [C, 1, 1] (or [1, 1, 1] for every channel), or undefined
  at::Tensor std_;
};

// Stacks samples' images (pixels() or apply() results) into a batch [N, C, H, W] of their dtype,
// channels-last when `channels_last`; timed as collate.
at::Tensor collate_images(const std::vector<at::Tensor>& images, bool channels_last);

}  // namespace trainyard
