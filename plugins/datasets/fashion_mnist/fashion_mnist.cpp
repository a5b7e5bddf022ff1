// Fashion-MNIST from its IDX files (gzip-compressed or not): 60,000 training and 10,000 test
// images of 28x28 grey pixels in 10 classes.

#include <zlib.h>

#include <ATen/ATen.h>

#include <array>
#include <filesystem>
#include <limits>
#include <mutex>

#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kImageMagic = 0x00000803;
constexpr std::uint32_t kLabelMagic = 0x00000801;

// Reads a whole IDX file through zlib, which also reads uncompressed files as they are.
std::vector<std::uint8_t> read_file(const fs::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw Error("cannot open dataset file " + path.string());
  std::vector<std::uint8_t> bytes;
  std::array<std::uint8_t, 1 << 16> chunk{};
  while (true) {
    int got = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (got < 0) {
      int code = 0;
      std::string message = gzerror(file, &code);
      gzclose(file);
      throw Error("dataset file " + path.string() + " is corrupt after " +
                  std::to_string(bytes.size()) + " bytes: " + message);
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
  }
  // A gzip stream cut short reads as a clean end in some zlib versions; gzclose reports it.
  int code = gzclose(file);
  if (code != Z_OK) {
    throw Error("dataset file " + path.string() + " is truncated (gzip stream ends early after " +
                std::to_string(bytes.size()) + " bytes)");
  }
  return bytes;
}

std::uint32_t read_be32(const std::vector<std::uint8_t>& bytes, std::size_t offset) {
  return (std::uint32_t(bytes[offset]) << 24) | (std::uint32_t(bytes[offset + 1]) << 16) |
         (std::uint32_t(bytes[offset + 2]) << 8) | std::uint32_t(bytes[offset + 3]);
}

// Checks an IDX header and payload length; returns the dimensions.
std::vector<std::int64_t> check_idx(const std::vector<std::uint8_t>& bytes, const fs::path& path,
                                    std::uint32_t magic, std::size_t dims) {
  const std::size_t header = 4 + 4 * dims;
  if (bytes.size() < header) {
    throw Error("dataset file " + path.string() + " is truncated: " + std::to_string(bytes.size()) +
                " bytes, shorter than its " + std::to_string(header) + "-byte header");
  }
  if (read_be32(bytes, 0) != magic) {
    throw Error("dataset file " + path.string() + " is not an IDX file of the expected kind (magic " +
                std::to_string(read_be32(bytes, 0)) + " at offset 0, expected " +
                std::to_string(magic) + ")");
  }
  std::vector<std::int64_t> shape;
  std::size_t expected = 1;
  for (std::size_t d = 0; d < dims; ++d) {
    shape.push_back(read_be32(bytes, 4 + 4 * d));
    // A product that overflows could wrap around to the file's size and be trusted.
    const auto size = static_cast<std::size_t>(shape.back());
    if (size != 0 && expected > std::numeric_limits<std::size_t>::max() / size) {
      throw Error("dataset file " + path.string() + " has a header (offsets 4.." +
                  std::to_string(header - 1) + ") whose dimensions multiply past 2^64 bytes (corrupt)");
    }
    expected *= size;
  }
  if (bytes.size() - header != expected) {
    throw Error("dataset file " + path.string() + " holds " + std::to_string(bytes.size() - header) +
                " bytes of data after its header, the header promises " +
                std::to_string(expected) + (bytes.size() - header < expected ? " (truncated)" : ""));
  }
  return shape;
}

fs::path find_file(const fs::path& root, const std::string& stem) {
  for (const char* suffix : {".gz", ""}) {
    fs::path candidate = root / (stem + suffix);
    if (fs::exists(candidate)) return candidate;
  }
  throw Error("dataset file missing: " + (root / (stem + ".gz")).string() +
              " (install Debian's dataset-fashion-mnist or set dataset.root)");
}

// One split held in memory as bytes; batches are normalised floats made on demand.
class FashionMnistSplit final : public MapSource {
 public:
  FashionMnistSplit(const fs::path& root, const std::string& prefix, bool normalize, double mean,
                    double std) {
    fs::path images_path = find_file(root, prefix + "-images-idx3-ubyte");
    fs::path labels_path = find_file(root, prefix + "-labels-idx1-ubyte");
    auto image_bytes = read_file(images_path);
    auto label_bytes = read_file(labels_path);
    auto image_shape = check_idx(image_bytes, images_path, kImageMagic, 3);
    auto label_shape = check_idx(label_bytes, labels_path, kLabelMagic, 1);
    if (image_shape[1] != 28 || image_shape[2] != 28) {
      throw Error("dataset file " + images_path.string() + " holds " +
                  std::to_string(image_shape[1]) + "x" + std::to_string(image_shape[2]) +
                  " images; Fashion-MNIST images are 28x28");
    }
    if (image_shape[0] != label_shape[0]) {
      throw Error("dataset files disagree: " + images_path.string() + " has " +
                  std::to_string(image_shape[0]) + " images, " + labels_path.string() + " has " +
                  std::to_string(label_shape[0]) + " labels");
    }
    images_ = at::from_blob(image_bytes.data() + 16, {image_shape[0], 1, image_shape[1], image_shape[2]},
                               at::kByte)
                  .clone();
    labels_ = at::from_blob(label_bytes.data() + 8, {label_shape[0]}, at::kByte)
                  .to(at::kLong);
    if (labels_.numel() > 0 && labels_.max().item<std::int64_t>() > 9) {
      throw Error("dataset file " + labels_path.string() + " has labels outside 0..9");
    }
    normalize_ = normalize;
    mean_ = at::full({1, 1, 1}, mean, at::kFloat);
    std_ = at::full({1, 1, 1}, std, at::kFloat);
  }

  std::int64_t size() const override { return labels_.size(0); }

  TensorMap get(std::int64_t index) const override {
    return {{"input", to_float(images_[index])}, {"target", labels_[index]}};
  }

  Batch get_batch(std::span<const std::int64_t> indices) const override {
    torch::Tensor index =
        at::from_blob(const_cast<std::int64_t*>(indices.data()),
                         {static_cast<std::int64_t>(indices.size())}, at::kLong);
    Batch batch;
    batch.size = static_cast<std::int64_t>(indices.size());
    batch.tensors["input"] = to_float(images_.index_select(0, index));
    batch.tensors["target"] = labels_.index_select(0, index);
    return batch;
  }

 private:
  // torchvision's ToTensor then Normalize, in their float32 arithmetic: x / 255, then
  // (x - mean) / std with mean and std as float32 tensors. Folding the three into one multiply
  // and add would round differently from what a Python pipeline feeds its model.
  torch::Tensor to_float(const torch::Tensor& pixels) const {
    torch::Tensor scaled = pixels.to(at::kFloat).div_(255);
    if (!normalize_) return scaled;
    return scaled.sub_(mean_).div_(std_);
  }

  torch::Tensor images_;
  torch::Tensor labels_;
  bool normalize_ = true;
  torch::Tensor mean_;  // float32, shape [1, 1, 1] as torchvision's Normalize holds it
  torch::Tensor std_;
};

class FashionMnist final : public Dataset {
 public:
  explicit FashionMnist(const Config& options)
      : root_(options.get_path("root")),
        normalize_(options.get_bool("normalize")),
        mean_(options.get_float("mean")),
        std_(options.get_float("std")) {
    if (!fs::is_directory(root_)) {
      options.fail("root", "names a missing folder: " + root_.string() +
                               " (install Debian's dataset-fashion-mnist)");
    }
  }

  DatasetInfo info() const override {
    DatasetInfo info;
    info.input_shape = {1, 28, 28};
    info.num_classes = 10;
    return info;
  }

  std::vector<std::string> splits() const override { return {"train", "test"}; }

  std::shared_ptr<const MapSource> map_split(const std::string& split) const override {
    const char* prefix = split == "train" ? "train" : split == "test" ? "t10k" : nullptr;
    if (!prefix) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    auto& cached = split == "train" ? train_ : test_;
    if (!cached) cached = std::make_shared<FashionMnistSplit>(root_, prefix, normalize_, mean_, std_);
    return cached;
  }

 private:
  fs::path root_;
  bool normalize_;
  double mean_;
  double std_;
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const MapSource> train_;
  mutable std::shared_ptr<const MapSource> test_;
};

void register_components(Registry& registry) {
  registry.add<Dataset>(
      "fashion_mnist",
      {option("root", "/usr/share/datasets/fashion-mnist", "folder of the IDX files (.gz or raw)"),
       option("normalize", true, "subtract mean and divide by std (else scale to [0, 1])"),
       option("mean", 0.2860, "pixel mean of the training set"),
       option("std", 0.3530, "pixel standard deviation of the training set").greater_than(0)},
      "Fashion-MNIST: 28x28 grey images in 10 classes; splits train and test",
      [](const Config& options, const BuildContext&) {
        return std::make_unique<FashionMnist>(options);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("fashion_mnist", "1.0.0", trainyard::register_components)
