// Model conformance: blocks own every parameter and are stable, the forward pass through the
// blocks gives logits, the loss is a finite scalar with gradients for every parameter, the losses
// of a batch's parts recombine into the whole batch's as loss_reduction() and loss_terms() say,
// construction is seeded, and a model that builds stages builds each one equal to the same slice
// of the whole model.

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <optional>
#include <set>

#include "conformance.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/model.hpp"

namespace {

using namespace trainyard;

constexpr std::int64_t kBatch = 4;
constexpr std::int64_t kClasses = 10;
// Language models get token windows of kSequence ids below kVocab instead of images.
constexpr std::int64_t kSequence = 12;
constexpr std::int64_t kVocab = 10;

BuildContext language_model_context() {
  BuildContext context = conformance::classification_context({kSequence}, 0);
  context.data.vocab_size = kVocab;
  context.data.sequence_length = kSequence;
  return context;
}

class ModelConformance : public ::testing::TestWithParam<std::string> {
 protected:
  // The model, built for images or else for token windows. Null when it declares required
  // options (skipped_ says which), or when it builds for neither kind of data (a failure: every
  // model must take one of the two).
  std::shared_ptr<Model> build(std::uint64_t seed = 0) {
    skipped_ = conformance::why_not_buildable_from_defaults("model", GetParam());
    if (!skipped_.empty()) return nullptr;
    std::string refusals;
    for (bool language : {false, true}) {
      torch::manual_seed(seed);
      try {
        language_ = language;
        return conformance::registry().create<Model>(GetParam(), conformance::under_test("model"),
                                                     context(seed));
      } catch (const Error& error) {
        refusals += std::string(language ? " token windows: " : " images: ") + error.what();
      }
    }
    ADD_FAILURE() << "model '" << GetParam()
                  << "' builds for neither images nor token windows;" << refusals;
    return nullptr;
  }

  // The blocks `range` of the model, for the kind of data build() found it takes.
  std::shared_ptr<Model> build_stage(std::uint64_t seed, const BlockRange& range) const {
    BuildContext stage_context = context(seed);
    stage_context.blocks = range;
    return conformance::registry().create<Model>(GetParam(), conformance::under_test("model"),
                                                 stage_context);
  }

  BuildContext context(std::uint64_t seed) const {
    BuildContext out = language_ ? language_model_context() : conformance::classification_context();
    out.seed = seed;
    return out;
  }

  Batch batch(std::int64_t size = kBatch) const {
    Batch batch;
    batch.size = size;
    if (language_) {
      batch.tensors["input"] = torch::randint(0, kVocab, {size, kSequence}, torch::kLong);
      batch.tensors["target"] = torch::randint(0, kVocab, {size, kSequence}, torch::kLong);
    } else {
      batch.tensors["input"] = torch::randn({size, 1, 28, 28});
      batch.tensors["target"] = torch::randint(0, kClasses, {size}, torch::kLong);
    }
    return batch;
  }

  // Logits: [batch, classes] for a classifier, [batch, sequence, vocabulary] for a language model.
  std::vector<std::int64_t> output_shape() const {
    if (language_) return {kBatch, kSequence, kVocab};
    return {kBatch, kClasses};
  }

  bool language_ = false;

  std::string skipped_;
};

#define BUILD_OR_SKIP(var, ...)  \
  auto var = build(__VA_ARGS__); \
  if (!var && skipped_.empty()) return; \
  if (!var) GTEST_SKIP() << skipped_;

std::set<const void*> impls(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> out;
  for (const auto& t : tensors) out.insert(t.unsafeGetTensorImpl());
  return out;
}

TEST_P(ModelConformance, BlocksAreStableAndOwnEveryParameter) {
  BUILD_OR_SKIP(model);
  auto blocks = model->blocks();
  ASSERT_FALSE(blocks.empty());
  auto again = model->blocks();
  ASSERT_EQ(blocks.size(), again.size());
  std::set<std::string> names;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_FALSE(blocks[i].name.empty()) << "block " << i;
    EXPECT_TRUE(names.insert(blocks[i].name).second) << "duplicate block name " << blocks[i].name;
    ASSERT_NE(blocks[i].module, nullptr) << blocks[i].name;
    EXPECT_TRUE(static_cast<bool>(blocks[i].forward)) << blocks[i].name;
    EXPECT_EQ(blocks[i].name, again[i].name);
    EXPECT_EQ(blocks[i].module.get(), again[i].module.get())
        << "blocks() must return the same modules on every call (" << blocks[i].name << ")";
  }

  std::set<const void*> in_blocks;
  std::set<const void*> buffers_in_blocks;
  for (const auto& block : blocks) {
    for (const auto& p : block.module->parameters(true)) in_blocks.insert(p.unsafeGetTensorImpl());
    for (const auto& b : block.module->buffers(true)) buffers_in_blocks.insert(b.unsafeGetTensorImpl());
  }
  const auto module_params = model->module().named_parameters(true);
  EXPECT_GT(module_params.size(), 0u);
  for (const auto& item : module_params) {
    EXPECT_TRUE(in_blocks.count(item.value().unsafeGetTensorImpl()))
        << "parameter '" << item.key() << "' belongs to no block";
  }
  for (const auto& item : model->module().named_buffers(true)) {
    EXPECT_TRUE(buffers_in_blocks.count(item.value().unsafeGetTensorImpl()))
        << "buffer '" << item.key() << "' belongs to no block";
  }
  // module() owns every parameter: blocks hold no parameter of their own.
  auto owned = impls(model->module().parameters(true));
  for (const auto* impl : in_blocks) EXPECT_TRUE(owned.count(impl)) << "a block parameter is not in module()";
}

TEST_P(ModelConformance, ForwardLossBackwardAndSums) {
  BUILD_OR_SKIP(model);
  torch::manual_seed(1);
  Batch b = batch();
  auto blocks = model->blocks();
  torch::Tensor output = run_blocks(*model, blocks, b);
  ASSERT_TRUE(output.defined());
  ASSERT_EQ(output.sizes().vec(), output_shape());
  EXPECT_TRUE(output.isfinite().all().item<bool>());

  torch::Tensor loss = model->loss(output, b);
  ASSERT_EQ(loss.dim(), 0) << "loss must be a scalar";
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  loss.backward();
  for (const auto& item : model->module().named_parameters(true)) {
    if (!item.value().requires_grad()) continue;
    const auto& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << "no gradient for '" << item.key() << "'";
    EXPECT_EQ(grad.sizes(), item.value().sizes()) << item.key();
    EXPECT_TRUE(grad.isfinite().all().item<bool>()) << item.key();
  }

  TensorMap sums;
  {
    torch::NoGradGuard no_grad;
    sums = model->eval_sums(output.detach(), b);
  }
  for (const auto& [name, value] : sums) {
    ASSERT_TRUE(value.defined()) << name;
    EXPECT_TRUE(value.isfinite().all().item<bool>()) << name;
  }
  if (auto it = sums.find("accuracy"); it != sums.end()) {
    ASSERT_EQ(it->second.numel(), 1);
    const double correct = it->second.item<double>();
    EXPECT_GE(correct, 0);
    EXPECT_LE(correct, static_cast<double>(kBatch));
  }
}

// What a pipeline relies on to split a batch into micro-batches: their losses recombine into
// the whole batch's, weighed by their terms for kMean (sum_i terms_i * loss_i / sum_i terms_i)
// and added for kSum. The parts are uneven, so weighing them alike would not match.
TEST_P(ModelConformance, PartLossesRecombineIntoTheWholeBatchLoss) {
  BUILD_OR_SKIP(model);
  model->module().eval();  // batch statistics must not tie samples together here
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  const std::vector<std::int64_t> part_sizes = {1, 2, 3};
  const Batch whole = batch(6);
  const auto blocks = model->blocks();
  const double expected = model->loss(run_blocks(*model, blocks, whole), whole).item<double>();
  const LossReduction reduction = model->loss_reduction();

  double weighted_sum = 0, terms = 0, sum = 0;
  std::int64_t begin = 0;
  for (const std::int64_t size : part_sizes) {
    Batch part;
    part.size = size;
    for (const auto& [name, tensor] : whole.tensors) {
      part.tensors[name] = tensor.narrow(0, begin, size);
    }
    begin += size;
    const double loss = model->loss(run_blocks(*model, blocks, part), part).item<double>();
    const double part_terms = model->loss_terms(part);
    EXPECT_GE(part_terms, 0) << "part of " << size << " samples";
    weighted_sum += part_terms * loss;
    terms += part_terms;
    sum += loss;
  }
  ASSERT_EQ(begin, whole.size);
  EXPECT_DOUBLE_EQ(terms, model->loss_terms(whole)) << "the parts' terms must add up";

  double recombined = sum;
  if (reduction == LossReduction::kMean) {
    ASSERT_GT(terms, 0) << "a mean over no terms";
    recombined = weighted_sum / terms;
  }
  // fp32 tolerance: the parts run through differently shaped kernels.
  constexpr double kRtol = 1.3e-6, kAtol = 1e-5;
  EXPECT_LE(std::abs(expected - recombined), kAtol + kRtol * std::abs(recombined))
      << (reduction == LossReduction::kMean ? "kMean" : "kSum") << ": whole batch's loss "
      << expected << ", recombined from parts of 1, 2 and 3 samples " << recombined;
}

TEST_P(ModelConformance, FlopsPerSampleIsPositive) {
  BUILD_OR_SKIP(model);
  const double flops = model->flops_per_sample();
  EXPECT_TRUE(std::isfinite(flops));
  EXPECT_GT(flops, 0);
}

TEST_P(ModelConformance, SameSeedGivesSameInitialParameters) {
  BUILD_OR_SKIP(first, 42);
  BUILD_OR_SKIP(second, 42);
  auto a = first->module().named_parameters(true);
  auto b = second->module().named_parameters(true);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : a) {
    const torch::Tensor* other = b.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(at::equal(item.value(), *other)) << "'" << item.key() << "' differs";
  }
  auto second_buffers = second->module().named_buffers(true);
  for (const auto& item : first->module().named_buffers(true)) {
    const torch::Tensor* other = second_buffers.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(at::equal(item.value(), *other)) << "buffer '" << item.key() << "' differs";
  }
}

std::vector<std::string> names_of(const std::vector<Block>& blocks) {
  std::vector<std::string> names;
  for (const auto& block : blocks) names.push_back(block.name);
  return names;
}

using NamedTensors = torch::OrderedDict<std::string, torch::Tensor>;

// A block's parameters and buffers as they are now.
struct BlockState {
  NamedTensors parameters;
  NamedTensors buffers;
};

BlockState snapshot(const Block& block) {
  BlockState state;
  for (const auto& item : block.module->named_parameters(true)) {
    state.parameters.insert(item.key(), item.value().detach().clone());
  }
  for (const auto& item : block.module->named_buffers(true)) {
    state.buffers.insert(item.key(), item.value().clone());
  }
  return state;
}

// Every parameter and buffer of `stage`'s block equals, bitwise and under the same name, the one
// of the whole model's block.
void expect_block_equals(const Block& stage, const BlockState& whole, const std::string& label) {
  auto expect_same = [&](const NamedTensors& got, const NamedTensors& want,
                         const std::string& what) {
    EXPECT_EQ(got.keys(), want.keys()) << label << ": " << what << " names of " << stage.name;
    for (const auto& item : want) {
      const torch::Tensor* other = got.find(item.key());
      if (!other) continue;
      EXPECT_TRUE(item.value().sizes() == other->sizes() && at::equal(item.value(), *other))
          << label << ": " << what << " '" << stage.name << "." << item.key()
          << "' differs from the whole model's";
    }
  };
  expect_same(stage.module->named_parameters(true), whole.parameters, "parameter");
  expect_same(stage.module->named_buffers(true), whole.buffers, "buffer");
}

TEST_P(ModelConformance, StageEqualsTheSliceOfTheWholeModel) {
  constexpr std::uint64_t kSeed = 5;
  BUILD_OR_SKIP(whole, kSeed);
  const std::vector<std::string> names = names_of(whole->blocks());
  ASSERT_EQ(whole->block_names(), names)
      << "block_names() must name the blocks of the whole model, in forward order";
  if (!whole->builds_stages()) {
    GTEST_SKIP() << "builds_stages() is false: the model always builds whole, and a pipeline "
                    "refuses it";
  }
  const auto count = static_cast<std::int64_t>(names.size());
  // As built: a forward in training mode moves BatchNorm's running statistics.
  std::map<std::string, BlockState> whole_blocks;
  for (const auto& block : whole->blocks()) whole_blocks.emplace(block.name, snapshot(block));
  NamedTensors whole_parameters;
  for (const auto& item : whole->module().named_parameters(true)) {
    whole_parameters.insert(item.key(), item.value().detach().clone());
  }
  torch::manual_seed(3);
  const Batch b = batch();
  const torch::Tensor expected = run_blocks(*whole, whole->blocks(), b);

  // Each split into two stages, then the split into one stage per block.
  std::vector<std::vector<BlockRange>> splits;
  for (std::int64_t cut = 1; cut < count; ++cut) splits.push_back({{0, cut}, {cut, -1}});
  std::vector<BlockRange> singletons;
  for (std::int64_t i = 0; i < count; ++i) singletons.push_back({i, i + 1});
  splits.push_back(singletons);

  for (const auto& split : splits) {
    Activations x;
    for (const BlockRange& range : split) {
      const std::int64_t end = range.end == -1 ? count : range.end;
      const std::string label = "stage [" + std::to_string(range.begin) + ", " +
                                std::to_string(end) + ") of " + std::to_string(count);
      auto stage = build_stage(kSeed, range);
      ASSERT_TRUE(stage) << label;
      ASSERT_EQ(stage->block_names(), names) << label;
      const auto blocks = stage->blocks();
      ASSERT_EQ(names_of(blocks),
                std::vector<std::string>(names.begin() + range.begin, names.begin() + end))
          << label << " must hold exactly its blocks";
      for (const auto& block : blocks)
        expect_block_equals(block, whole_blocks.at(block.name), label);

      // module() names what it holds as the whole model does; a tied parameter held as a copy
      // equals the original.
      std::map<std::string, std::string> copies;
      for (const auto& tie : stage->tied_parameters()) {
        if (!tie.held_as.empty()) copies[tie.held_as] = tie.name;
      }
      for (const auto& item : stage->module().named_parameters(true)) {
        const auto copy = copies.find(item.key());
        const std::string name = copy == copies.end() ? item.key() : copy->second;
        const torch::Tensor* original = whole_parameters.find(name);
        ASSERT_NE(original, nullptr)
            << label << ": '" << item.key() << "' is not in the whole model";
        EXPECT_TRUE(at::equal(item.value(), *original)) << label << ": '" << item.key() << "'";
      }

      if (range.begin == 0) {
        x = Activations(stage->input(b));
      } else {
        EXPECT_THROW(stage->input(b), Error) << label << ": input() needs the first block";
      }
      for (const auto& block : blocks) x = block.forward(x);
      if (end == count) {
        EXPECT_EQ(stage->loss(x.hidden(), b).item<double>(),
                  whole->loss(expected, b).item<double>())
            << label;
      } else {
        EXPECT_THROW(stage->loss(x.hidden(), b), Error)
            << label << ": loss() needs the last block";
      }
    }
    EXPECT_TRUE(at::equal(x.hidden(), expected)) << "chaining the stages' forwards must equal the whole "
                                           "model's forward exactly";
  }

  // An empty range builds nothing and still names every block.
  auto empty = build_stage(kSeed, BlockRange{1, 1});
  EXPECT_EQ(empty->module().parameters(true).size(), 0u);
  EXPECT_TRUE(empty->blocks().empty());
  EXPECT_EQ(empty->block_names(), names);
  // A range beyond the last block is an Error naming the block count.
  try {
    build_stage(kSeed, BlockRange{0, count + 1});
    ADD_FAILURE() << "a range past the last block must be refused";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(std::to_string(count) + " blocks"), std::string::npos)
        << error.what();
  }
}

}  // namespace

TRAINYARD_CONFORMANCE_SUITE(ModelConformance, "model");
