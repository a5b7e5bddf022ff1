// A map-style dataset whose batches are slow to prepare, for the automatic loader's tests:
// `samples` small learnable samples (class c's inputs scatter around a fixed pattern), and
// get_batch sleeps `prepare_us_per_sample` microseconds per sample, as decoding or augmenting
// would take, without using a core.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <thread>

#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

constexpr std::int64_t kClasses = 4;

class SlowSplit final : public MapSource {
 public:
  SlowSplit(at::Tensor inputs, at::Tensor targets, std::chrono::microseconds per_sample)
      : inputs_(std::move(inputs)), targets_(std::move(targets)), per_sample_(per_sample) {}
  std::int64_t size() const override { return targets_.size(0); }
  TensorMap get(std::int64_t index) const override {
    std::this_thread::sleep_for(per_sample_);
    return {{"input", inputs_[index]}, {"target", targets_[index]}};
  }
  Batch get_batch(std::span<const std::int64_t> indices) const override {
    std::this_thread::sleep_for(per_sample_ * static_cast<std::int64_t>(indices.size()));
    at::Tensor index = at::tensor(std::vector<std::int64_t>(indices.begin(), indices.end()),
                                  at::TensorOptions(at::kLong));
    Batch batch;
    batch.size = static_cast<std::int64_t>(indices.size());
    batch.tensors["input"] = inputs_.index_select(0, index);
    batch.tensors["target"] = targets_.index_select(0, index);
    return batch;
  }

 private:
  at::Tensor inputs_;
  at::Tensor targets_;
  std::chrono::microseconds per_sample_;
};

class SlowDataset final : public Dataset {
 public:
  explicit SlowDataset(const Config& options) {
    const std::int64_t samples = options.get_int("samples");
    const std::int64_t delay = options.get_int("prepare_us_per_sample");
    if (samples < 1) options.fail("samples", "must be >= 1");
    if (delay < 0) options.fail("prepare_us_per_sample", "must be >= 0");
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7);
    at::Tensor patterns = at::randn({kClasses, 1, 4, 4}, generator);
    at::Tensor targets = at::arange(samples, at::kLong).remainder(kClasses);
    at::Tensor inputs =
        patterns.index_select(0, targets) + 0.5 * at::randn({samples, 1, 4, 4}, generator);
    train_ = std::make_shared<SlowSplit>(inputs, targets, std::chrono::microseconds(delay));
  }
  DatasetInfo info() const override {
    DatasetInfo info;
    info.input_shape = {1, 4, 4};
    info.num_classes = kClasses;
    return info;
  }
  std::vector<std::string> splits() const override { return {"train"}; }
  std::shared_ptr<const MapSource> map_split(const std::string& split) const override {
    return split == "train" ? train_ : nullptr;
  }

 private:
  std::shared_ptr<const MapSource> train_;
};

void register_components(Registry& registry) {
  registry.add<Dataset>(
      "test_slow",
      {option("samples", 4096, "training samples"),
       option("prepare_us_per_sample", 0, "microseconds get_batch sleeps per sample it collates")},
      "a small map-style dataset whose batches are slow to prepare, for tests",
      [](const Config& options, const BuildContext&) {
        return std::make_unique<SlowDataset>(options);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("test_slow", "1.0.0", trainyard::register_components)
