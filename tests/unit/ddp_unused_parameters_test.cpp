// ddp's find_unused_parameters: a model whose "gate" layer runs only for samples with a
// positive first feature (all on rank 0, none on rank 1) and whose "unused" layer never runs.
// Two ranks as threads over gloo against one process on the global batch, with AdamW and weight
// decay, which moves any parameter that holds a gradient, even a zero one.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "step_harness.hpp"
#include "trainyard/models/classification.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard::testing {
namespace {

constexpr int kRanks = 2;
constexpr std::int64_t kFeatures = 6;
constexpr std::int64_t kClasses = 4;
constexpr int kSteps = 3;

class GatedModel : public Model {
 public:
  GatedModel() : root_(std::make_shared<torch::nn::Module>("gated")) {
    trunk_ = root_->register_module("trunk", torch::nn::Linear(kFeatures, 8));
    gate_ = root_->register_module("gate", torch::nn::Linear(8, 8));
    unused_ = root_->register_module("unused", torch::nn::Linear(8, 8));
    head_ = root_->register_module("head", torch::nn::Linear(8, kClasses));
  }

  torch::nn::Module& module() override { return *root_; }
  std::vector<Block> blocks() override {
    return {{"all", root_,
             [this](const Activations& x) { return x.with_hidden(forward(x.hidden())); }}};
  }
  torch::Tensor input(const Batch& batch) override { return batch.at("input"); }
  torch::Tensor loss(const torch::Tensor& output, const Batch& batch) override {
    return classification_loss(output, batch);
  }
  double flops_per_sample() const override { return 0; }

 private:
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor hidden = trunk_->forward(x).relu();
    const torch::Tensor selected = (x.select(1, 0) > 0).nonzero().squeeze(1);
    if (selected.numel() > 0) {
      hidden = hidden.index_add(0, selected, gate_->forward(hidden.index_select(0, selected)));
    }
    return head_->forward(hidden);
  }

  std::shared_ptr<torch::nn::Module> root_;
  torch::nn::Linear trunk_{nullptr}, gate_{nullptr}, unused_{nullptr}, head_{nullptr};
};

// Rank 0's samples run the gate for half of its samples, rank 1's for none.
Batch batch_of_rank(int rank) {
  Batch batch = random_batch(8, {kFeatures}, kClasses, 70 + static_cast<std::uint64_t>(rank));
  at::Tensor first = batch.tensors["input"].select(1, 0);
  first.fill_(-1);
  if (rank == 0) first.narrow(0, 0, 4).fill_(1);
  return batch;
}

HarnessOptions gated_options() {
  HarnessOptions options;
  options.model_factory = [](const BuildContext&) { return std::make_shared<GatedModel>(); };
  options.optimizer = "adamw";
  options.optimizer_options = "lr = 0.01\nweight_decay = 0.1";
  return options;
}

TensorMap train(StepHarness& harness, const Batch& batch) {
  for (int step = 0; step < kSteps; ++step) {
    harness.strategy->train_step(std::span<const Batch>(&batch, 1));
  }
  return harness.parameters();
}

TEST(DdpUnusedParameters, MatchOneProcessOnTheGlobalBatch) {
  at::set_num_threads(1);
  StepHarness reference(gated_options());
  const TensorMap initial = reference.parameters();
  Batch global;
  global.size = 8 * kRanks;
  for (const char* name : {"input", "target"}) {
    global.tensors[name] = at::cat({batch_of_rank(0).at(name), batch_of_rank(1).at(name)});
  }
  const TensorMap expected = train(reference, global);
  auto ranks = run_threaded_ranks<TensorMap>(kRanks, [](int rank, int port) {
    HarnessOptions options = gated_options();
    options.strategy = "ddp";
    options.strategy_options = "find_unused_parameters = true";
    options.as_rank(rank, kRanks, port);
    StepHarness harness(options);
    TensorMap parameters = train(harness, batch_of_rank(rank));
    harness.context.communicator->barrier();
    return parameters;
  });
  // The gate trained on rank 0's samples only, as one process trains it on the global batch's.
  EXPECT_FALSE(all_close_fp32(expected, initial));
  EXPECT_FALSE(at::allclose(expected.at("gate.weight"), initial.at("gate.weight")));
  // The layer no rank ran holds no gradient, so weight decay left it alone, as in one process.
  EXPECT_TRUE(at::equal(expected.at("unused.weight"), initial.at("unused.weight")));
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_TRUE(all_close_fp32(ranks[static_cast<std::size_t>(rank)], expected)) << "rank " << rank;
    EXPECT_TRUE(at::equal(ranks[static_cast<std::size_t>(rank)].at("unused.weight"),
                          initial.at("unused.weight")));
  }
}

TEST(DdpUnusedParameters, WithoutTheOptionAnUnusedParameterIsNamed) {
  at::set_num_threads(1);
  auto errors = run_threaded_ranks<std::string>(kRanks, [](int rank, int port) {
    HarnessOptions options = gated_options();
    options.strategy = "ddp";
    options.as_rank(rank, kRanks, port);
    StepHarness harness(options);
    Batch batch = batch_of_rank(rank);
    std::string message;
    try {
      harness.strategy->train_step(std::span<const Batch>(&batch, 1));
    } catch (const Error& error) {
      message = error.what();
    }
    harness.context.communicator->barrier();
    return message;
  });
  for (const std::string& message : errors) {
    EXPECT_NE(message.find("unused.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("find_unused_parameters = true"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace trainyard::testing
