// The `resnet` model against torchvision: random torchvision ResNets made at test time by
// resnet/make_references.py (resnet18 with the imagenet stem, resnet18 with the small stem on
// 1-channel 28x28 images, resnet34, resnet50), their state_dicts loaded with `weights`, give
// torchvision's logits within fp32 tolerances in eval mode and in one train-mode forward, and
// the BatchNorm running statistics that forward leaves; so do two pipeline stages chained, and
// the model on channels-last activations. The module names every tensor as torchvision's
// state_dict does; weights with a missing, extra or wrongly shaped tensor are refused by name.
// Built from scratch it initialises as torchvision, backpropagates, and gives the same gradients
// with activation checkpointing as without.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "step_harness.hpp"
#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/models/pretrained_weights.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kClasses = 10;
constexpr double kRtol = 1.3e-6;
constexpr double kAtol = 1e-5;

struct Case {
  std::string name;
  std::string options;  // of the model, besides `weights`
};

const std::vector<Case> kCases = {
    {"resnet18", "depth = 18\n"},
    {"resnet18_small", "depth = 18\nstem = \"small\"\n"},
    {"resnet34", "depth = 34\n"},
    {"resnet50", "depth = 50\n"},
};

BuildContext image_context(const std::vector<std::int64_t>& image) {
  BuildContext context;
  context.seed = 5;
  context.data.input_shape = image;
  context.data.num_classes = kClasses;
  return context;
}

std::shared_ptr<Model> build_resnet(const std::string& options, const BuildContext& context) {
  return bundled_registry().create<Model>("resnet", options_section("model", options), context);
}

std::string weights_option(const fs::path& file) { return "weights = \"" + file.string() + "\"\n"; }

Batch batch_of(const at::Tensor& images) {
  Batch batch;
  batch.size = images.size(0);
  batch.tensors["input"] = images;
  batch.tensors["target"] = at::arange(images.size(0), at::kLong).remainder(kClasses);
  return batch;
}

::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected,
                                 double atol = kAtol) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " vs " << expected.sizes();
  }
  const double difference = (actual - expected).abs().max().item<double>();
  if (at::allclose(actual, expected, kRtol, atol)) {
    return ::testing::AssertionSuccess() << "max |difference| " << difference;
  }
  return ::testing::AssertionFailure() << "max |difference| " << difference;
}

// The references, made once for the whole suite.
class ResnetReferences : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path python = source_dir() / ".venv/bin/python";
    const CommandResult probe = run_command({python.string(), "-c", "import torchvision"}, {}, 120);
    if (probe.exit_code != 0) {
      missing_ = "no torchvision in " + python.string() + " (tools/setup --tests installs it)";
      return;
    }
    folder_ = fs::temp_directory_path() / ("trainyard_resnet_refs_" + std::to_string(::getpid()));
    fs::create_directories(folder_);
    const fs::path script = source_dir() / "tests/unit/resnet/make_references.py";
    // torchvision computes with this process's intra-op thread count: the convolutions then
    // split their sums alike on both sides (with one thread in Python and two here, resnet50's
    // logits differed by 2e-4, with the same count by nothing).
    const CommandResult made = run_command(
        {python.string(), script.string(), folder_.string(), std::to_string(at::get_num_threads())},
        {}, 300);
    made_ = made.exit_code == 0;
    if (!made_) ADD_FAILURE() << describe(made);
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    if (!folder_.empty()) fs::remove_all(folder_, ignored);
  }

  void SetUp() override {
    if (!missing_.empty()) TRAINYARD_SKIP_MISSING() << missing_;
    ASSERT_TRUE(made_) << "the references could not be made";
  }

  static fs::path weights(const std::string& name) {
    return folder_ / name / "weights.safetensors";
  }
  static at::Tensor reference(const std::string& name, const std::string& tensor) {
    const PretrainedWeights file(folder_ / name / "reference.safetensors");
    return file.read(tensor, file.info(tensor).dtype == "I64" ? at::kLong : at::kFloat);
  }
  static at::Tensor images(const std::string& name) { return reference(name, "input"); }
  static BuildContext context_of(const std::string& name) {
    return image_context(images(name).sizes().slice(1).vec());
  }

  static inline fs::path folder_;
  static inline bool made_ = false;
  static inline std::string missing_;
};

at::Tensor logits_of(Model& model, const at::Tensor& images, bool train) {
  at::NoGradGuard no_grad;
  model.module().train(train);
  return run_blocks(model, model.blocks(), batch_of(images));
}

class ResnetMatchesTorchvision : public ResnetReferences,
                                 public ::testing::WithParamInterface<Case> {};

// Eval mode, then one train-mode forward: the logits, and every running statistic and counter
// that forward updated.
TEST_P(ResnetMatchesTorchvision, EvalAndTrainForward) {
  const Case& c = GetParam();
  auto model = build_resnet(c.options + weights_option(weights(c.name)), context_of(c.name));
  const at::Tensor eval_logits = logits_of(*model, images(c.name), false);
  const at::Tensor train_logits = logits_of(*model, images(c.name), true);
  const auto eval = close(eval_logits, reference(c.name, "eval_logits"));
  const auto train = close(train_logits, reference(c.name, "train_logits"));
  EXPECT_TRUE(eval) << "eval mode";
  EXPECT_TRUE(train) << "train mode";
  std::cout << c.name << ": eval logits " << eval.message() << ", train logits " << train.message()
            << "\n";
  std::size_t buffers = 0;
  for (const auto& item : model->module().named_buffers(true)) {
    const at::Tensor expected = reference(c.name, "after_train." + item.key());
    if (item.key().find("num_batches_tracked") != std::string::npos) {
      EXPECT_TRUE(at::equal(item.value(), expected)) << item.key();
    } else {
      EXPECT_TRUE(close(item.value(), expected)) << item.key();
    }
    ++buffers;
  }
  EXPECT_GT(buffers, 0u);
}

// The module holds exactly the tensors of torchvision's state_dict, under its names.
TEST_P(ResnetMatchesTorchvision, NamesEveryTensorAsTorchvision) {
  const Case& c = GetParam();
  auto model = build_resnet(c.options, context_of(c.name));
  std::set<std::string> held;
  for (const auto& item : model->module().named_parameters(true)) held.insert(item.key());
  for (const auto& item : model->module().named_buffers(true)) held.insert(item.key());
  std::set<std::string> torchvision;
  const PretrainedWeights file(weights(c.name));
  for (const auto& [name, info] : file.tensors()) torchvision.insert(name);
  EXPECT_EQ(held, torchvision);
}

INSTANTIATE_TEST_SUITE_P(Cases, ResnetMatchesTorchvision, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// On the CPU too, channels_last = "true" runs the blocks on channels-last activations and gives
// the same logits within the tolerance.
TEST_F(ResnetReferences, ChannelsLastGivesTheSameLogits) {
  auto model = build_resnet("channels_last = \"true\"\n" + weights_option(weights("resnet18")),
                            context_of("resnet18"));
  const at::Tensor input = images("resnet18");
  at::NoGradGuard no_grad;
  model->module().eval();
  const at::Tensor stem = model->blocks().front().forward(Activations(input)).hidden();
  EXPECT_TRUE(stem.is_contiguous(at::MemoryFormat::ChannelsLast));
  const auto result = close(logits_of(*model, input, false), reference("resnet18", "eval_logits"));
  EXPECT_TRUE(result);
  std::cout << "resnet18 channels-last: eval logits " << result.message() << "\n";
}

// Two pipeline stages read only their blocks' tensors, and chained give the whole model's logits.
TEST_F(ResnetReferences, PipelineStagesLoadTheirBlocks) {
  BuildContext first = context_of("resnet18"), second = context_of("resnet18");
  first.blocks = BlockRange{0, 5};
  second.blocks = BlockRange{5, -1};
  const std::string options = weights_option(weights("resnet18"));
  auto front = build_resnet(options, first);
  auto back = build_resnet(options, second);
  EXPECT_NE(front->module().named_parameters().find("layer2.1.conv2.weight"), nullptr);
  EXPECT_EQ(back->module().named_parameters().find("layer2.1.conv2.weight"), nullptr);
  EXPECT_NE(back->module().named_buffers().find("layer3.0.downsample.1.running_var"), nullptr);
  at::NoGradGuard no_grad;
  front->module().eval();
  back->module().eval();
  const Batch batch = batch_of(images("resnet18"));
  Activations x(front->input(batch));
  for (const Block& block : front->blocks()) x = block.forward(x);
  for (const Block& block : back->blocks()) x = block.forward(x);
  EXPECT_TRUE(close(x.hidden(), reference("resnet18", "eval_logits")));
}

TEST_F(ResnetReferences, RefusesWeightsThatDoNotMatch) {
  const BuildContext small = context_of("resnet18_small");
  const std::string options = "stem = \"small\"\n";
  const std::string missing = error_of([&] {
    build_resnet(options + weights_option(folder_ / "missing_tensor.safetensors"), small);
  });
  EXPECT_TRUE(contains(missing, "tensor 'layer3.1.bn2.running_var' of shape [256] is missing"));
  const std::string wrong = error_of(
      [&] { build_resnet(options + weights_option(folder_ / "wrong_shape.safetensors"), small); });
  EXPECT_TRUE(contains(wrong,
                       "tensor 'layer2.0.conv1.weight' has shape [128, 64, 1, 1] but the "
                       "model makes it [128, 64, 3, 3]"));
  // resnet34's weights hold blocks resnet18 does not have.
  const std::string extra =
      error_of([&] { build_resnet(weights_option(weights("resnet34")), context_of("resnet34")); });
  EXPECT_TRUE(contains(extra,
                       "tensor 'layer1.2.bn1.bias' (in weights.safetensors) is not a "
                       "parameter or buffer of the configured model"));
  // 3-channel weights for the dataset's 1-channel images: the message says where 1 comes from.
  const std::string channels = error_of([&] {
    build_resnet(weights_option(weights("resnet18")), image_context({1, 28, 28}));
  });
  EXPECT_TRUE(contains(channels,
                       "tensor 'conv1.weight' has shape [64, 3, 7, 7] but the model "
                       "makes it [64, 1, 7, 7] (1 input channels from the dataset"));
}

// What needs no reference: building from scratch.

Batch random_images(std::int64_t size, const std::vector<std::int64_t>& image, std::uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  std::vector<std::int64_t> shape = {size};
  shape.insert(shape.end(), image.begin(), image.end());
  Batch batch = batch_of(at::randn(shape, generator));
  batch.tensors["target"] = at::randint(kClasses, {size}, generator, at::kLong);
  return batch;
}

// torchvision's initialisation: convolutions N(0, 2 / fan_out), BatchNorm weight 1 and bias 0,
// and with zero_init_residual the last BatchNorm of each residual block at 0.
TEST(ResnetFromScratch, InitialisesAsTorchvision) {
  for (const std::string depth : {"18", "50"}) {
    auto model = build_resnet("depth = " + depth + "\nzero_init_residual = true\n",
                              image_context({3, 32, 32}));
    const std::string last_norm = depth == "18" ? ".bn2.weight" : ".bn3.weight";
    for (const auto& item : model->module().named_parameters(true)) {
      const std::string& name = item.key();
      const at::Tensor& value = item.value();
      if (value.dim() == 4) {
        const double fan_out = static_cast<double>(value.size(0) * value.size(2) * value.size(3));
        const double std = value.std().item<double>();
        // Enough draws for the sample's deviation to be within 10% of the distribution's.
        if (value.numel() >= 4096) {
          EXPECT_NEAR(std, std::sqrt(2.0 / fan_out), 0.1 * std) << name;
        }
      } else if (name.rfind("layer", 0) == 0 && name.size() > last_norm.size() &&
                 name.compare(name.size() - last_norm.size(), last_norm.size(), last_norm) == 0) {
        EXPECT_TRUE(value.eq(0).all().item<bool>()) << name;
      } else if (name.find("bn") != std::string::npos ||
                 name.find("downsample.1") != std::string::npos) {
        const bool weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
        EXPECT_TRUE(value.eq(weight ? 1 : 0).all().item<bool>()) << name;
      }
    }
  }
}

// Backward reaches every parameter, and recomputing every block (BatchNorm in train mode
// included) gives exactly the gradients of the plain forward.
TEST(ResnetFromScratch, CheckpointedBlocksGiveTheSameGradients) {
  const std::vector<std::int64_t> image = {3, 32, 32};
  const Batch batch = random_images(4, image, 11);
  auto gradients = [&](const std::string& selection) {
    auto model = build_resnet("depth = 18\n", image_context(image));
    model->module().train();
    auto blocks =
        with_activation_checkpointing(model->blocks(), ActivationCheckpointing::parse(selection));
    model->loss(run_blocks(*model, blocks, batch), batch).backward();
    std::map<std::string, at::Tensor> out;
    for (const auto& item : model->module().named_parameters(true)) {
      out[item.key()] = item.value().grad();
    }
    return out;
  };
  const auto plain = gradients("none");
  for (const auto& [name, gradient] : plain) {
    ASSERT_TRUE(gradient.defined()) << name;
    EXPECT_TRUE(gradient.isfinite().all().item<bool>()) << name;
  }
  EXPECT_GT(plain.at("conv1.weight").abs().sum().item<double>(), 0.0);
  for (const std::string selection : {"all", "blocks:layer2.0,layer4.1"}) {
    const auto recomputed = gradients(selection);
    ASSERT_EQ(recomputed.size(), plain.size());
    for (const auto& [name, gradient] : plain) {
      EXPECT_TRUE(at::equal(recomputed.at(name), gradient)) << selection << ": " << name;
    }
  }
}

TEST(ResnetFromScratch, RefusesWhatItDoesNotBuild) {
  const std::string depth = error_of([&] {
    build_resnet("depth = 20\n", image_context({1, 28, 28}));
  });
  EXPECT_TRUE(contains(depth, "model.depth must be 18, 34 or 50, got 20"));
  BuildContext tokens;
  tokens.data.input_shape = {16};
  tokens.data.vocab_size = 32;
  tokens.data.sequence_length = 16;
  const std::string data = error_of([&] { build_resnet("", tokens); });
  EXPECT_TRUE(contains(data, "model 'resnet' needs images [channels, height, width]"));
}

}  // namespace
}  // namespace trainyard::testing
