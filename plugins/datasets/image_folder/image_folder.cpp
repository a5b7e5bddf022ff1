// Images in class folders (torchvision's ImageFolder layout): JPEG and PNG files decoded by the
// image codec library when the loader asks for a batch (in its workers, when it has any), to
// Pillow's pixels, then transformed as [dataset.transforms] says (torchvision's arithmetic), with
// each sample's random draws seeded by (seed, epoch, index) so any worker count, layout or
// resume gives the same batches.

#include <ATen/ATen.h>

#include <iostream>
#include <mutex>

#include "folder_scan.hpp"
#include "image_decode.hpp"
#include "image_transforms.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/api/sample_timing.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

// How every sample of a split is made.
struct SampleRecipe {
  ColorMode mode = ColorMode::kRgb;
  std::vector<std::int64_t> shape;  // [C, H, W] of every sample
  std::shared_ptr<const ImageTransforms> transforms;
};

class ImageFolderSplit final : public MapSource {
 public:
  ImageFolderSplit(ScannedFolder folder, SampleRecipe recipe)
      : folder_(std::move(folder)), recipe_(std::move(recipe)) {}

  std::int64_t size() const override { return static_cast<std::int64_t>(folder_.samples.size()); }

  TensorMap get(std::int64_t index) const override {
    return {{"input", image(index, SampleDraws{}.for_sample(index))}, {"target", target(index)}};
  }

  Batch get_batch(std::span<const std::int64_t> indices) const override {
    return get_batch_drawn(indices, SampleDraws{});
  }

  // Each sample's 8-bit pixels, stacked, then scaled and normalized as one batch: the same bits
  // as get()'s samples, with one float pass over the batch rather than one per sample.
  Batch get_batch_drawn(std::span<const std::int64_t> indices,
                        const SampleDraws& draws) const override {
    std::vector<at::Tensor> pixels;
    std::vector<at::Tensor> targets;
    pixels.reserve(indices.size());
    targets.reserve(indices.size());
    for (const std::int64_t index : indices) {
      pixels.push_back(
          checked(index, recipe_.transforms->pixels(decode(index), draws.for_sample(index))));
      targets.push_back(target(index));
    }
    Batch batch;
    batch.size = static_cast<std::int64_t>(indices.size());
    batch.tensors.emplace("input", recipe_.transforms->to_input(collate_images(
                                       pixels, recipe_.transforms->spec().channels_last)));
    const SampleTimer timer(SampleStage::kCollate);
    batch.tensors.emplace("target", at::stack(targets));
    return batch;
  }

 private:
  const ImageSample& sample(std::int64_t index) const {
    if (index < 0 || index >= size()) {
      throw Error("image_folder: sample " + std::to_string(index) + " of a split of " +
                  std::to_string(size()));
    }
    return folder_.samples[static_cast<std::size_t>(index)];
  }

  at::Tensor target(std::int64_t index) const {
    return at::scalar_tensor(sample(index).label, at::kLong);
  }

  DecodedImage decode(std::int64_t index) const {
    return decode_image_file(sample(index).path.string(), recipe_.mode);
  }

  at::Tensor image(std::int64_t index, std::uint64_t draw_seed) const {
    return checked(index, recipe_.transforms->apply(decode(index), draw_seed));
  }

  // `made` (a sample of `index`) when it has the split's [C, H, W]; else an Error naming the file.
  at::Tensor checked(std::int64_t index, at::Tensor made) const {
    check_sample_shape(made, recipe_.shape, sample(index).path.string());
    return made;
  }

  ScannedFolder folder_;
  SampleRecipe recipe_;
};

class ImageFolder final : public Dataset {
 public:
  explicit ImageFolder(const Config& options)
      : train_root_(options.get_path("train")),
        test_root_(options.get_string("test").empty() ? fs::path() : options.get_path("test")),
        skip_bad_(options.get_string("on_bad_sample") == "skip"),
        mode_(options.get_string("color") == "gray" ? ColorMode::kGray : ColorMode::kRgb) {
    const std::int64_t channels = mode_ == ColorMode::kGray ? 1 : 3;
    const ImageTransformSpec train_spec = read_image_transforms(options.get_table("transforms"));
    const ImageTransformSpec test_spec =
        read_test_transforms(options.get_table("test_transforms"), train_spec);
    train_transforms_ = std::make_shared<const ImageTransforms>(train_spec, channels);
    test_transforms_ = std::make_shared<const ImageTransforms>(test_spec, channels);
    train_ = scan(train_root_);
    shape_ = sample_shape(*train_transforms_, train_);
  }

  DatasetInfo info() const override {
    DatasetInfo info;
    info.input_shape = shape_;
    info.num_classes = static_cast<std::int64_t>(train_.classes.size());
    return info;
  }

  std::vector<std::string> splits() const override {
    if (test_root_.empty()) return {"train"};
    return {"train", "test"};
  }

  std::shared_ptr<const MapSource> map_split(const std::string& split) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (split == "train") {
      if (!train_split_) {
        train_split_ = std::make_shared<ImageFolderSplit>(
            train_, SampleRecipe{mode_, shape_, train_transforms_});
      }
      return train_split_;
    }
    if (split != "test" || test_root_.empty()) return nullptr;
    if (!test_split_) test_split_ = make_test_split();
    return test_split_;
  }

 private:
  // The folder's images; what on_bad_sample = "skip" left out is said at once (the run summary
  // counts it again at the end).
  ScannedFolder scan(const fs::path& root) const {
    ScannedFolder folder =
        is_image_list(root) ? scan_image_list(root, skip_bad_) : scan_image_folder(root, skip_bad_);
    if (!folder.skipped.empty()) {
      std::cerr << "image_folder: skipped " << folder.skipped.size() << " unreadable file"
                << (folder.skipped.size() == 1 ? "" : "s") << " under " << root.string()
                << "; the first: " << folder.skipped.front() << std::endl;
    }
    return folder;
  }

  // The [C, H, W] of every sample: what the transforms fix, or the first image's own size.
  std::vector<std::int64_t> sample_shape(const ImageTransforms& transforms,
                                         const ScannedFolder& folder) const {
    std::vector<std::int64_t> shape = transforms.output_shape();
    if (!shape.empty()) return shape;
    const DecodedImage first = decode_image_file(folder.samples.front().path.string(), mode_);
    return transforms.apply(first, std::uint64_t{0}).sizes().vec();
  }

  std::shared_ptr<const MapSource> make_test_split() const {
    ScannedFolder test = scan(test_root_);
    if (is_image_list(test_root_)) {
      if (test.classes.size() > train_.classes.size()) {
        throw Error(test_root_.string() + ": lists label " +
                    std::to_string(test.classes.size() - 1) + " where the training images have " +
                    std::to_string(train_.classes.size()) + " classes");
      }
    } else if (test.classes != train_.classes) {
      throw Error(test_root_.string() + ": its class folders are not the training folder's (" +
                  train_root_.string() + ")");
    }
    const std::vector<std::int64_t> shape = sample_shape(*test_transforms_, test);
    return std::make_shared<ImageFolderSplit>(std::move(test),
                                              SampleRecipe{mode_, shape, test_transforms_});
  }

  fs::path train_root_;
  fs::path test_root_;
  bool skip_bad_;
  ColorMode mode_;
  std::shared_ptr<const ImageTransforms> train_transforms_;
  std::shared_ptr<const ImageTransforms> test_transforms_;
  ScannedFolder train_;
  std::vector<std::int64_t> shape_;
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const MapSource> train_split_;
  mutable std::shared_ptr<const MapSource> test_split_;
};

void register_components(Registry& registry) {
  registry.add<Dataset>(
      "image_folder",
      {required_option("train", OptionType::kString,
                       "folder of the training images, one subfolder per class; or a .csv "
                       "(path,label lines) or .json ([{\"path\", \"label\"}]) list of them"),
       option("test", "",
              "the test images: a folder with the same class subfolders, or a list (\"\": none)"),
       option("color", "rgb", "channels every image is converted to").one_of({"rgb", "gray"}),
       table_option("transforms",
                    "what every training image goes through: resize, center_crop, "
                    "random_resized_crop, horizontal_flip, brightness, contrast, saturation, hue, "
                    "mean, std, channels_last (torchvision's transforms and arithmetic)"),
       table_option("test_transforms",
                    "the test images' transforms; empty: the training ones without chance (a "
                    "random-resized crop becomes a resize to its size; no flip, no jitter)"),
       option("on_bad_sample", "refuse",
              "a file that does not read whole: \"refuse\" stops at the start naming it, "
              "\"skip\" leaves it out and counts it in the run summary")
           .one_of({"refuse", "skip"})},
      "images in class folders (torchvision's ImageFolder layout), JPEG and PNG",
      [](const Config& options, const BuildContext&) {
        return std::make_unique<ImageFolder>(options);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("image_folder", "1.0.0", trainyard::register_components)
