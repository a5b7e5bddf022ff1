// The pipeline strategy's step on two ranks as threads over gloo (pp = 2): the activations its
// first stage holds at the peak under each schedule, counted by the allocator, and fp16's
// found-inf agreed over the pipeline, so that an overflow on one stage skips the step on every
// stage, as one process skips it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <iostream>
#include <map>

#include "step_harness.hpp"
#include "trainyard/parallel/block_selection.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"

namespace trainyard::testing {
namespace {

constexpr int kStages = 2;  // p: one stage per pp rank

MeshRequest pipeline_mesh() { return MeshRequest{.pp = kStages, .dp_replicate = 1, .dp_shard = 1}; }

// Memory: an mlp whose activations dominate its parameters. Stage 0 holds three 128-wide hidden
// layers; each keeps its ReLU output (256 samples x 128 floats, 128 KiB) for backward, against
// at most 64 KiB of weights per layer.
constexpr std::int64_t kMicroBatches = 8;  // m
constexpr std::int64_t kMicroBatchSize = 256;
const std::vector<std::int64_t> kFeatures = {64};
constexpr std::int64_t kClasses = 10;
const std::string kMlp = "hidden = [128, 128, 128, 128]";
constexpr BlockRange kFirstStage{0, 3};

HarnessOptions memory_options(const std::string& schedule) {
  HarnessOptions options;
  options.strategy = "pipeline";
  options.strategy_options = "schedule = \"" + schedule +
                             "\"\nmicro_batches = " + std::to_string(kMicroBatches) +
                             "\nstages = [\"hidden0, hidden1, hidden2\", \"hidden3, head\"]"
                             "\nrecord_step = 0";
  options.model_options = kMlp;
  // No momentum: the optimizer creates no state in the middle of a step.
  options.optimizer = "sgd";
  options.optimizer_options = "lr = 0.01";
  options.input_shape = kFeatures;
  options.classes = kClasses;
  options.mesh = pipeline_mesh();
  return options;
}

Batch memory_batch(std::uint64_t seed) {
  return random_batch(kMicroBatches * kMicroBatchSize, kFeatures, kClasses, seed);
}

struct FirstStageBytes {
  std::int64_t activations = 0;  // a: what one micro-batch holds between forward and backward
  std::int64_t output = 0;       // of those, the stage's output (what it sends on)
  std::int64_t parameters = 0;
};

// The first stage measured without the strategy: stage 0's blocks built alone and run on one
// micro-batch with autograd on; a is the bytes still live after the forward (the graph's saved
// tensors and the output, which the next stage's gradient meets).
FirstStageBytes first_stage_bytes() {
  BuildContext context;
  context.seed = 5;
  context.data.input_shape = kFeatures;
  context.data.num_classes = kClasses;
  context.blocks = kFirstStage;
  std::shared_ptr<Model> stage =
      bundled_registry().create<Model>("mlp", options_section("model", kMlp), context);
  FirstStageBytes bytes;
  for (const auto& parameter : stage->module().parameters(true)) {
    bytes.parameters += static_cast<std::int64_t>(parameter.nbytes());
  }
  const std::vector<Block> blocks = stage->blocks();
  const Batch micro = random_batch(kMicroBatchSize, kFeatures, kClasses, 3);
  run_blocks(*stage, blocks, micro);  // any allocation a kernel makes once, outside the count
  AllocationTracker tracker;
  const at::Tensor output = run_blocks(*stage, blocks, micro);
  EXPECT_TRUE(output.requires_grad());
  bytes.activations = tracker.current_bytes();
  bytes.output = static_cast<std::int64_t>(output.nbytes());
  return bytes;
}

// The first stage's peak during one step under `schedule`, above what was live before it: a
// warm-up step first, so that the bundle specs are agreed and cached and the gradients exist.
std::int64_t first_stage_peak(const std::string& schedule) {
  auto peaks = run_threaded_ranks<std::int64_t>(kStages, [&](int rank, int port) {
    HarnessOptions options = memory_options(schedule);
    options.as_rank(rank, kStages, port);
    StepHarness harness(options);
    const Batch warm_up = memory_batch(1);
    harness.strategy->train_step(std::span<const Batch>(&warm_up, 1));
    const Batch batch = memory_batch(2);
    std::int64_t peak = 0;
    {
      // Counts this rank's thread (and the autograd engine's work for it) only.
      AllocationTracker tracker;
      harness.strategy->train_step(std::span<const Batch>(&batch, 1));
      peak = tracker.peak_bytes();
    }
    harness.context.communicator->barrier();
    return peak;
  });
  return peaks[0];
}

TEST(PipelineMemory, FirstStageHoldsPMicroBatchesUnder1f1bAndZeroBubbleAndMUnderGpipe) {
  at::set_num_threads(1);
  const FirstStageBytes first = first_stage_bytes();
  const auto a = static_cast<double>(first.activations);
  const auto parameters = static_cast<double>(first.parameters);
  ASSERT_GT(a, 2 * parameters) << "the activations must dominate for the bounds to mean much";
  // Beyond the p micro-batches it holds, the first stage allocates during a step: its
  // parameters' gradients (set to none at the step's start), and inside one micro-batch's
  // backward the received gradient of its output, a gradient for each activation at most (a
  // in all; backward frees the activations as it goes, but the output stays held until the
  // micro-batch is released) and a weight's gradient as backward computes it, before it is
  // added in (bounded by the parameters again). 64 KiB more covers the loss and bookkeeping.
  // That is about 2.3 a, well below the (m - p) a = 6 a that holding every micro-batch adds
  // (or the (m - p) outputs, 2 a, that keeping each sent output until the step ends adds).
  const double slack = 2 * parameters + a + static_cast<double>(first.output) + 64 * 1024;
  const double p = kStages;
  const double m = kMicroBatches;
  ASSERT_LT(slack, (m - p) * a / 2);
  std::cout << "first stage: one micro-batch holds a = " << a << " bytes (its output "
            << first.output << "); parameters " << parameters << " bytes; slack " << slack
            << " bytes (" << slack / a << " a)" << std::endl;
  std::map<std::string, double> peaks;
  for (const std::string schedule : {"1f1b", "zero_bubble", "gpipe"}) {
    peaks[schedule] = static_cast<double>(first_stage_peak(schedule));
    std::cout << "first stage peak over one step, " << schedule << ": " << peaks[schedule]
              << " bytes (" << peaks[schedule] / a << " a)" << std::endl;
  }
  EXPECT_LE(peaks["1f1b"], p * a + slack) << "1f1b: " << peaks["1f1b"] / a << " a";
  EXPECT_LE(peaks["zero_bubble"], p * a + slack)
      << "zero_bubble: " << peaks["zero_bubble"] / a << " a";
  // gpipe runs every forward before the first backward: all m micro-batches are held at once.
  EXPECT_GE(peaks["gpipe"], (m - 0.5) * a) << "gpipe: " << peaks["gpipe"] / a << " a";
}

// fp16: a model of two blocks whose first block's extra weight w_big meets each sample's k, the
// input's last column: h = x * w0 + k * w_big, then out = h * w1 + b1 against a target. w_big
// starts at 0, so a huge k changes nothing forward, but dL/dw_big = sum(k * dL/dh) overflows to
// inf while dL/dx, dL/dh and the second block's gradients stay finite: only the first stage
// finds inf. Elementwise arithmetic only, which autocast leaves in float32, so that the
// pipeline's micro-batches and one process's whole batch agree to float32 accuracy.
constexpr std::int64_t kWidth = 4;
constexpr std::int64_t kSamples = 8;

class OverflowingModel final : public Model {
 public:
  explicit OverflowingModel(const BuildContext& context)
      : root_(std::make_shared<torch::nn::Module>("overflowing")),
        selection_(context.blocks, 2, "overflowing") {
    // Fixed values rather than draws: every build, whole or a stage, holds the same.
    if (selection_.holds(0)) {
      auto scaled = std::make_shared<torch::nn::Module>("scaled");
      at::Tensor w0 = scaled->register_parameter("w0", at::linspace(0.5, 1.5, kWidth));
      at::Tensor w_big = scaled->register_parameter("w_big", at::zeros({1}));
      root_->register_module("scaled", scaled);
      blocks_.push_back({"scaled", scaled, [w0, w_big](const Activations& x) {
                           const at::Tensor& input = x.hidden();
                           const at::Tensor k = input.narrow(1, kWidth, 1);
                           return x.with_hidden(input.narrow(1, 0, kWidth) * w0 + k * w_big);
                         }});
    }
    if (selection_.holds(1)) {
      auto head = std::make_shared<torch::nn::Module>("head");
      at::Tensor w1 = head->register_parameter("w1", at::linspace(1.2, 0.8, kWidth));
      at::Tensor b1 = head->register_parameter("b1", at::full({kWidth}, 0.1));
      root_->register_module("head", head);
      blocks_.push_back({"head", head, [w1, b1](const Activations& x) {
                           return x.with_hidden(x.hidden() * w1 + b1);
                         }});
    }
  }

  torch::nn::Module& module() override { return *root_; }
  std::vector<Block> blocks() override { return blocks_; }
  torch::Tensor input(const Batch& batch) override {
    selection_.require_first("input()");
    return batch.at("input");
  }
  torch::Tensor loss(const torch::Tensor& output, const Batch& batch) override {
    selection_.require_last("loss()");
    return at::mse_loss(output, batch.at("target"));
  }
  double flops_per_sample() const override { return 0; }
  bool builds_stages() const override { return true; }
  std::vector<std::string> block_names() override { return {"scaled", "head"}; }

 private:
  std::shared_ptr<torch::nn::Module> root_;
  BlockSelection selection_;
  std::vector<Block> blocks_;
};

// Samples with features x, k in the last input column, and targets about 3 away from the
// outputs, so that dL/dh is far from zero.
Batch k_batch(double k, std::uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  Batch batch;
  batch.size = kSamples;
  batch.tensors["input"] =
      at::cat({at::randn({kSamples, kWidth}, generator), at::full({kSamples, 1}, k)}, 1);
  batch.tensors["target"] = 3.0 + 0.1 * at::randn({kSamples, kWidth}, generator);
  return batch;
}

// k near float's largest: k * dL/dw_big's scaled terms are inf in float32.
Batch overflowing_batch() { return k_batch(1e38, 40); }
Batch normal_batch() { return k_batch(1.0, 41); }

HarnessOptions fp16_overflow_options() {
  HarnessOptions options;
  options.model_factory = [](const BuildContext& context) {
    return std::make_shared<OverflowingModel>(context);
  };
  options.precision = "fp16";
  options.precision_options = "init_scale = 1024.0";
  return options;
}

bool bitwise_equal(const TensorMap& a, const TensorMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, tensor] : a) {
    auto it = b.find(name);
    if (it == b.end() || !at::equal(tensor, it->second)) return false;
  }
  return true;
}

bool all_finite(const TensorMap& tensors) {
  for (const auto& [name, tensor] : tensors) {
    if (!at::isfinite(tensor).all().item<bool>()) return false;
  }
  return true;
}

struct Fp16Run {
  TensorMap initial;
  TensorMap after_overflow;
  TensorMap after_both;
  TensorMap overflow_gradients;  // the gradients the build held after the overflowing step
  bool skipped_overflow = false;
  bool skipped_normal = true;
};

Fp16Run train_overflow_then_normal(StepHarness& harness) {
  Fp16Run run;
  const Batch overflowing = overflowing_batch();
  const Batch normal = normal_batch();
  run.initial = harness.parameters();
  run.skipped_overflow =
      harness.strategy->train_step(std::span<const Batch>(&overflowing, 1)).skipped;
  run.overflow_gradients = harness.gradients();
  run.after_overflow = harness.parameters();
  run.skipped_normal = harness.strategy->train_step(std::span<const Batch>(&normal, 1)).skipped;
  run.after_both = harness.parameters();
  return run;
}

TEST(PipelineFp16, FoundInfOnTheFirstStageSkipsTheStepOnEveryStageAsOneProcess) {
  at::set_num_threads(1);
  StepHarness single(fp16_overflow_options());
  const Fp16Run expected = train_overflow_then_normal(single);
  ASSERT_TRUE(expected.skipped_overflow);
  ASSERT_FALSE(expected.skipped_normal);
  ASSERT_TRUE(bitwise_equal(expected.after_overflow, expected.initial));
  ASSERT_FALSE(bitwise_equal(expected.after_both, expected.initial));

  auto ranks = run_threaded_ranks<Fp16Run>(kStages, [](int rank, int port) {
    HarnessOptions options = fp16_overflow_options();
    options.strategy = "pipeline";
    options.strategy_options =
        "schedule = \"1f1b\"\nmicro_batches = 2\nstages = [\"scaled\", \"head\"]\nrecord_step = 0";
    options.mesh = pipeline_mesh();
    options.as_rank(rank, kStages, port);
    StepHarness harness(options);
    Fp16Run run = train_overflow_then_normal(harness);
    harness.context.communicator->barrier();
    return run;
  });
  // Only the first stage overflowed: the second stage's own check found its gradients finite.
  EXPECT_FALSE(all_finite(ranks[0].overflow_gradients));
  EXPECT_TRUE(ranks[0].overflow_gradients.count("scaled.w_big"));
  EXPECT_TRUE(all_finite(ranks[1].overflow_gradients));
  EXPECT_TRUE(ranks[1].overflow_gradients.count("head.w1"));
  // The second stage skipped all the same.
  for (const char* name : {"head.w1", "head.b1"}) {
    EXPECT_TRUE(at::equal(ranks[1].after_overflow.at(name), ranks[1].initial.at(name))) << name;
  }
  for (int rank = 0; rank < kStages; ++rank) {
    const Fp16Run& run = ranks[static_cast<std::size_t>(rank)];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_TRUE(bitwise_equal(run.initial, expected.initial));
    EXPECT_TRUE(run.skipped_overflow);
    EXPECT_TRUE(bitwise_equal(run.after_overflow, run.initial))
        << "a stage stepped on the overflowing batch: parameters moved by up to "
        << max_difference(run.after_overflow, run.initial);
    EXPECT_FALSE(run.skipped_normal);
    EXPECT_TRUE(all_close_fp32(run.after_both, expected.after_both));
  }
}

}  // namespace
}  // namespace trainyard::testing
