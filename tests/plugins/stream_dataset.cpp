// A streaming dataset for the engine's and the conformance suite's tests: `samples` learnable
// samples (class c's inputs scatter around a fixed pattern), permuted per (seed, epoch) and
// dealt round-robin to the (rank x worker) readers. Its test split does not know its size.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/runtime/loader.hpp"

namespace trainyard {
namespace {

constexpr std::int64_t kClasses = 4;

class DealtStream final : public SampleStream {
 public:
  DealtStream(at::Tensor inputs, std::vector<std::int64_t> ids)
      : inputs_(std::move(inputs)), ids_(std::move(ids)) {}
  std::optional<TensorMap> next() override {
    if (position_ >= ids_.size()) return std::nullopt;
    const std::int64_t id = ids_[position_++];
    return TensorMap{{"input", inputs_[id]},
                     {"target", at::scalar_tensor(id % kClasses, at::kLong)}};
  }
  TensorMap state() const override {
    return {{"position", at::scalar_tensor(static_cast<std::int64_t>(position_), at::kLong)}};
  }
  void restore(const TensorMap& state) override {
    auto it = state.find("position");
    if (it == state.end()) throw Error("stream state lacks 'position'");
    const std::int64_t position = it->second.item<std::int64_t>();
    if (position < 0 || position > static_cast<std::int64_t>(ids_.size())) {
      throw Error("stream state's position " + std::to_string(position) + " is out of range");
    }
    position_ = static_cast<std::size_t>(position);
  }

 private:
  at::Tensor inputs_;
  std::vector<std::int64_t> ids_;
  std::size_t position_ = 0;
};

class DealtSource final : public StreamSource {
 public:
  DealtSource(at::Tensor inputs, bool know_size) : inputs_(std::move(inputs)), know_size_(know_size) {}
  std::unique_ptr<SampleStream> open(const StreamShard& shard) const override {
    LoaderOptions permutation;
    permutation.seed = shard.seed;
    const auto order = epoch_indices(inputs_.size(0), permutation, shard.epoch);
    const auto readers = static_cast<std::size_t>(shard.world_size * shard.workers);
    std::vector<std::int64_t> mine;
    for (auto i = static_cast<std::size_t>(shard.rank * shard.workers + shard.worker);
         i < order.size(); i += readers) {
      mine.push_back(order[i]);
    }
    return std::make_unique<DealtStream>(inputs_, std::move(mine));
  }
  std::optional<std::int64_t> size() const override {
    if (!know_size_) return std::nullopt;
    return inputs_.size(0);
  }

 private:
  at::Tensor inputs_;
  bool know_size_;
};

// Both splits share the class patterns; `seed` draws the split's scatter.
at::Tensor make_inputs(std::int64_t samples, std::uint64_t seed) {
  at::Generator pattern_generator = at::make_generator<at::CPUGeneratorImpl>(1234);
  at::Tensor patterns = at::randn({kClasses, 1, 4, 4}, pattern_generator);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor classes = at::arange(samples, at::kLong).remainder(kClasses);
  return patterns.index_select(0, classes) + 0.5 * at::randn({samples, 1, 4, 4}, generator);
}

class TestStream final : public Dataset {
 public:
  explicit TestStream(const Config& options) {
    const std::int64_t samples = options.get_int("samples");
    const std::int64_t eval_samples = options.get_int("eval_samples");
    if (samples < 1 || eval_samples < 1) throw Error("test_stream needs samples >= 1");
    train_ = std::make_shared<DealtSource>(make_inputs(samples, 1), true);
    test_ = std::make_shared<DealtSource>(make_inputs(eval_samples, 2), false);
  }
  DatasetInfo info() const override {
    DatasetInfo info;
    info.input_shape = {1, 4, 4};
    info.num_classes = kClasses;
    return info;
  }
  std::vector<std::string> splits() const override { return {"train", "test"}; }
  std::shared_ptr<const StreamSource> stream_split(const std::string& split) const override {
    if (split == "train") return train_;
    if (split == "test") return test_;
    return nullptr;
  }

 private:
  std::shared_ptr<const StreamSource> train_;
  std::shared_ptr<const StreamSource> test_;
};

void register_components(Registry& registry) {
  registry.add<Dataset>("test_stream",
                        {option("samples", 640, "training samples"),
                         option("eval_samples", 200, "test samples (a stream of unknown size)")},
                        "a small streaming classification dataset for tests",
                        [](const Config& options, const BuildContext&) {
                          return std::make_unique<TestStream>(options);
                        });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("test_stream", "1.0.0", trainyard::register_components)
