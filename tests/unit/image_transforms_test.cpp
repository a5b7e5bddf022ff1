// The image transforms against torchvision.transforms.v2.functional on the uint8 tensor of the
// same PIL image: resize ([s] and [h, w], down and up), center crop (odd margins, larger than the
// image), resized crop (a box partly outside the image included), horizontal flip, each
// ColorJitter operation at factors below and above 1 (colour and grayscale), Normalize, and every
// step chained with a jitter order other than the identity. The files and references are made at
// test time by image_codec/make_transform_references.py. Then the draws: one seed, one draw;
// crops inside the image with their area and ratio in range; the flip rate; the fallback crop;
// and the refusals of [dataset.transforms] that cannot work.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "image_decode.hpp"
#include "image_transforms.hpp"
#include "test_support.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/sample_timing.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

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
    const fs::path script = source_dir() / "tests/unit/image_codec/make_transform_references.py";
    const CommandResult result =
        run_command({python.string(), script.string(), refs->folder.path().string()}, {}, 300);
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

ImageTransformSpec spec_from(const Json& json) {
  using Ints = std::vector<std::int64_t>;
  ImageTransformSpec spec;
  spec.resize = json.value("resize", Ints{});
  spec.center_crop = json.value("center_crop", Ints{});
  spec.random_resized_crop = json.value("random_resized_crop", Ints{});
  spec.brightness = json.value("brightness", 0.0);
  spec.contrast = json.value("contrast", 0.0);
  spec.saturation = json.value("saturation", 0.0);
  spec.hue = json.value("hue", 0.0);
  spec.mean = json.value("mean", std::vector<double>{});
  spec.std = json.value("std", std::vector<double>{});
  return spec;
}

ImageDraw draw_from(const Json& json) {
  ImageDraw draw;
  draw.crop_top = json.value("crop_top", std::int64_t{0});
  draw.crop_left = json.value("crop_left", std::int64_t{0});
  draw.crop_height = json.value("crop_height", std::int64_t{0});
  draw.crop_width = json.value("crop_width", std::int64_t{0});
  draw.flip = json.value("flip", false);
  draw.jitter_order = json.value("jitter_order", std::array<int, 4>{0, 1, 2, 3});
  draw.brightness_factor = json.value("brightness_factor", 1.0);
  draw.contrast_factor = json.value("contrast_factor", 1.0);
  draw.saturation_factor = json.value("saturation_factor", 1.0);
  draw.hue_factor = json.value("hue_factor", 0.0);
  return draw;
}

at::Tensor read_floats(const fs::path& file, const std::vector<std::int64_t>& shape) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>()};
  at::Tensor values = at::empty(shape, at::kFloat);
  EXPECT_EQ(bytes.size(), static_cast<std::size_t>(values.nbytes())) << file;
  std::memcpy(values.data_ptr<float>(), bytes.data(), std::min(bytes.size(), values.nbytes()));
  return values;
}

class ImageTransformsTorchvision : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(references().error.empty()) << references().error;
    // Reductions (contrast's mean) split over threads as torchvision's did.
    at::set_num_threads(references().manifest["threads"].get<int>());
  }
  static DecodedImage image(const std::string& name) {
    return decode_image_file((references().folder / name).string());
  }
};

TEST_F(ImageTransformsTorchvision, EveryStepAndChainIsTorchvisions) {
  const Json& cases = references().manifest["cases"];
  ASSERT_EQ(cases.size(), 36u);
  for (const Json& entry : cases) {
    const std::string name = entry["name"];
    const DecodedImage decoded = image(entry["file"]);
    const ImageTransforms transforms(spec_from(entry["spec"]), decoded.channels);
    const at::Tensor ours = transforms.apply(decoded, draw_from(entry["draw"]));
    const at::Tensor theirs = read_floats(references().folder / entry["output"].get<std::string>(),
                                          entry["shape"].get<std::vector<std::int64_t>>());
    ASSERT_EQ(ours.sizes(), theirs.sizes()) << name;
    EXPECT_TRUE(ours.is_contiguous()) << name;
    // Every operation is the same LibTorch kernel, or the same sequence of ATen calls, on
    // tensors of the same layout that torchvision calls (the antialiased resize, the crops and
    // flip copy bytes; the jitter's float arithmetic and truncation to uint8, to_dtype's times
    // 1 / 255, Normalize's sub and div in float32): the same bits, uint8 steps and floats alike.
    const double gap = (ours - theirs).abs().max().item<double>();
    EXPECT_TRUE(at::equal(ours, theirs)) << name << ": differs by up to " << gap << " ("
                                         << gap * 255 << " levels where not normalized)";
  }
}

TEST_F(ImageTransformsTorchvision, ApplyingASeedAppliesItsDraw) {
  ImageTransformSpec spec;
  spec.resize = {50};
  spec.center_crop = {48, 60};
  spec.random_resized_crop = {32};
  spec.horizontal_flip = 0.5;
  spec.brightness = spec.contrast = spec.saturation = 0.4;
  spec.hue = 0.1;
  const DecodedImage photo = image("photo.png");
  const ImageTransforms transforms(spec, 3);
  EXPECT_EQ(transforms.size_before_random_crop(60, 80), (std::array<std::int64_t, 2>{48, 60}));
  for (std::uint64_t seed : {0u, 1u, 77u}) {
    const ImageDraw draw = transforms.draw(seed, 48, 60);
    EXPECT_TRUE(at::equal(transforms.apply(photo, seed), transforms.apply(photo, draw))) << seed;
  }
  EXPECT_EQ(transforms.output_shape(), (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_EQ(transforms.apply(photo, 5).sizes(), at::IntArrayRef({3, 32, 32}));
}

TEST_F(ImageTransformsTorchvision, WithoutRandomStepsResizesTheWholeImage) {
  ImageTransformSpec spec;
  spec.resize = {40};
  spec.center_crop = {36};
  spec.random_resized_crop = {24, 20};
  spec.horizontal_flip = 0.5;
  spec.brightness = spec.contrast = spec.saturation = spec.hue = 0.3;
  spec.mean = {0.5};
  spec.std = {0.25};
  const ImageTransformSpec fixed = without_random_steps(spec);
  EXPECT_TRUE(spec.random());
  EXPECT_FALSE(fixed.random());
  EXPECT_TRUE(fixed.random_resized_crop.empty());
  EXPECT_EQ(fixed.final_resize, (std::vector<std::int64_t>{24, 20}));
  EXPECT_EQ(fixed.resize, spec.resize);
  EXPECT_EQ(fixed.center_crop, spec.center_crop);
  EXPECT_EQ(fixed.mean, spec.mean);
  EXPECT_EQ(ImageTransforms(fixed, 1).output_shape(), (std::vector<std::int64_t>{1, 24, 20}));
  // The same pixels as the random-resized crop of the whole (resized, center-cropped) image.
  ImageTransformSpec whole = spec;
  whole.horizontal_flip = 0;
  whole.brightness = whole.contrast = whole.saturation = whole.hue = 0;
  ImageDraw box;
  box.crop_height = box.crop_width = 36;
  const DecodedImage gray = image("gray.png");
  EXPECT_TRUE(at::equal(ImageTransforms(fixed, 1).apply(gray, 3),
                        ImageTransforms(whole, 1).apply(gray, box)));
}

TEST(ImageTransformsSteps, OutputShapeIsKnownWhenTheLastSpatialStepFixesIt) {
  const auto shape = [](auto&& edit) {
    ImageTransformSpec spec;
    edit(spec);
    return ImageTransforms(spec, 3).output_shape();
  };
  using Shape = std::vector<std::int64_t>;
  EXPECT_EQ(shape([](ImageTransformSpec&) {}), Shape{});
  EXPECT_EQ(shape([](ImageTransformSpec& s) { s.resize = {64}; }), Shape{});
  EXPECT_EQ(shape([](ImageTransformSpec& s) { s.resize = {64, 48}; }), (Shape{3, 64, 48}));
  EXPECT_EQ(shape([](ImageTransformSpec& s) {
              s.resize = {64};
              s.center_crop = {56};
            }),
            (Shape{3, 56, 56}));
  EXPECT_EQ(shape([](ImageTransformSpec& s) {
              s.resize = {64, 48};
              s.random_resized_crop = {20, 30};
            }),
            (Shape{3, 20, 30}));
}

TEST(ImageTransformsDraws, OneSeedGivesOneDraw) {
  ImageTransformSpec spec;
  spec.random_resized_crop = {224};
  spec.horizontal_flip = 0.5;
  spec.brightness = spec.contrast = spec.saturation = 0.4;
  spec.hue = 0.2;
  const ImageTransforms transforms(spec, 3);
  std::set<std::vector<double>> seen;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const ImageDraw a = transforms.draw(seed, 300, 400);
    const ImageDraw b = transforms.draw(seed, 300, 400);
    const auto fields = [](const ImageDraw& d) {
      std::vector<double> all{d.brightness_factor, d.contrast_factor, d.saturation_factor,
                              d.hue_factor};
      for (std::int64_t v :
           {d.crop_top, d.crop_left, d.crop_height, d.crop_width, std::int64_t{d.flip}}) {
        all.push_back(static_cast<double>(v));
      }
      all.insert(all.end(), d.jitter_order.begin(), d.jitter_order.end());
      return all;
    };
    EXPECT_EQ(fields(a), fields(b)) << seed;
    seen.insert(fields(a));
  }
  EXPECT_EQ(seen.size(), 20u);
}

// Whether a box of w x h could come from a target area in `scale` and a ratio in `ratio` once
// both sides are rounded to whole pixels (each by at most half a pixel).
::testing::AssertionResult in_range(const ImageDraw& d, double area, const ImageTransformSpec& s) {
  const double w = static_cast<double>(d.crop_width);
  const double h = static_cast<double>(d.crop_height);
  const bool area_fits = (w + 0.5) * (h + 0.5) >= s.crop_scale[0] * area &&
                         (w - 0.5) * (h - 0.5) <= s.crop_scale[1] * area;
  const bool ratio_fits =
      (w + 0.5) / (h - 0.5) >= s.crop_ratio[0] && (w - 0.5) / (h + 0.5) <= s.crop_ratio[1];
  if (area_fits && ratio_fits) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << w << " x " << h << " is out of range";
}

TEST(ImageTransformsDraws, CropsStayInsideTheImageWithAreaAndRatioInRange) {
  ImageTransformSpec spec;
  spec.random_resized_crop = {32};
  spec.crop_scale = {0.08, 1.0};
  const ImageTransforms transforms(spec, 3);
  double smallest = 1;
  double largest = 0;
  for (std::uint64_t seed = 0; seed < 2000; ++seed) {
    const ImageDraw d = transforms.draw(seed * 7919 + 13, 300, 400);
    ASSERT_GE(d.crop_top, 0);
    ASSERT_GE(d.crop_left, 0);
    ASSERT_GE(d.crop_height, 1);
    ASSERT_GE(d.crop_width, 1);
    ASSERT_LE(d.crop_top + d.crop_height, 300) << seed;
    ASSERT_LE(d.crop_left + d.crop_width, 400) << seed;
    ASSERT_TRUE(in_range(d, 300.0 * 400.0, spec)) << seed;
    const double fraction = static_cast<double>(d.crop_height * d.crop_width) / (300.0 * 400.0);
    smallest = std::min(smallest, fraction);
    largest = std::max(largest, fraction);
  }
  // The whole range is drawn from, not one end of it.
  EXPECT_LT(smallest, 0.1);
  EXPECT_GT(largest, 0.9);
}

TEST(ImageTransformsDraws, FlipsAndJittersAtTheirRates) {
  ImageTransformSpec spec;
  spec.horizontal_flip = 0.5;
  spec.brightness = 0.4;
  spec.hue = 0.1;
  const ImageTransforms transforms(spec, 3);
  int flips = 0;
  std::set<std::array<int, 4>> orders;
  for (std::uint64_t seed = 0; seed < 2000; ++seed) {
    const ImageDraw d = transforms.draw(seed, 10, 10);
    flips += d.flip;
    orders.insert(d.jitter_order);
    ASSERT_GE(d.brightness_factor, 0.6);
    ASSERT_LE(d.brightness_factor, 1.4);
    ASSERT_GE(d.hue_factor, -0.1);
    ASSERT_LE(d.hue_factor, 0.1);
    ASSERT_EQ(d.contrast_factor, 1.0);  // contrast is off
  }
  EXPECT_GE(flips, 900);
  EXPECT_LE(flips, 1100);
  EXPECT_EQ(orders.size(), 24u);  // every order of the four operations
  spec.horizontal_flip = 1;
  EXPECT_TRUE(ImageTransforms(spec, 3).draw(4, 10, 10).flip);
  spec.horizontal_flip = 0;
  EXPECT_FALSE(ImageTransforms(spec, 3).draw(4, 10, 10).flip);
}

TEST(ImageTransformsDraws, CropsThatCannotFitFallBackToTheCentre) {
  ImageTransformSpec spec;
  spec.random_resized_crop = {8};
  spec.crop_scale = {0.9, 1.0};
  spec.crop_ratio = {1.0, 1.0};
  const ImageTransforms square(spec, 3);
  for (std::uint64_t seed : {0u, 1u, 2u}) {
    // A square of 90% of the area is ~95 pixels a side: never inside 10 pixels.
    ImageDraw d = square.draw(seed, 10, 1000);
    EXPECT_EQ((std::array<std::int64_t, 4>{d.crop_top, d.crop_left, d.crop_height, d.crop_width}),
              (std::array<std::int64_t, 4>{0, 495, 10, 10}));
    d = square.draw(seed, 1000, 10);
    EXPECT_EQ((std::array<std::int64_t, 4>{d.crop_top, d.crop_left, d.crop_height, d.crop_width}),
              (std::array<std::int64_t, 4>{495, 0, 10, 10}));
  }
  spec.crop_ratio = {2.0, 3.0};
  const ImageDraw d = ImageTransforms(spec, 3).draw(0, 1000, 10);
  EXPECT_EQ((std::array<std::int64_t, 4>{d.crop_top, d.crop_left, d.crop_height, d.crop_width}),
            (std::array<std::int64_t, 4>{497, 0, 5, 10}));
}

TEST(ImageTransformsSteps, CollatesIntoChannelsLastWhenAsked) {
  take_sample_times();
  const std::vector<at::Tensor> images{at::rand({3, 4, 5}), at::rand({3, 4, 5})};
  const at::Tensor plain = collate_images(images, false);
  EXPECT_TRUE(plain.is_contiguous());
  EXPECT_TRUE(at::equal(plain, at::stack(images)));
  const at::Tensor last = collate_images(images, true);
  EXPECT_TRUE(last.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(at::equal(last, at::stack(images)));
  EXPECT_GT(take_sample_times()[SampleStage::kCollate], 0);
  EXPECT_HAS(error_of([&] {
               collate_images({images[0], at::rand({3, 5, 4})}, false);
             }),
             "different sizes");
  const ImageTransforms transforms(ImageTransformSpec{}, 1);
  transforms.apply(DecodedImage{2, 2, 1, {1, 2, 3, 4}}, 0);
  EXPECT_GT(take_sample_times()[SampleStage::kTransform], 0);
}

// A batch made as image_folder makes it (each sample's 8-bit pixels, stacked channels-last, then
// scaled and normalized at once) holds the very bits apply() gives each sample.
TEST(ImageTransformsSteps, PixelsThenABatchScaledAtOnceGiveApplysBits) {
  ImageTransformSpec spec;
  spec.random_resized_crop = {6, 7};
  spec.horizontal_flip = 0.5;
  spec.brightness = 0.4;
  spec.hue = 0.2;
  spec.mean = {0.485, 0.456, 0.406};
  spec.std = {0.229, 0.224, 0.225};
  const ImageTransforms transforms(spec, 3);
  DecodedImage image{9, 11, 3, {}};
  for (std::int64_t i = 0; i < 9 * 11 * 3; ++i)
    image.pixels.push_back(static_cast<std::uint8_t>(i * 37 % 256));
  std::vector<at::Tensor> pixels;
  std::vector<at::Tensor> samples;
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    pixels.push_back(transforms.pixels(image, seed));
    EXPECT_EQ(pixels.back().scalar_type(), at::kByte);
    samples.push_back(transforms.apply(image, seed));
  }
  const at::Tensor batch = transforms.to_input(collate_images(pixels, true));
  EXPECT_TRUE(batch.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(at::equal(batch, at::stack(samples)));
}

Config transforms_section(const std::string& text) {
  const auto root = parse_toml("[transforms]\n" + text, "recipe.toml");
  return Config(root->at("transforms").table_ptr(), "dataset.transforms");
}

TEST(ImageTransformsRecipes, ReadsEveryKeyWithTorchvisionsDefaults) {
  const ImageTransformSpec defaults = read_image_transforms(transforms_section(""));
  EXPECT_TRUE(defaults.resize.empty());
  EXPECT_EQ(defaults.crop_scale, (std::array<double, 2>{0.08, 1.0}));
  EXPECT_EQ(defaults.crop_ratio, (std::array<double, 2>{0.75, 1.3333333333333333}));
  EXPECT_FALSE(defaults.random());
  const ImageTransformSpec spec = read_image_transforms(transforms_section(
      "resize = [256]\ncenter_crop = [224, 200]\nrandom_resized_crop = [192]\n"
      "crop_scale = [0.5, 1]\ncrop_ratio = [0.5, 2.0]\nhorizontal_flip = 0.5\nbrightness = 0.4\n"
      "contrast = 0.3\nsaturation = 0.2\nhue = 0.1\nmean = [0.5, 0.4, 0.3]\n"
      "std = [0.2, 0.2, 0.25]\nchannels_last = true\n"));
  EXPECT_EQ(spec.resize, (std::vector<std::int64_t>{256}));
  EXPECT_EQ(spec.center_crop, (std::vector<std::int64_t>{224, 200}));
  EXPECT_EQ(spec.random_resized_crop, (std::vector<std::int64_t>{192}));
  EXPECT_EQ(spec.crop_scale, (std::array<double, 2>{0.5, 1.0}));
  EXPECT_EQ(spec.crop_ratio, (std::array<double, 2>{0.5, 2.0}));
  EXPECT_EQ(spec.horizontal_flip, 0.5);
  EXPECT_EQ(spec.brightness, 0.4);
  EXPECT_EQ(spec.contrast, 0.3);
  EXPECT_EQ(spec.saturation, 0.2);
  EXPECT_EQ(spec.hue, 0.1);
  EXPECT_EQ(spec.mean, (std::vector<double>{0.5, 0.4, 0.3}));
  EXPECT_EQ(spec.std, (std::vector<double>{0.2, 0.2, 0.25}));
  EXPECT_TRUE(spec.channels_last);
  for (const OptionSpec& option : image_transform_options()) EXPECT_FALSE(option.help.empty());
}

TEST(ImageTransformsRecipes, RefusesWhatCannotWorkNamingTheKey) {
  const auto refusal = [](const std::string& text) {
    return error_of([&] { read_image_transforms(transforms_section(text)); });
  };
  EXPECT_HAS(refusal("resize = [1, 2, 3]"), "dataset.transforms.resize");
  EXPECT_HAS(refusal("center_crop = [0]"), "dataset.transforms.center_crop");
  EXPECT_HAS(refusal("mean = [0.5]"), "dataset.transforms.mean");
  EXPECT_HAS(refusal("std = [0.5]"), "dataset.transforms.std");
  EXPECT_HAS(refusal("mean = [0.5]\nstd = [0.5, 0.5]"), "dataset.transforms.std");
  EXPECT_HAS(refusal("mean = [0.5]\nstd = [0]"), "dataset.transforms.std");
  EXPECT_HAS(refusal("crop_scale = [1.0, 0.5]"), "dataset.transforms.crop_scale");
  EXPECT_HAS(refusal("crop_ratio = [0, 1]"), "dataset.transforms.crop_ratio");
  EXPECT_HAS(refusal("hue = 0.7"), "dataset.transforms.hue");
  EXPECT_HAS(refusal("horizontal_flip = 1.5"), "dataset.transforms.horizontal_flip");
  EXPECT_HAS(refusal("rotate = 10"), "rotate");
  EXPECT_HAS(refusal("resize = [1, 2, 3]"), "recipe.toml:2");
  ImageTransformSpec spec;
  spec.mean = {0.5, 0.5};
  spec.std = {0.2, 0.2};
  EXPECT_HAS(error_of([&] { ImageTransforms(spec, 3); }), "mean and std");
  EXPECT_HAS(error_of([&] { ImageTransforms(ImageTransformSpec{}, 4); }), "1 or 3 channels");
  const ImageTransforms gray(ImageTransformSpec{}, 1);
  EXPECT_HAS(error_of([&] { gray.apply(DecodedImage{1, 1, 3, {1, 2, 3}}, 0); }), "channels");
}

}  // namespace
}  // namespace trainyard::testing
