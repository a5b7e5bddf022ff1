// The pipeline strategy in processes over loopback: every schedule on 2 and 4 stages against one
// process training on the same batches (losses and parameters within PyTorch's pipelining
// tolerances), data parallel across pipelines, accumulation, clipping, recomputation, loss
// reductions, fp16's skipped steps, evaluation, checkpoints resumed on another cut or strategy,
// the measured timeline, and a stage that dies.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/parallel/pipeline_timeline.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// PyTorch's own pipelining tests compare losses at fp32's and parameters at these.
constexpr double kLossRtol = 1.3e-6;
constexpr double kLossAtol = 1e-5;
constexpr double kParameterRtol = 1e-5;
constexpr double kParameterAtol = 4e-5;

// Batches of 18 samples: split into 4 or 8 micro-batches they are uneven (4, 5, 4, 5), so the
// micro-batch losses only add up to the batch's when each weighs by its share of the terms.
constexpr int kBatch = 18;

// An mlp of 8 blocks (7 hidden layers and the head) on synthetic images.
std::string mlp_recipe() {
  return R"(
[run]
seed = 3
max_steps = 6
eval = false
log_every = 1

[loader]
workers = 0
batch_size = 18

[dataset]
plugin = "synthetic"
samples = 512
eval_samples = 40
input_shape = [1, 8, 8]

[model]
plugin = "mlp"
hidden = [32, 24, 16, 16, 16, 16, 16]

[optimizer]
plugin = "adamw"
lr = 0.01
weight_decay = 0.01

[sinks.console]
[sinks.jsonl]
)";
}

// A gpt of 8 blocks (embedding, 6 layers, head tied to the embedding) on a small byte-level text.
std::string gpt_recipe(const TempDir& dir) {
  std::string corpus;
  for (int i = 0; i < 400; ++i) {
    corpus += "sample " + std::to_string(i * 7919 % 1000) + " of the small corpus, line " +
              std::to_string(i) + ".\n";
  }
  dir.write("corpus.txt", corpus);
  return R"(
[run]
seed = 5
max_steps = 6
eval = false
log_every = 1

[loader]
workers = 0
batch_size = 18

[dataset]
plugin = "text"
path = ")" +
         (dir / "corpus.txt").string() +
         R"("
tokenizer = "byte"
seq_len = 16
cache = ")" +
         (dir / "cache").string() +
         R"("

[model]
plugin = "gpt"
n_layers = 6
n_heads = 2
d_model = 16

[optimizer]
plugin = "adamw"
lr = 0.01
weight_decay = 0.01

[sinks.console]
[sinks.jsonl]
)";
}

// The cnn without BatchNorm: in a pipeline BatchNorm would normalise each micro-batch by its
// own statistics (as ddp without sync_batchnorm does per rank), which one process on the whole
// batch does not.
std::string cnn_recipe() {
  std::string text = mlp_recipe();
  const std::string mlp = "plugin = \"mlp\"\nhidden = [32, 24, 16, 16, 16, 16, 16]";
  text.replace(text.find(mlp), mlp.size(),
               "plugin = \"cnn\"\nchannels = [4, 8, 8]\nhidden = 16\nbatch_norm = false");
  return text;
}

fs::path write_recipe(const TempDir& dir, const std::string& model) {
  if (model == "cnn") return dir.write("recipe.toml", cnn_recipe());
  return dir.write("recipe.toml", model == "gpt" ? gpt_recipe(dir) : mlp_recipe());
}

struct Schedule {
  std::string name;
  int virtual_stages = 1;
};

const std::vector<Schedule> kSchedules = {
    {"gpipe"}, {"1f1b"}, {"interleaved_1f1b", 2}, {"zero_bubble"}, {"zero_bubble_v", 2}};

std::vector<std::string> pipeline_sets(int stages, const Schedule& schedule, int micro_batches) {
  return {"--set", "strategy.plugin=pipeline",
          "--set", "parallel.pp=" + std::to_string(stages),
          "--set", "strategy.schedule=" + schedule.name,
          "--set", "strategy.virtual_stages=" + std::to_string(schedule.virtual_stages),
          "--set", "strategy.micro_batches=" + std::to_string(micro_batches)};
}

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void expect_matches(const fs::path& single, const fs::path& pipeline) {
  expect_same_losses_within(single, pipeline, kLossRtol, kLossAtol);
  expect_same_model_within(single / "final.pt", pipeline / "final.pt", kParameterRtol,
                           kParameterAtol);
}

// Every schedule on `stages` processes (micro-batches: 4 on 2 stages, 8 on 4) against one
// process on the same batches; `extra` applies to every run.
void expect_every_schedule_matches_single(const std::string& model, int stages,
                                          const std::vector<std::string>& extra = {}) {
  TempDir dir;
  const fs::path recipe = write_recipe(dir, model);
  auto single = run_one_process(recipe, dir / "single", extra);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  for (const Schedule& schedule : kSchedules) {
    SCOPED_TRACE(schedule.name);
    const fs::path out = dir / schedule.name;
    auto run = run_launched(stages, recipe, out,
                            joined(pipeline_sets(stages, schedule, stages == 2 ? 4 : 8), extra));
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    EXPECT_HAS(run.err, "pipeline: " + schedule.name);
    expect_matches(dir / "single", out);
  }
}

// The mlp's runs are in the full grid (label full): the gpt runs every schedule on 2 and 4 stages
// and the cnn (BatchNorm) on 2 in every test run.
TEST(FullPipelineParity, MlpEveryScheduleOnTwoStagesMatchesOneProcess) {
  expect_every_schedule_matches_single("mlp", 2);
}

TEST(FullPipelineParity, MlpEveryScheduleOnFourStagesMatchesOneProcess) {
  expect_every_schedule_matches_single("mlp", 4);
}

TEST(PipelineParity, CnnEveryScheduleOnTwoStagesMatchesOneProcess) {
  expect_every_schedule_matches_single("cnn", 2);
}

TEST(PipelineParity, GptEveryScheduleOnTwoStagesMatchesOneProcess) {
  expect_every_schedule_matches_single("gpt", 2);
}

TEST(PipelineParity, GptEveryScheduleOnFourStagesMatchesOneProcess) {
  expect_every_schedule_matches_single("gpt", 4);
}

// Two pipelines of two stages side by side (dp 2 x pp 2 on 4 processes), each on its half of
// every global batch, against one process on the whole batch.
void expect_data_parallel_pipelines_match(const std::string& model, const Schedule& schedule) {
  TempDir dir;
  const fs::path recipe = write_recipe(dir, model);
  auto single = run_one_process(recipe, dir / "single", {"--set", "loader.batch_size=18"});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto run = run_launched(4, recipe, dir / "dp2pp2",
                          joined(pipeline_sets(2, schedule, 4), {"--set", "loader.batch_size=9"}));
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  expect_matches(dir / "single", dir / "dp2pp2");
}

TEST(PipelineParity, MlpDataParallelTwoByPipelineTwoMatchesOneProcess) {
  expect_data_parallel_pipelines_match("mlp", {"1f1b"});
}

TEST(PipelineParity, GptDataParallelTwoByPipelineTwoMatchesOneProcess) {
  expect_data_parallel_pipelines_match("gpt", {"zero_bubble"});
}

// Each stage's parameters sharded over its data-parallel pair (as fsdp's full and grad_op
// modes): dp 2 x pp 2 still trains as one process on the whole batch, tied weights included.
TEST(PipelineParity, ShardedDataParallelTwoByPipelineTwoMatchesOneProcess) {
  for (const std::string model : {"gpt", "mlp"}) {
    TempDir dir;
    const fs::path recipe = write_recipe(dir, model);
    auto single = run_one_process(recipe, dir / "single", {"--set", "run.max_grad_norm=0.5"});
    ASSERT_EQ(single.exit_code, 0) << describe(single);
    for (const std::string sharding : {"full", "grad_op"}) {
      SCOPED_TRACE(model + " " + sharding);
      const fs::path out = dir / sharding;
      auto run = run_launched(
          4, recipe, out,
          joined(pipeline_sets(2, {"interleaved_1f1b", 2}, 4),
                 {"--set", "loader.batch_size=9", "--set", "strategy.dp_sharding=" + sharding,
                  "--set", "run.max_grad_norm=0.5"}));
      ASSERT_EQ(run.exit_code, 0) << describe(run);
      expect_matches(dir / "single", out);
    }
  }
}

// Accumulation over 2 batches, clipping to a global norm small enough to act on every step, and
// recomputation of every block compose with the pipeline as they do with one process.
TEST(PipelineParity, AccumulationClippingAndRecomputationMatchOneProcess) {
  TempDir dir;
  const fs::path recipe = write_recipe(dir, "gpt");
  const std::vector<std::string> common = {
      "--set", "loader.batch_size=9",    "--set", "run.grad_accumulation=2",
      "--set", "run.max_grad_norm=0.05", "--set", "run.activation_checkpointing=all"};
  auto single = run_one_process(recipe, dir / "single", common);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  for (const Schedule& schedule :
       {Schedule{"1f1b"}, Schedule{"zero_bubble"}, Schedule{"zero_bubble_v", 2}}) {
    SCOPED_TRACE(schedule.name);
    const fs::path out = dir / schedule.name;
    auto run = run_launched(2, recipe, out, joined(pipeline_sets(2, schedule, 4), common));
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    expect_matches(dir / "single", out);
  }
  // The norm was computed over both stages: the logged norms match too.
  const auto single_lines = of_phase(read_metrics(dir / "single" / "metrics.jsonl"), "train");
  const auto pipeline_lines = of_phase(read_metrics(dir / "1f1b" / "metrics.rank0.jsonl"), "train");
  ASSERT_EQ(single_lines.size(), pipeline_lines.size());
  for (std::size_t i = 0; i < single_lines.size(); ++i) {
    EXPECT_NEAR(pipeline_lines[i].at("grad_norm"), single_lines[i].at("grad_norm"),
                1e-5 + 1e-5 * single_lines[i].at("grad_norm"))
        << "step " << i + 1;
  }
}

// A loss summed over the batch: micro-batch losses add up (no weights).
TEST(PipelineParity, SummedLossMatchesOneProcess) {
  TempDir dir;
  const fs::path recipe = write_recipe(dir, "mlp");
  const std::vector<std::string> sum = {"--set", "model.loss_reduction=sum", "--set",
                                        "optimizer.lr=0.0005"};
  auto single = run_one_process(recipe, dir / "single", sum);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto run = run_launched(2, recipe, dir / "pipeline", joined(pipeline_sets(2, {"gpipe"}, 4), sum));
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  expect_matches(dir / "single", dir / "pipeline");
}

// fp16 with a loss scale so large that the first steps overflow: every stage skips exactly the
// steps the single process skips, because the stages agree on non-finite gradients.
TEST(PipelineParity, Fp16SkipsTheSameStepsOnEveryStage) {
  TempDir dir;
  const fs::path recipe = write_recipe(dir, "mlp");
  const std::vector<std::string> fp16 = {"--set", "precision.plugin=fp16",
                                         "--set", "precision.init_scale=1e30",
                                         "--set", "precision.backoff_factor=0.0001"};
  auto single = run_one_process(recipe, dir / "single", fp16);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto run = run_launched(2, recipe, dir / "pipeline", joined(pipeline_sets(2, {"1f1b"}, 4), fp16));
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  const auto single_lines = of_phase(read_metrics(dir / "single" / "metrics.jsonl"), "train");
  const auto pipeline_lines =
      of_phase(read_metrics(dir / "pipeline" / "metrics.rank0.jsonl"), "train");
  ASSERT_EQ(single_lines.size(), pipeline_lines.size());
  bool skipped_any = false;
  for (std::size_t i = 0; i < single_lines.size(); ++i) {
    EXPECT_EQ(pipeline_lines[i].at("loss_scale"), single_lines[i].at("loss_scale"))
        << "step " << i + 1;
    skipped_any = skipped_any || single_lines[i].at("loss_scale") < 1e29;
  }
  EXPECT_TRUE(skipped_any) << "the scale never backed off: no step overflowed";
  expect_same_model_within(dir / "single" / "final.pt", dir / "pipeline" / "final.pt", 1e-3, 1e-3);
}

// Evaluation runs the batch through the stages; the last one reports the loss and accuracy.
TEST(PipelineRun, EvaluationMatchesOneProcess) {
  TempDir dir;
  const fs::path recipe = write_recipe(dir, "mlp");
  const std::vector<std::string> eval = {"--set", "run.eval=true", "--set", "run.max_steps=2"};
  auto single = run_one_process(recipe, dir / "single", eval);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto run = run_launched(2, recipe, dir / "pipeline",
                          joined(pipeline_sets(2, {"interleaved_1f1b", 2}, 4), eval));
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  const auto expected = of_phase(read_metrics(dir / "single" / "metrics.jsonl"), "eval");
  const auto actual = of_phase(read_metrics(dir / "pipeline" / "metrics.rank0.jsonl"), "eval");
  ASSERT_EQ(expected.size(), 1u);
  ASSERT_EQ(actual.size(), 1u);
  EXPECT_NEAR(actual[0].at("loss"), expected[0].at("loss"), 1e-5);
  EXPECT_EQ(actual[0].at("accuracy"), expected[0].at("accuracy"));
  EXPECT_EQ(actual[0].at("samples"), expected[0].at("samples"));
}

// Each rank writes the measured timeline of the recorded step: its schedule's actions, in
// order, with times on a shared axis.
TEST(PipelineRun, RanksWriteTheMeasuredTimelineOfTheRecordedStep) {
  TempDir dir;
  const fs::path recipe = write_recipe(dir, "mlp");
  auto run = run_launched(
      2, recipe, dir / "run",
      joined(pipeline_sets(2, {"zero_bubble"}, 4), {"--set", "strategy.record_step=2"}));
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  std::optional<MeasuredPipelineTimeline> timeline = read_measured_timeline(dir / "run");
  ASSERT_TRUE(timeline.has_value());
  EXPECT_EQ(timeline->schedule, "zero_bubble");
  EXPECT_EQ(timeline->step, 2);
  ASSERT_EQ(timeline->rank_actions.size(), 2u);
  const PipelineSchedule schedule = build_pipeline_schedule("zero_bubble", {2, 4, 1});
  for (std::size_t rank = 0; rank < 2; ++rank) {
    const auto& measured = timeline->rank_actions[rank];
    const auto& listed = schedule.rank_actions[rank];
    ASSERT_EQ(measured.size(), listed.size()) << "rank " << rank;
    for (std::size_t i = 0; i < listed.size(); ++i) {
      EXPECT_EQ(measured[i].action, listed[i]) << "rank " << rank << " action " << i;
      EXPECT_LE(measured[i].start_us, measured[i].end_us);
      if (i > 0) {
        EXPECT_GE(measured[i].start_us, measured[i - 1].end_us);
      }
    }
  }
  for (double idle : measured_idle_shares(*timeline)) {
    EXPECT_GE(idle, 0.0);
    EXPECT_LT(idle, 1.0);
  }
  // The run logs each rank's measured idle share beside the simulated one and the formula.
  EXPECT_HAS(run.err, "pipeline: " + describe_idle_shares(*timeline));
  EXPECT_HAS(run.err, "idle share at step 2 per pp rank, measured (simulated at F=");
  EXPECT_HAS(run.err, "; formula ");

  // A forward or backward starts once its input has arrived, so waiting is not compute: an
  // activation's consumer starts after its producer ends, and so does a gradient's. Each rank's
  // clock starts when it leaves the barrier; over a round trip (an activation from rank 0 to 1,
  // a gradient back) that offset cancels, so the lags add up to at least 0.
  auto compute_of = [&](std::size_t rank, PipelineActionKind kind, int micro_batch) {
    for (const auto& m : timeline->rank_actions[rank]) {
      if (m.action.kind == kind && m.action.micro_batch == micro_batch) return m;
    }
    ADD_FAILURE() << "rank " << rank << " has no " << action_kind_name(kind) << " " << micro_batch;
    return MeasuredAction{};
  };
  double activation_lag = 1e300, gradient_lag = 1e300;
  for (int mb = 0; mb < 4; ++mb) {
    activation_lag =
        std::min(activation_lag, compute_of(1, PipelineActionKind::kForward, mb).start_us -
                                     compute_of(0, PipelineActionKind::kForward, mb).end_us);
    gradient_lag =
        std::min(gradient_lag, compute_of(0, PipelineActionKind::kBackwardInput, mb).start_us -
                                   compute_of(1, PipelineActionKind::kBackwardInput, mb).end_us);
  }
  EXPECT_GE(activation_lag + gradient_lag, 0.0)
      << "activation lag " << activation_lag << " us, gradient lag " << gradient_lag << " us";
}

const std::string kCheckpointSection = "\n[checkpoint]\nplugin = \"torch\"\nkeep = 0\n";

// The gpt (a streaming text, the tied embedding) saved by 2 stages after 3 steps; resumed by the
// same pipeline (bit for bit) and by 2 stages cut differently under another schedule (each rank
// still reads what it read): each ends where the uninterrupted runs end. `checkpoint export`
// writes the whole model, the tied weight once.
TEST(PipelineCheckpoint, ResumesOnTheSameCutBitForBitAndOnAnotherCut) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", gpt_recipe(dir) + kCheckpointSection);
  const std::vector<std::string> two = pipeline_sets(2, {"1f1b"}, 4);
  auto single = run_one_process(recipe, dir / "single", {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto whole = run_launched(2, recipe, dir / "whole", two);
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  auto first =
      run_launched(2, recipe, dir / "saved",
                   joined(two, {"--set", "run.max_steps=3", "--set",
                                "run.final_model_file=" + (dir / "saved3" / "final.pt").string()}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const fs::path checkpoint = dir / "saved" / "checkpoints" / "step-000000003";

  auto same = run_launched(2, recipe, dir / "saved", joined(two, {"--resume", "auto"}));
  ASSERT_EQ(same.exit_code, 0) << describe(same);
  EXPECT_HAS(same.err, "resumed from");
  expect_same_model_within(dir / "whole" / "final.pt", dir / "saved" / "final.pt", 0, 0);

  auto recut =
      run_launched(2, recipe, dir / "recut",
                   joined(pipeline_sets(2, {"zero_bubble"}, 4),
                          {"--set",
                           "strategy.stages=[\"embed, layer0\", \"layer1, layer2, layer3, layer4, "
                           "layer5, head\"]",
                           "--set", "checkpoint.dir=" + (dir / "saved" / "checkpoints").string(),
                           "--resume", checkpoint.string()}));
  ASSERT_EQ(recut.exit_code, 0) << describe(recut);
  EXPECT_HAS(recut.err, "resharded");
  expect_same_model_within(dir / "single" / "final.pt", dir / "recut" / "final.pt", kParameterRtol,
                           kParameterAtol);

  // Export assembles every stage's pieces: exactly the model the 3-step run ended with (its
  // final model, which the pipeline gathered from both stages), the tied weight once.
  const TensorMap weights = exported_checkpoint(checkpoint, dir / "model.safetensors");
  ASSERT_FALSE(weights.empty());
  const TensorMap at_step3 = read_tensor_file(dir / "saved3" / "final.pt");
  EXPECT_EQ(weights.count("head_token_weight"), 0u) << "the head's copy of the tie";
  ASSERT_EQ(weights.size(), at_step3.size());
  for (const auto& [name, tensor] : at_step3) {
    ASSERT_TRUE(weights.count(name)) << name;
    EXPECT_TRUE(at::equal(tensor, weights.at(name))) << name;
  }
}

// The mlp saved by 2 stages after 3 steps resumes on 4 stages under another schedule, on 2 ranks
// of 2 stages each placed in a V (zero_bubble_v), in one process, and under ddp on 2 ranks (the
// same global batch): each ends where one process training all 6 steps ends.
TEST(PipelineCheckpoint, ResumesOnAnotherPipelineSizeOrStrategy) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", mlp_recipe() + kCheckpointSection);
  auto single = run_one_process(recipe, dir / "single", {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto first = run_launched(2, recipe, dir / "saved",
                            joined(pipeline_sets(2, {"1f1b"}, 4), {"--set", "run.max_steps=3"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const fs::path checkpoint = dir / "saved" / "checkpoints" / "step-000000003";
  const std::vector<std::string> from_saved = {
      "--set", "checkpoint.dir=" + (dir / "saved" / "checkpoints").string(), "--resume",
      checkpoint.string()};
  auto four = run_launched(4, recipe, dir / "four",
                           joined(pipeline_sets(4, {"interleaved_1f1b", 2}, 8), from_saved));
  ASSERT_EQ(four.exit_code, 0) << describe(four);
  // ZB-V's V placement: rank 0 holds the first and the last of 4 stages.
  auto v_shape = run_launched(2, recipe, dir / "v_shape",
                              joined(pipeline_sets(2, {"zero_bubble_v", 2}, 4), from_saved));
  ASSERT_EQ(v_shape.exit_code, 0) << describe(v_shape);
  auto one = run_one_process(recipe, dir / "one", from_saved);
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  auto ddp = run_launched(
      2, recipe, dir / "ddp",
      joined({"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=9"}, from_saved));
  ASSERT_EQ(ddp.exit_code, 0) << describe(ddp);
  for (const char* resumed : {"four", "v_shape", "one", "ddp"}) {
    SCOPED_TRACE(resumed);
    expect_same_model_within(dir / "single" / "final.pt", dir / resumed / "final.pt",
                             kParameterRtol, kParameterAtol);
  }
}

// Saved by sharded stages (each data-parallel rank its own shards), resumed by replicated ones
// on the same ranks: the pieces are re-sliced.
TEST(PipelineCheckpoint, ShardedStagesResumeReplicated) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", gpt_recipe(dir) + kCheckpointSection);
  const std::vector<std::string> four =
      joined(pipeline_sets(2, {"1f1b"}, 4), {"--set", "loader.batch_size=9"});
  auto single = run_one_process(recipe, dir / "single", {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto first = run_launched(
      4, recipe, dir / "saved",
      joined(four, {"--set", "run.max_steps=3", "--set", "strategy.dp_sharding=full"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  auto resumed = run_launched(
      4, recipe, dir / "resumed",
      joined(four, {"--set", "checkpoint.dir=" + (dir / "saved" / "checkpoints").string(),
                    "--resume", (dir / "saved" / "checkpoints" / "step-000000003").string()}));
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_HAS(resumed.err, "resharded");
  expect_same_model_within(dir / "single" / "final.pt", dir / "resumed" / "final.pt",
                           kParameterRtol, kParameterAtol);
}

// A stage that exits mid-run ends the job, non-zero, naming it; so does one that stops
// communicating.
TEST(PipelineFailure, AStageThatDiesOrStopsEndsTheJobNamingIt) {
  for (const std::string mode : {"exit", "hang"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    const fs::path recipe = write_recipe(dir, "mlp");
    const auto started = std::chrono::steady_clock::now();
    auto run = run_launched(2, recipe, dir / "run",
                            joined(pipeline_sets(2, {"1f1b"}, 4),
                                   {"--set", "run.max_steps=50", "--set", "comm.timeout_s=20"}),
                            {"TRAINYARD_TEST_FAIL_RANK=1", "TRAINYARD_TEST_FAIL_AT_STEP=3",
                             "TRAINYARD_TEST_FAIL_MODE=" + mode},
                            120);
    EXPECT_NE(run.exit_code, 0) << describe(run);
    EXPECT_FALSE(run.timed_out) << describe(run);
    EXPECT_HAS(run.err, "rank 1");
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(100));
  }
}

// The README's recipe validates and trains on its two stages (a few steps of it).
TEST(PipelineRun, TheReadmeRecipeTrainsOnTwoStages) {
  TempDir dir;
  auto run = validate_and_launch_bundled_recipe("gpt_pipeline.toml", 2, 4, 2, dir / "run");
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_HAS(run.err, "pipeline: 1f1b on 2 ranks");
  const std::vector<double> losses = logged_train_losses(dir / "run");
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_TRUE(read_measured_timeline(dir / "run").has_value());
}

TEST(PipelineRun, InvalidCombinationsAreOneLineErrorsNamingTheNumbers) {
  TempDir dir;
  const fs::path recipe = write_recipe(dir, "mlp");
  struct Case {
    std::vector<std::string> sets;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {pipeline_sets(2, {"1f1b"}, 1), "micro-batches"},
      {pipeline_sets(2, {"interleaved_1f1b", 2}, 3), "3"},
      {joined(pipeline_sets(2, {"gpipe"}, 4), {"--set", "strategy.stages=[\"hidden0\", \"head\"]"}),
       "hidden1"},
      {joined(pipeline_sets(2, {"gpipe"}, 4), {"--set", "loader.batch_size=3"}),
       "3 samples cannot be split into 4"},
  };
  for (const Case& c : cases) {
    auto run = run_launched(2, recipe, dir / "run", c.sets, {}, 120);
    EXPECT_NE(run.exit_code, 0) << describe(run);
    EXPECT_HAS(run.err, c.expected);
  }
  // `validate` refuses a schedule its shape cannot take before any process starts.
  const std::vector<Case> shapes = {
      {pipeline_sets(2, {"interleaved_1f1b", 2}, 3),
       "needs the micro-batches to be a multiple of the ranks"},
      {pipeline_sets(2, {"zero_bubble_v", 1}, 4),
       "zero_bubble_v schedule: takes two stages per rank"},
  };
  for (const Case& c : shapes) {
    std::vector<std::string> args = {"validate", recipe.string()};
    args.insert(args.end(), c.sets.begin(), c.sets.end());
    auto validated = run_host(args, {}, 120);
    EXPECT_EQ(validated.exit_code, 1) << describe(validated);
    EXPECT_HAS(validated.err, c.expected);
  }
}

}  // namespace
}  // namespace trainyard::testing
