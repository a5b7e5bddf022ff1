// WebDataset tar shards of JPEG and PNG images with class labels, as a streaming dataset: every
// shard is indexed from its member headers at the start (index problems refused there, naming
// the shard and the sample), then each loader reader reads its contiguous range of the epoch's
// shard sequence through a shuffle buffer of raw bytes, decoding and augmenting ([dataset.
// transforms], seeded per sample) the samples it draws. See webdataset_stream.hpp for the order
// and the exact resume, shard_index.hpp for what makes a sample.

#include <ATen/ATen.h>

#include <iostream>

#include "image_cursor.hpp"
#include "image_decode.hpp"
#include "image_transforms.hpp"
#include "shard_index.hpp"
#include "shard_pattern.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/api/skipped_samples.hpp"
#include "webdataset_stream.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

// The shard files `key` names: its pattern expanded, then each name resolved as a path option
// written where the pattern was (relative to the recipe that wrote it).
std::vector<fs::path> shard_paths(const Config& options, const std::string& key) {
  std::vector<std::string> names;
  try {
    names = expand_shard_pattern(options.get_string(key));
  } catch (const Error& error) {
    options.fail(key, error.what());
  }
  std::vector<fs::path> paths;
  for (const std::string& name : names) {
    auto table = std::make_shared<Table>();
    table->set(key, Value(name, options.value(key).where()));
    paths.push_back(Config(table, options.name()).get_path(key));
  }
  return paths;
}

std::shared_ptr<const ShardIndex> index_split(const Config& options, const std::string& key,
                                              bool skip_bad) {
  auto index = std::make_shared<ShardIndex>(
      index_shards(shard_paths(options, key), options.get_int("classes"), skip_bad));
  for (const std::string& reason : index->skipped) report_skipped_sample(reason);
  if (!index->skipped.empty()) {
    std::cerr << "webdataset: skipped " << index->skipped.size() << " bad sample"
              << (index->skipped.size() == 1 ? "" : "s") << " of " << options.qualified(key)
              << " (dataset.on_bad_sample = \"skip\"); the first: " << index->skipped.front()
              << std::endl;
  }
  if (index->size() == 0) {
    std::string message = "names shards holding no samples (an image member and a .cls or .json ";
    message += "label member under one key): ";
    message += options.get_string(key);
    options.fail(key, message);
  }
  return index;
}

// The [C, H, W] of the split's samples: the transforms' when they fix it, else the first sample
// that decodes made with them (one image read and decoded at the start).
std::vector<std::int64_t> sample_shape(const SplitReading& split) {
  if (std::vector<std::int64_t> fixed = split.transforms->output_shape(); !fixed.empty()) {
    return fixed;
  }
  ImageCursor cursor(split.index);
  for (std::size_t shard = 0; shard < split.index->shards.size(); ++shard) {
    for (std::size_t sample = 0; sample < split.index->shards[shard].samples.size(); ++sample) {
      const auto s = static_cast<std::int64_t>(shard);
      const auto i = static_cast<std::int64_t>(sample);
      try {
        return make_sample(split, s, i, cursor.read(s, i), SampleDraws{}).at("input").sizes().vec();
      } catch (const Error&) {
        if (!split.skip_bad) throw;
      }
    }
  }
  throw Error("webdataset: no sample of " + split.index->shards.front().path.string() +
              " and the shards after it decodes");
}

class WebDataset final : public Dataset {
 public:
  explicit WebDataset(const Config& options) : classes_(options.get_int("classes")) {
    const bool skip_bad = options.get_string("on_bad_sample") == "skip";
    const bool gray = options.get_string("color") == "gray";
    const ImageTransformSpec train = read_image_transforms(options.get_table("transforms"));
    auto reading = [&](const std::string& key, const ImageTransformSpec& spec,
                       std::int64_t shuffle_buffer) {
      auto split = std::make_shared<SplitReading>();
      split->index = index_split(options, key, skip_bad);
      split->transforms = std::make_shared<const ImageTransforms>(spec, gray ? 1 : 3);
      split->mode = gray ? ColorMode::kGray : ColorMode::kRgb;
      split->shuffle_buffer = shuffle_buffer;
      split->skip_bad = skip_bad;
      split->shape = sample_shape(*split);
      return split;
    };
    auto train_split = reading("train", train, options.get_int("shuffle_buffer"));
    shape_ = train_split->shape;
    train_ = std::make_shared<WebDatasetStream>(train_split);
    if (!options.get_string("test").empty()) {
      // Evaluation reads every sample once whatever the order: no shuffling.
      test_ = std::make_shared<WebDatasetStream>(
          reading("test", read_test_transforms(options.get_table("test_transforms"), train), 0));
    }
  }

  DatasetInfo info() const override {
    DatasetInfo info;
    info.input_shape = shape_;
    info.num_classes = classes_;
    return info;
  }

  std::vector<std::string> splits() const override {
    if (!test_) return {"train"};
    return {"train", "test"};
  }

  std::shared_ptr<const StreamSource> stream_split(const std::string& split) const override {
    if (split == "train") return train_;
    if (split == "test") return test_;
    return nullptr;
  }

 private:
  std::int64_t classes_;
  std::vector<std::int64_t> shape_;
  std::shared_ptr<const StreamSource> train_;
  std::shared_ptr<const StreamSource> test_;
};

void register_components(Registry& registry) {
  registry.add<Dataset>(
      "webdataset",
      {required_option("train", OptionType::kString,
                       "the training shards: a tar file, or a pattern with brace ranges such as "
                       "\"data/train-{000000..000099}.tar\" (relative to the recipe)"),
       option("test", "", "the test shards, as train (\"\": none)"),
       required_option("classes", OptionType::kInteger,
                       "the number of classes; every label must lie in [0, classes)")
           .at_least(2),
       option("shuffle_buffer", 1000,
              "samples (their encoded bytes) each reader holds to draw from at random, after "
              "the shards' own shuffle; 0: the shards in their listed order, unshuffled")
           .at_least(0),
       option("color", "rgb", "channels every image is converted to").one_of({"rgb", "gray"}),
       option("on_bad_sample", "refuse",
              "a sample without its image or label, a label out of range, a damaged shard or "
              "image: \"refuse\" stops naming the shard and key, \"skip\" leaves it out and "
              "counts it")
           .one_of({"refuse", "skip"}),
       table_option("transforms",
                    "[dataset.transforms]: resize, crops, flip, color jitter, "
                    "normalize of the training samples (channels_last does not reach a "
                    "stream's batches)"),
       table_option("test_transforms",
                    "the test samples' transforms (empty: the training ones without their "
                    "random steps)")},
      "WebDataset tar shards of JPEG and PNG images with .cls or .json labels, streamed through "
      "a shuffle buffer",
      [](const Config& options, const BuildContext&) {
        return std::make_unique<WebDataset>(options);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("webdataset", "1.0.0", trainyard::register_components)
