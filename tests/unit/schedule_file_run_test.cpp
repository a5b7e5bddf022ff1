// The pipeline strategy running a schedule read from a file (strategy.schedule_file): zero
// bubble's own lists written out train bit for bit as the built schedule does, and a schedule no
// builder makes (every weight gradient deferred to the end of its rank's step) trains as one
// process does on the same batches, on 2 and 4 stages, and with tied embeddings across stages
// and activation checkpointing. Ranks run as threads over gloo.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <string>

#include "step_harness.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard::testing {
namespace {

constexpr int kSteps = 3;
constexpr std::int64_t kMicroBatches = 4;
const std::vector<std::int64_t> kFeatures = {6};
constexpr std::int64_t kClasses = 4;

HarnessOptions base_options() {
  HarnessOptions options;
  options.model_options = "hidden = [16, 12, 12, 8]";
  options.optimizer = "sgd";
  options.optimizer_options = "lr = 0.1\nmomentum = 0.9";
  options.input_shape = kFeatures;
  options.classes = kClasses;
  return options;
}

Batch batch_of(int step) {
  return random_batch(16, kFeatures, kClasses, 300 + static_cast<std::uint64_t>(step));
}

// The parameters after kSteps steps of `options` on `ranks` ranks (rank 0's gathered copy),
// each step on `batch_at(step)`.
TensorMap train(HarnessOptions options, int ranks,
                const std::function<Batch(int)>& batch_at = batch_of) {
  at::set_num_threads(1);
  const auto results = run_threaded_ranks<TensorMap>(ranks, [&](int rank, int port) {
    HarnessOptions mine = options;
    if (ranks > 1) mine.as_rank(rank, ranks, port);
    StepHarness harness(mine);
    for (int step = 0; step < kSteps; ++step) {
      Batch batch = batch_at(step);
      harness.strategy->train_step(std::span<const Batch>(&batch, 1));
    }
    TensorMap parameters = harness.parameters();
    if (harness.context.communicator) harness.context.communicator->barrier();
    return parameters;
  });
  return results.front();
}

HarnessOptions pipeline_options(int stages, const std::string& schedule_lines) {
  HarnessOptions options = base_options();
  options.strategy = "pipeline";
  options.strategy_options = "micro_batches = " + std::to_string(kMicroBatches) + "\n" +
                             schedule_lines + "\nrecord_step = 0";
  options.mesh = MeshRequest{.pp = stages, .dp_replicate = 1, .dp_shard = 1, .tp = 1};
  return options;
}

std::string written(const TempDir& dir, const PipelineSchedule& schedule) {
  const auto file = dir.write("schedule.csv", format_schedule_csv(schedule));
  return "schedule_file = \"" + file.string() + "\"";
}

bool bitwise_equal(const TensorMap& a, const TensorMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, tensor] : a) {
    if (!b.count(name) || !at::equal(tensor, b.at(name))) return false;
  }
  return true;
}

// Zero bubble with every weight gradient moved to the end of its rank's list: still one
// training step (each W after its I), but a schedule of no builder's.
PipelineSchedule weights_last(int stages) {
  PipelineSchedule schedule =
      build_pipeline_schedule("zero_bubble", {stages, static_cast<int>(kMicroBatches), 1});
  for (auto& actions : schedule.rank_actions) {
    std::stable_partition(actions.begin(), actions.end(), [](const PipelineAction& action) {
      return action.kind != PipelineActionKind::kBackwardWeight;
    });
  }
  return schedule;
}

TEST(ScheduleFileRun, ZeroBubbleFromAFileTrainsBitwiseAsBuilt) {
  TempDir dir;
  const PipelineSchedule built =
      build_pipeline_schedule("zero_bubble", {2, static_cast<int>(kMicroBatches), 1});
  const TensorMap from_builder = train(pipeline_options(2, "schedule = \"zero_bubble\""), 2);
  const TensorMap from_file = train(pipeline_options(2, written(dir, built)), 2);
  EXPECT_TRUE(bitwise_equal(from_file, from_builder));
}

TEST(ScheduleFileRun, AScheduleOfNoBuilderMatchesOneProcess) {
  const TensorMap single = train(base_options(), 1);
  for (int stages : {2, 4}) {
    TempDir dir;
    const TensorMap from_file =
        train(pipeline_options(stages, written(dir, weights_last(stages))), stages);
    EXPECT_TRUE(all_close_fp32(from_file, single)) << stages << " stages";
  }
}

// The gpt, whose head is tied to the token embedding across the two stages, with every block
// recomputed in backward, on the weights-last schedule: as one process on the same tokens.
TEST(ScheduleFileRun, TiedEmbeddingsAndActivationCheckpointingMatchOneProcess) {
  const auto gpt = [](HarnessOptions options) {
    options.model = "gpt";
    options.model_options = "n_layers = 2\nn_heads = 2\nd_model = 16\ndropout = 0.0";
    options.input_shape = {8};
    options.vocab_size = 32;
    options.step.activation_checkpointing = ActivationCheckpointing::parse("all");
    return options;
  };
  const auto tokens = [](int step) {
    at::Generator generator =
        at::detail::createCPUGenerator(500 + static_cast<std::uint64_t>(step));
    Batch batch;
    batch.size = 8;
    batch.tensors["input"] = at::randint(32, {8, 8}, generator, at::kLong);
    batch.tensors["target"] = batch.tensors["input"].roll(-1, 1);
    return batch;
  };
  const TensorMap single = train(gpt(base_options()), 1, tokens);
  TempDir dir;
  const TensorMap from_file =
      train(gpt(pipeline_options(2, written(dir, weights_last(2)))), 2, tokens);
  EXPECT_TRUE(all_close_fp32(from_file, single));
}

TEST(ScheduleFileRun, AFileForAnotherPipelineIsRefused) {
  TempDir dir;
  const std::string lines = written(dir, weights_last(4));
  const auto errors = run_threaded_ranks<std::string>(2, [&](int rank, int port) {
    HarnessOptions options = pipeline_options(2, lines);
    options.as_rank(rank, 2, port);
    return error_of([&] { StepHarness harness(options); });
  });
  for (const auto& error : errors) {
    EXPECT_HAS(error, "the schedule has 4 ranks' lines, the pipeline 2 ranks (parallel.pp)");
  }
}

}  // namespace
}  // namespace trainyard::testing
