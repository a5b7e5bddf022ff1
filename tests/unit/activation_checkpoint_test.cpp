// Activation checkpointing: gradients identical to the plain run (dropout on, autocast on,
// parameters shared between blocks), the RNG stream after backward unchanged, the block
// selection forms, and a smaller measured activation footprint.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "step_harness.hpp"
#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"

namespace {

using namespace trainyard;
using namespace trainyard::testing;

BuildContext vector_context(std::int64_t features, std::int64_t classes) {
  BuildContext context;
  context.data.input_shape = {features};
  context.data.num_classes = classes;
  return context;
}

std::shared_ptr<Model> make_model(const std::string& plugin, const std::string& options,
                                  const BuildContext& context) {
  at::manual_seed(3);
  auto model = bundled_registry().create<Model>(plugin, options_section("model", options), context);
  model->module().train();
  return model;
}

struct Pass {
  TensorMap gradients;
  torch::Tensor loss;
  torch::Tensor next_random;  // the RNG stream right after backward
};

// One forward and backward from a fixed RNG state (dropout draws from it), optionally under
// autocast.
Pass run_pass(Model& model, const std::vector<Block>& blocks, const Batch& batch,
              std::optional<torch::ScalarType> autocast = std::nullopt) {
  model.module().zero_grad(/*set_to_none=*/true);
  at::manual_seed(77);
  Pass pass;
  {
    AutocastGuard guard(torch::kCPU, autocast);
    pass.loss = model.loss(run_blocks(model, blocks, batch), batch);
  }
  pass.loss.backward();
  for (const auto& item : model.module().named_parameters(true)) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key() << " got no gradient";
    if (item.value().grad().defined()) pass.gradients[item.key()] = item.value().grad().clone();
  }
  pass.next_random = at::rand({4}, batch.at("input").options());
  return pass;
}

void expect_identical(const Pass& actual, const Pass& expected) {
  // The recompute runs the same kernels on the same inputs with the same random draws, so the
  // results are equal bit for bit, not merely close.
  EXPECT_TRUE(at::equal(actual.loss, expected.loss));
  ASSERT_EQ(actual.gradients.size(), expected.gradients.size());
  for (const auto& [name, gradient] : expected.gradients) {
    EXPECT_TRUE(at::equal(actual.gradients.at(name), gradient))
        << name << " differs by "
        << (actual.gradients.at(name) - gradient).abs().max().item<double>();
  }
  EXPECT_TRUE(at::equal(actual.next_random, expected.next_random))
      << "the recompute shifted the random stream";
}

const char* kDropoutMlp = "hidden = [48, 40, 32, 24]\ndropout = 0.5";

TEST(ActivationCheckpointing, GradientsIdenticalWithDropoutForAllAndEveryOther) {
  auto model = make_model("mlp", kDropoutMlp, vector_context(20, 5));
  Batch batch = random_batch(16, {20}, 5, 1);
  const std::vector<Block> plain = model->blocks();
  ASSERT_EQ(plain.size(), 5u);
  Pass expected = run_pass(*model, plain, batch);
  for (const std::string selection : {"all", "every:2", "blocks:hidden1,head"}) {
    SCOPED_TRACE(selection);
    auto blocks = with_activation_checkpointing(plain, ActivationCheckpointing::parse(selection));
    expect_identical(run_pass(*model, blocks, batch), expected);
  }
  // Dropout did act: another random stream gives other gradients, so a recompute with the wrong
  // masks would be seen.
  at::manual_seed(78);
  model->module().zero_grad(true);
  model->loss(run_blocks(*model, plain, batch), batch).backward();
  const std::string first = expected.gradients.begin()->first;
  EXPECT_FALSE(at::equal(model->module().named_parameters()[first].grad(),
                         expected.gradients.at(first)))
      << "dropout had no effect; the test would not see a wrong mask";
}

TEST(ActivationCheckpointing, GradientsIdenticalUnderBf16Autocast) {
  auto model = make_model("mlp", kDropoutMlp, vector_context(20, 5));
  Batch batch = random_batch(16, {20}, 5, 2);
  const std::vector<Block> plain = model->blocks();
  Pass expected = run_pass(*model, plain, batch, torch::kBFloat16);
  auto blocks = with_activation_checkpointing(plain, ActivationCheckpointing::parse("all"));
  expect_identical(run_pass(*model, blocks, batch, torch::kBFloat16), expected);
}

TEST(ActivationCheckpointing, CnnStagesGradientsIdentical) {
  BuildContext context;
  context.data.input_shape = {1, 12, 12};
  context.data.num_classes = 4;
  auto model = make_model("cnn", "channels = [4, 8]\nhidden = 16\ndropout = 0.3", context);
  Batch batch = random_batch(6, {1, 12, 12}, 4, 3);
  const std::vector<Block> plain = model->blocks();
  ASSERT_EQ(plain.front().name, "stage0");
  Pass expected = run_pass(*model, plain, batch);
  auto blocks = with_activation_checkpointing(plain, ActivationCheckpointing::parse("all"));
  expect_identical(run_pass(*model, blocks, batch), expected);
}

// A device backend that drives the host: by default its generator is the CPU's own (ATen's
// default generator, as DeviceBackend's rng_state() reads it).
class HostDevice : public DeviceBackend {
 public:
  bool available() const override { return true; }
  int device_count() const override { return 1; }
  torch::Device device(int) const override { return torch::kCPU; }
  void synchronize(int) override {}
  DeviceMemory memory(int) const override { return {}; }
  void manual_seed(std::uint64_t seed) override { at::manual_seed(seed); }
  void save_rng_state(StateDict&) const override {}
  void load_rng_state(const StateDict&) override {}

 protected:
  std::unique_ptr<DeviceEvent> make_event(int) override {
    return std::make_unique<HostClockEvent>();
  }
};

// A device backend for the host whose device generator is one of its own: only the backend knows
// it, as only a device's plugin knows how to reach an accelerator's generator, so a recompute that
// does not go through rng_state()/set_rng_state() draws a different dropout mask.
class OwnGeneratorDevice final : public HostDevice {
 public:
  void manual_seed(std::uint64_t seed) override { generator_.set_current_seed(seed); }
  torch::Tensor rng_state(int) const override {
    ++states_read;
    return generator_.get_state();
  }
  void set_rng_state(int, const torch::Tensor& state) override {
    ++states_set;
    generator_.set_state(state);
  }
  at::Generator generator() const { return generator_; }
  mutable int states_read = 0;
  int states_set = 0;

 private:
  at::Generator generator_ = at::make_generator<at::CPUGeneratorImpl>(11);
};

TEST(ActivationCheckpointing, RecomputeReplaysTheDeviceGeneratorThroughItsBackend) {
  auto device = std::make_shared<OwnGeneratorDevice>();
  torch::nn::Linear linear(8, 8);
  // Dropout drawing its mask from the device's generator.
  const Block block{"dropped", linear.ptr(), [layer = linear.ptr(), device](const Activations& x) {
                      const torch::Tensor y = layer->forward(x.hidden());
                      const torch::Tensor keep =
                          at::rand(y.sizes(), device->generator(), y.options()) > 0.5;
                      return x.with_hidden(y * keep * 2.0);
                    }};
  const torch::Tensor input = at::randn({4, 8});
  auto weight_gradient = [&](const std::vector<Block>& blocks) {
    linear->zero_grad(/*set_to_none=*/true);
    device->manual_seed(5);
    Activations x(input);
    for (const auto& each : blocks) x = each.forward(x);
    x.hidden().pow(2).sum().backward();
    return linear->weight.grad().clone();
  };
  const torch::Tensor expected = weight_gradient({block});
  const torch::Tensor through_backend = weight_gradient(
      with_activation_checkpointing({block}, ActivationCheckpointing::parse("all"), device));
  EXPECT_TRUE(at::equal(through_backend, expected))
      << "the recompute drew another mask from the device's generator";
  EXPECT_GE(device->states_read, 2) << "recorded before the forward, saved around the recompute";
  EXPECT_GE(device->states_set, 2) << "set for the recompute, then put back";
  // Without the backend the recompute cannot reach the generator: the gradients differ, so the
  // comparison above would see a wrong mask.
  const torch::Tensor without_backend = weight_gradient(
      with_activation_checkpointing({block}, ActivationCheckpointing::parse("all")));
  EXPECT_FALSE(at::equal(without_backend, expected));
}

TEST(ActivationCheckpointing, GradientsIdenticalWithDropoutOnCuda) {
  // The recompute restores the CUDA generator that dropout on the GPU draws from.
  if (!torch::cuda::is_available()) TRAINYARD_SKIP_WITHOUT_GPU() << "no CUDA device";
  auto model = make_model("mlp", kDropoutMlp, vector_context(20, 5));
  model->module().to(torch::kCUDA);
  Batch batch = random_batch(16, {20}, 5, 1).to(torch::kCUDA);
  const std::vector<Block> plain = model->blocks();
  for (auto autocast : {std::optional<torch::ScalarType>(), std::optional(torch::kBFloat16)}) {
    model->module().zero_grad(true);
    at::manual_seed(77);
    torch::Tensor loss;
    {
      AutocastGuard guard(torch::kCUDA, autocast);
      loss = model->loss(run_blocks(*model, plain, batch), batch);
    }
    loss.backward();
    TensorMap expected;
    for (const auto& item : model->module().named_parameters(true)) {
      expected[item.key()] = item.value().grad().clone();
    }
    torch::Tensor expected_next = at::rand({4}, batch.at("input").options());
    auto blocks = with_activation_checkpointing(plain, ActivationCheckpointing::parse("all"));
    model->module().zero_grad(true);
    at::manual_seed(77);
    {
      AutocastGuard guard(torch::kCUDA, autocast);
      loss = model->loss(run_blocks(*model, blocks, batch), batch);
    }
    loss.backward();
    for (const auto& item : model->module().named_parameters(true)) {
      EXPECT_TRUE(at::equal(item.value().grad(), expected.at(item.key())))
          << item.key() << (autocast ? " under bf16 autocast" : "");
    }
    EXPECT_TRUE(at::equal(at::rand({4}, batch.at("input").options()), expected_next));
  }
}

// What wraps a block can tell the recompute in backward from the forward: fsdp's units prefetch
// the next unit and free their own after a forward, but not after a recompute, whose backward
// follows at once.
TEST(ActivationCheckpointing, ARecomputeIsToldApartFromTheForward) {
  auto layer = std::make_shared<torch::nn::LinearImpl>(4, 4);
  std::vector<bool> seen;
  const auto forward = [&](const Activations& x) {
    seen.push_back(recomputing_checkpointed_forward());
    return x.with_hidden(layer->forward(x.hidden()).tanh());
  };
  const torch::Tensor leaf = at::randn({3, 4}).requires_grad_(true);
  const Activations out =
      checkpointed_call(forward, Activations(leaf), {layer->weight, layer->bias});
  EXPECT_FALSE(recomputing_checkpointed_forward());
  out.hidden().sum().backward();
  EXPECT_EQ(seen, (std::vector<bool>{false, true}));
  EXPECT_FALSE(recomputing_checkpointed_forward()) << "the flag outlives the recompute";
  EXPECT_TRUE(leaf.grad().defined());
}

// Blocks pass a bundle: the first adds a gate that the third reads, the second passes it on
// without knowing it. Recomputing any of them gives the gradients of the plain run, the gate's
// included.
TEST(ActivationCheckpointing, BundlesOfNamedTensorsFlowThroughRecomputedBlocks) {
  at::manual_seed(6);
  auto first = std::make_shared<torch::nn::LinearImpl>(6, 6);
  auto second = std::make_shared<torch::nn::LinearImpl>(6, 6);
  auto third = std::make_shared<torch::nn::LinearImpl>(6, 6);
  std::vector<Block> plain = {
      {"first", first,
       [first](const Activations& x) {
         Activations out = x.with_hidden(first->forward(x.hidden()).tanh());
         out.tensors["gate"] = at::sigmoid(x.hidden().sum(1, /*keepdim=*/true));
         return out;
       }},
      {"second", second,
       [second](const Activations& x) { return x.with_hidden(second->forward(x.hidden()).relu()); }},
      {"third", third,
       [third](const Activations& x) {
         return x.with_hidden(third->forward(x.hidden()) * x.tensors.at("gate"));
       }},
  };
  const torch::Tensor input = at::randn({5, 6});
  auto gradients = [&](const std::vector<Block>& blocks) {
    for (auto* layer : {first.get(), second.get(), third.get()}) layer->zero_grad(true);
    torch::Tensor leaf = input.clone().requires_grad_(true);
    Activations x(leaf);
    for (const auto& block : blocks) x = block.forward(x);
    EXPECT_EQ(x.tensors.size(), 2u) << "the gate travels to the end";
    x.hidden().pow(2).sum().backward();
    return std::vector<torch::Tensor>{first->weight.grad().clone(), second->weight.grad().clone(),
                                      third->weight.grad().clone(), leaf.grad().clone()};
  };
  const auto expected = gradients(plain);
  for (const std::string selection : {"all", "blocks:first", "blocks:second", "blocks:third"}) {
    const auto actual =
        gradients(with_activation_checkpointing(plain, ActivationCheckpointing::parse(selection)));
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(at::allclose(actual[i], expected[i], 1.3e-6, 1e-5))
          << selection << " gradient " << i;
    }
  }
}

TEST(ActivationCheckpointing, ParametersSharedBetweenBlocksGetBothContributions) {
  at::manual_seed(4);
  auto shared = std::make_shared<torch::nn::LinearImpl>(6, 6);
  auto own = std::make_shared<torch::nn::LinearImpl>(6, 6);
  std::vector<Block> plain = {
      {"first", shared,
       [shared](const Activations& x) { return Activations(shared->forward(x.hidden()).tanh()); }},
      {"second", own,
       [own](const Activations& x) { return Activations(own->forward(x.hidden()).relu()); }},
      {"tied", shared,
       [shared](const Activations& x) { return Activations(shared->forward(x.hidden()) * 2); }},
  };
  torch::Tensor input = at::randn({5, 6});
  auto gradients = [&](const std::vector<Block>& blocks) {
    shared->zero_grad(true);
    own->zero_grad(true);
    Activations x(input);
    for (const auto& block : blocks) x = block.forward(x);
    x.hidden().pow(2).sum().backward();
    return std::vector<torch::Tensor>{shared->weight.grad().clone(), shared->bias.grad().clone(),
                                      own->weight.grad().clone()};
  };
  auto expected = gradients(plain);
  for (const std::string selection : {"all", "blocks:tied", "every:2"}) {
    auto actual = gradients(with_activation_checkpointing(plain, ActivationCheckpointing::parse(selection)));
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(at::equal(actual[i], expected[i])) << selection << " gradient " << i;
    }
  }
}

TEST(ActivationCheckpointing, WithoutGradItIsAPlainCall) {
  auto model = make_model("mlp", "hidden = [8]", vector_context(5, 3));
  Batch batch = random_batch(4, {5}, 3, 5);
  auto blocks = with_activation_checkpointing(model->blocks(), ActivationCheckpointing::parse("all"));
  at::NoGradGuard no_grad;
  torch::Tensor output = run_blocks(*model, blocks, batch);
  EXPECT_FALSE(output.requires_grad());
  EXPECT_TRUE(at::equal(output, run_blocks(*model, model->blocks(), batch)));
}

TEST(ActivationCheckpointing, SelectionForms) {
  using Mode = ActivationCheckpointing::Mode;
  EXPECT_EQ(ActivationCheckpointing::parse("none").mode, Mode::kNone);
  EXPECT_EQ(ActivationCheckpointing::parse("all").mode, Mode::kAll);
  EXPECT_EQ(ActivationCheckpointing::parse("every:1").mode, Mode::kAll);
  auto every = ActivationCheckpointing::parse("every:3");
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < 8; ++i) {
    if (every.selects(i, "b")) chosen.push_back(i);
  }
  EXPECT_EQ(chosen, (std::vector<std::size_t>{0, 3, 6}));
  EXPECT_EQ(every.to_string(), "every:3");
  auto named = ActivationCheckpointing::parse("blocks:stage0,head");
  EXPECT_TRUE(named.selects(5, "head"));
  EXPECT_FALSE(named.selects(0, "stage1"));
  EXPECT_EQ(named.to_string(), "blocks:stage0,head");
  for (const std::string bad : {"some", "every:0", "every:", "every:2x", "blocks:", "blocks:a,,b",
                                "All"}) {
    const std::string message = error_of([&] { ActivationCheckpointing::parse(bad); });
    EXPECT_TRUE(contains(message, "'" + bad + "'"));
  }
  auto model = make_model("mlp", "hidden = [8]", vector_context(5, 3));
  const std::string message = error_of([&] {
    with_activation_checkpointing(model->blocks(), ActivationCheckpointing::parse("blocks:stage9"));
  });
  EXPECT_TRUE(contains(message, "'stage9'"));
  EXPECT_TRUE(contains(message, "hidden0, head"));
}

TEST(AllocationTracker, CountsTheBytesAllocatedAndFreedWhileItLives) {
  torch::Tensor before = at::empty({1000});
  AllocationTracker tracker;
  EXPECT_EQ(tracker.current_bytes(), 0);
  {
    torch::Tensor a = at::empty({1000});
    torch::Tensor b = at::empty({500}, at::kDouble);
    EXPECT_EQ(tracker.current_bytes(), 1000 * 4 + 500 * 8);
  }
  before.reset();  // allocated before the tracker: not counted either way
  EXPECT_EQ(tracker.current_bytes(), 0);
  EXPECT_EQ(tracker.peak_bytes(), 1000 * 4 + 500 * 8);
  tracker.reset_peak();
  EXPECT_EQ(tracker.peak_bytes(), 0);
}

// A tensor the tracked thread allocated and another thread frees (as a communication worker
// drops the last reference to a collective's tensors) is charged back to the tracker; one the
// other thread allocates is not the tracker's.
TEST(AllocationTracker, AFreeOnAnotherThreadIsChargedToTheTrackerThatCounted) {
  AllocationTracker tracker;
  torch::Tensor handed_over = at::empty({1000});
  EXPECT_EQ(tracker.current_bytes(), 1000 * 4);
  std::thread other([moved = std::move(handed_over)]() mutable {
    torch::Tensor own = at::empty({700});
    moved.reset();
  });
  other.join();
  EXPECT_EQ(tracker.current_bytes(), 0);
  EXPECT_EQ(tracker.peak_bytes(), 1000 * 4);
}

// A generation counts what was allocated since it started and is still live, whatever older
// memory is freed meanwhile (a step freeing last step's gradients before its forward).
TEST(AllocationTracker, AGenerationCountsOnlyWhatItAllocatedAndKeeps) {
  AllocationTracker tracker;
  torch::Tensor old = at::empty({1000});
  tracker.start_generation();
  torch::Tensor kept = at::empty({300});
  { torch::Tensor dropped = at::empty({200}); }
  old.reset();
  EXPECT_EQ(tracker.generation_bytes(), 300 * 4);
  EXPECT_EQ(tracker.current_bytes(), 300 * 4);
  tracker.start_generation();
  EXPECT_EQ(tracker.generation_bytes(), 0);
  kept.reset();  // of the previous generation: the new one does not go below zero
  EXPECT_EQ(tracker.generation_bytes(), 0);
}

// Past the limit a CPU allocation fails as a device's allocator fails when it runs out, and the
// first refusal is remembered; an untracked scope's allocations count against nothing.
TEST(AllocationTracker, ALimitRefusesAllocationsPastItAsADeviceRunsOut) {
  AllocationTracker tracker;
  tracker.limit_cpu_bytes(4000);
  torch::Tensor fits = at::empty({900});
  EXPECT_FALSE(tracker.refusal().has_value());
  EXPECT_THROW(at::empty({200}), c10::OutOfMemoryError);
  ASSERT_TRUE(tracker.refusal().has_value());
  EXPECT_EQ(tracker.refusal()->asked, 200 * 4);
  EXPECT_EQ(tracker.refusal()->live, 900 * 4);
  EXPECT_EQ(tracker.current_bytes(), 900 * 4);
  {
    AllocationTracker::Untracked untracked;
    torch::Tensor data = at::empty({10000});
    EXPECT_EQ(tracker.current_bytes(), 900 * 4);
  }
  EXPECT_EQ(tracker.current_bytes(), 900 * 4);
}

// Resident memory of this process, from /proc/self/statm.
std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t pages = 0;
  std::int64_t resident = 0;
  statm >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// LibTorch's raw_allocate / raw_deallocate (kernels' scratch space) go through the allocator
// in front once a tracker was made: what is made outside every tracker is freed when handed
// back, and what a tracker counted is charged back to it.
TEST(AllocationTracker, RawAllocationsAreFreedWhenHandedBackWithOrWithoutATracker) {
  { AllocationTracker installs_the_tracking_allocator; }
  c10::Allocator* allocator = c10::GetCPUAllocator();
  constexpr std::size_t kBytes = 32 << 20;
  const std::int64_t before = resident_bytes();
  for (int i = 0; i < 32; ++i) {
    void* scratch = allocator->raw_allocate(kBytes);
    std::memset(scratch, 1, kBytes);  // resident, as a kernel's scratch space is
    allocator->raw_deallocate(scratch);
  }
  // A gibibyte written: what stays resident is at most a few of the blocks.
  EXPECT_LT(resident_bytes() - before, std::int64_t{256} << 20);
  AllocationTracker tracker;
  void* counted = allocator->raw_allocate(1000);
  EXPECT_EQ(tracker.current_bytes(), 1000);
  allocator->raw_deallocate(counted);
  EXPECT_EQ(tracker.current_bytes(), 0);
}

struct Footprint {
  std::int64_t held_after_forward = 0;  // what the graph keeps for backward (and the output)
  std::int64_t peak = 0;                // the most live at once during forward and backward
};

// Activation memory of one training forward and backward: bytes allocated above what existed
// before (parameters, their gradients, the input), counted by the allocator.
Footprint measure(torch::nn::Module& module, const std::function<torch::Tensor()>& loss_of) {
  // Gradients exist beforehand and accumulate in place, so they are not counted.
  loss_of().backward();
  module.zero_grad(/*set_to_none=*/false);
  Footprint footprint;
  AllocationTracker tracker;
  torch::Tensor loss = loss_of();
  footprint.held_after_forward = tracker.current_bytes();
  loss.backward();
  loss.reset();
  footprint.peak = tracker.peak_bytes();
  return footprint;
}

void report(const std::string& what, const std::vector<std::pair<std::string, Footprint>>& runs) {
  std::cout << what << "\n";
  for (const auto& [name, footprint] : runs) {
    std::cout << "  " << name << ": held after forward " << footprint.held_after_forward
              << " B, peak " << footprint.peak << " B\n";
  }
}

TEST(ActivationCheckpointing, CnnStagesHoldLessActivationMemory) {
  BuildContext context;
  context.data.input_shape = {1, 28, 28};
  context.data.num_classes = 10;
  auto model = make_model("cnn", "channels = [16, 32, 32]", context);
  Batch batch = random_batch(32, {1, 28, 28}, 10, 6);
  const std::vector<Block> plain = model->blocks();
  auto footprint = [&](const std::string& selection) {
    auto blocks = with_activation_checkpointing(plain, ActivationCheckpointing::parse(selection));
    return measure(model->module(), [&] { return model->loss(run_blocks(*model, blocks, batch), batch); });
  };
  Footprint none = footprint("none");
  Footprint every = footprint("every:2");
  Footprint all = footprint("all");
  report("cnn [16, 32, 32], batch 32", {{"none", none}, {"every:2", every}, {"all", all}});
  ASSERT_GT(none.held_after_forward, 0);
  // Each conv stage keeps its conv, BatchNorm, ReLU and pooling outputs (and pooling indices);
  // checkpointed, it keeps only its input.
  EXPECT_LT(all.held_after_forward * 3, none.held_after_forward);
  EXPECT_LT(every.held_after_forward, none.held_after_forward);
  EXPECT_LT(all.held_after_forward, every.held_after_forward);
  // The peak comes while the largest block is recomputed and differentiated: here stage0 holds
  // most of the activations, so the peak drops little (uniform blocks: next test).
  EXPECT_LT(all.peak, none.peak);
}

TEST(ActivationCheckpointing, UniformWideBlocksHaveALowerPeak) {
  // Residual feed-forward blocks shaped like a transformer's MLP (d -> 4d -> d): each keeps
  // 9d per sample without checkpointing and d with it, and backward needs one block at a time.
  const std::int64_t width = 64;
  const int depth = 8;
  at::manual_seed(9);
  auto root = std::make_shared<torch::nn::Module>();
  std::vector<Block> plain;
  for (int i = 0; i < depth; ++i) {
    auto up = root->register_module("up" + std::to_string(i), torch::nn::Linear(width, 4 * width));
    auto down = root->register_module("down" + std::to_string(i), torch::nn::Linear(4 * width, width));
    auto block = std::make_shared<torch::nn::Module>();
    block->register_module("up", up);
    block->register_module("down", down);
    plain.push_back({"ffn" + std::to_string(i), block, [up, down](const Activations& x) {
                       return x.with_hidden(x.hidden() +
                                            down->forward(at::gelu(up->forward(x.hidden()))));
                     }});
  }
  torch::Tensor input = at::randn({256, width});
  auto footprint = [&](const std::string& selection) {
    auto blocks = with_activation_checkpointing(plain, ActivationCheckpointing::parse(selection));
    return measure(*root, [&] {
      Activations x(input);
      for (const auto& block : blocks) x = block.forward(x);
      return x.hidden().pow(2).mean();
    });
  };
  Footprint none = footprint("none");
  Footprint every = footprint("every:2");
  Footprint all = footprint("all");
  report("8 residual d->4d->d blocks, d 64, batch 256",
         {{"none", none}, {"every:2", every}, {"all", all}});
  EXPECT_LT(all.held_after_forward * 4, none.held_after_forward);
  EXPECT_LT(all.peak * 2, none.peak);
  EXPECT_LT(every.peak, none.peak);
  EXPECT_LT(all.peak, every.peak);
}

// The host's backend hands out the CPU's own generator (HostDevice): a checkpointed block keeps
// one copy of its state, as it does with no backend, not one copy per generator it reaches.
TEST(ActivationCheckpointing, AGeneratorReachedTwiceIsRecordedOnce) {
  auto model = make_model("mlp", "hidden = [32, 16]", vector_context(24, 4));
  Batch batch = random_batch(8, {24}, 4, 2);
  const std::vector<Block> plain = model->blocks();
  auto footprint = [&](std::shared_ptr<DeviceBackend> backend) {
    auto blocks =
        with_activation_checkpointing(plain, ActivationCheckpointing::parse("all"), backend);
    return measure(model->module(),
                   [&] { return model->loss(run_blocks(*model, blocks, batch), batch); });
  };
  const Footprint alone = footprint(nullptr);
  const Footprint through_host = footprint(std::make_shared<HostDevice>());
  EXPECT_EQ(through_host.held_after_forward, alone.held_after_forward)
      << "a block kept the CPU generator's state twice";
}

}  // namespace
