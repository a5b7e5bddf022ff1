// Seeded random classification data of any shape, for tests and benchmarks. Labels come from a
// fixed random linear "teacher", so the data is learnable and a falling loss means learning.
// With vocab_size > 0 it is language-modelling data instead: token sequences that follow a fixed
// random successor table (a learnable bigram rule), each target the next token, in map-style
// splits, so that runs can reshard to any number of data-parallel ranks mid-epoch.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>

#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

class TensorSplit final : public MapSource {
 public:
  TensorSplit(torch::Tensor inputs, torch::Tensor targets)
      : inputs_(std::move(inputs)), targets_(std::move(targets)) {}
  std::int64_t size() const override { return targets_.size(0); }
  TensorMap get(std::int64_t index) const override {
    return {{"input", inputs_[index]}, {"target", targets_[index]}};
  }
  Batch get_batch(std::span<const std::int64_t> indices) const override {
    torch::Tensor index =
        at::from_blob(const_cast<std::int64_t*>(indices.data()),
                         {static_cast<std::int64_t>(indices.size())}, at::kLong);
    Batch batch;
    batch.size = static_cast<std::int64_t>(indices.size());
    batch.tensors["input"] = inputs_.index_select(0, index);
    batch.tensors["target"] = targets_.index_select(0, index);
    return batch;
  }

 private:
  torch::Tensor inputs_;
  torch::Tensor targets_;
};

class Synthetic final : public Dataset {
 public:
  Synthetic(const Config& options, std::uint64_t run_seed) {
    std::int64_t samples = options.get_int("samples");
    std::int64_t eval_samples = options.get_int("eval_samples");
    shape_ = options.get_int_list("input_shape");
    classes_ = options.get_int("num_classes");
    if (shape_.empty()) options.fail("input_shape", "must not be empty");
    vocab_ = options.get_int("vocab_size");
    if (vocab_ > 0 && shape_.size() != 1) {
      options.fail("input_shape", "must be [sequence length] when vocab_size is set");
    }
    std::int64_t seed = options.get_int("seed");
    // Its own generator: the data is the same whatever else draws from the global one.
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(
        seed >= 0 ? static_cast<std::uint64_t>(seed) : run_seed);
    std::int64_t features = 1;
    for (auto d : shape_) features *= d;
    if (vocab_ > 0) {
      make_sequences(samples, eval_samples, generator);
      return;
    }
    torch::Tensor teacher = at::randn({features, classes_}, generator, at::kFloat);
    auto make = [&](std::int64_t count) {
      std::vector<std::int64_t> full = {count};
      full.insert(full.end(), shape_.begin(), shape_.end());
      torch::Tensor inputs = at::randn(full, generator, at::kFloat);
      torch::Tensor targets = inputs.reshape({count, features}).matmul(teacher).argmax(1);
      return std::make_shared<TensorSplit>(inputs, targets);
    };
    train_ = make(samples);
    if (eval_samples > 0) test_ = make(eval_samples);
  }

  DatasetInfo info() const override {
    DatasetInfo info;
    info.input_shape = shape_;
    if (vocab_ > 0) {
      info.vocab_size = vocab_;
      info.sequence_length = shape_[0];
    } else {
      info.num_classes = classes_;
    }
    return info;
  }
  std::vector<std::string> splits() const override {
    if (test_) return {"train", "test"};
    return {"train"};
  }
  std::shared_ptr<const MapSource> map_split(const std::string& split) const override {
    if (split == "train") return train_;
    if (split == "test") return test_;
    return nullptr;
  }

 private:
  // Each sequence starts at a random token and follows the successor table; the targets are the
  // inputs shifted by one.
  void make_sequences(std::int64_t samples, std::int64_t eval_samples, at::Generator& generator) {
    const std::int64_t length = shape_[0];
    const torch::Tensor successor = at::randperm(vocab_, generator, at::kLong);
    auto make = [&](std::int64_t count) {
      torch::Tensor tokens = at::empty({count, length + 1}, at::kLong);
      tokens.select(1, 0).copy_(at::randint(vocab_, {count}, generator, at::kLong));
      for (std::int64_t t = 1; t <= length; ++t) {
        tokens.select(1, t).copy_(successor.index_select(0, tokens.select(1, t - 1)));
      }
      return std::make_shared<TensorSplit>(tokens.narrow(1, 0, length).contiguous(),
                                           tokens.narrow(1, 1, length).contiguous());
    };
    train_ = make(samples);
    if (eval_samples > 0) test_ = make(eval_samples);
  }

  std::vector<std::int64_t> shape_;
  std::int64_t classes_ = 0;
  std::int64_t vocab_ = 0;
  std::shared_ptr<const MapSource> train_;
  std::shared_ptr<const MapSource> test_;
};

void register_components(Registry& registry) {
  registry.add<Dataset>(
      "synthetic",
      {option("samples", 1024, "training samples").at_least(1),
       option("eval_samples", 256, "test samples (0: no test split)").at_least(0),
       option("input_shape", std::vector<std::int64_t>{1, 28, 28}, "shape of one input")
           .at_least(1),
       option("num_classes", 10, "number of classes").at_least(2),
       option("seed", -1, "data seed (-1: the run's seed)"),
       option("vocab_size", 0,
              "language-modelling data instead: token sequences of input_shape = [length] over "
              "this vocabulary, each target the next token (0: classification)")
           .at_least(0)},
      "seeded random inputs labelled by a fixed random linear teacher",
      [](const Config& options, const BuildContext& context) {
        return std::make_unique<Synthetic>(options, context.seed);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("synthetic", "1.0.0", trainyard::register_components)
