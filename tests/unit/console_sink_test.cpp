// The console sink's lines: counts print as whole numbers, other figures with their decimals.

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/runtime/plugin_loader.hpp"

namespace trainyard::testing {
namespace {

TEST(MetricKindTest, CountsAreKnownByTheirNames) {
  for (const char* count :
       {"steps", "samples", "tokens", "epoch", "skipped_steps", "skipped_steps_total",
        "memory_peak_bytes", "comm_dp_calls", "eval_samples", "eval_correct_count",
        "loader_workers", "compute_threads", "batch_index"}) {
    EXPECT_TRUE(is_count_metric(count)) << count;
  }
  for (const char* figure :
       {"loss", "lr", "samples_per_s", "tokens_per_s", "step_time_ms", "data_wait_share",
        "epoch_progress", "eval_loss", "mfu", "allreduces_per_step", "wall_s"}) {
    EXPECT_FALSE(is_count_metric(figure)) << figure;
  }
}

class ConsoleSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    load_bundled_plugins(registry_);
    auto table = std::make_shared<Table>();
    table->set("progress", Value("lines"));
    sink_ =
        registry_.create<MetricsSink>("console", Config(table, "sinks.console"), BuildContext{});
    RunInfo run;
    run.name = "test";
    run.total_steps = 2811;
    ::testing::internal::CaptureStdout();
    sink_->begin(run);
    ::testing::internal::GetCapturedStdout();
  }

  // What the sink prints for `record`.
  std::string line_of(const MetricRecord& record) {
    ::testing::internal::CaptureStdout();
    sink_->write(record);
    return ::testing::internal::GetCapturedStdout();
  }

  Registry registry_;
  std::shared_ptr<MetricsSink> sink_;
};

TEST_F(ConsoleSinkTest, SummaryPrintsCountsAsWholeNumbers) {
  const std::string line = line_of(MetricRecord{"summary",
                                                2811,
                                                3,
                                                12.5,
                                                {{"steps", 2811},
                                                 {"wall_s", 12.25},
                                                 {"final_train_loss", 0.5},
                                                 {"data_wait_share", 0},
                                                 {"memory_peak_bytes", 1048576},
                                                 {"comm_dp_bytes", 1234.5},
                                                 {"eval_samples", 10000},
                                                 {"eval_loss", 1}}});
  EXPECT_HAS(line, "summary  step 2811  epoch 3");
  EXPECT_HAS(line, "  steps 2811  ");
  EXPECT_HAS(line, "  wall_s 12.2500  ");
  EXPECT_HAS(line, "  final_train_loss 0.5000  ");
  EXPECT_HAS(line, "  data_wait_share 0.0000  ");
  EXPECT_HAS(line, "  memory_peak_bytes 1048576  ");
  // A count that is not whole (a mean over steps) keeps its decimals.
  EXPECT_HAS(line, "  comm_dp_bytes 1234.5000  ");
  EXPECT_HAS(line, "  eval_samples 10000  ");
  // A figure that happens to be whole is still a figure.
  EXPECT_HAS(line, "  eval_loss 1.0000\n");
}

TEST_F(ConsoleSinkTest, EvalPrintsSamplesAsAWholeNumber) {
  const std::string line =
      line_of(MetricRecord{"eval", 100, 1, 3.0, {{"loss", 0.5}, {"samples", 10000}}});
  EXPECT_EQ(line, "eval  step 100  epoch 1  loss 0.5000  samples 10000\n");
}

TEST_F(ConsoleSinkTest, TrainLinePrintsCountsAsWholeNumbers) {
  const std::string line = line_of(MetricRecord{"train",
                                                100,
                                                0,
                                                3.0,
                                                {{"loss", 0.5},
                                                 {"lr", 0.001},
                                                 {"samples_per_s", 5000},
                                                 {"step_time_ms", 12.5},
                                                 {"epoch_progress", 0.25},
                                                 {"grad_norm", 0.25},
                                                 {"loss_scale", 65536},
                                                 {"skipped_steps", 12345}}});
  EXPECT_HAS(line,
             "step 100/2811  epoch 0.25  loss 0.5000  lr 1.00e-03  5000 samples/s  "
             "12.5 ms/step");
  EXPECT_HAS(line, "  grad_norm 0.25");
  EXPECT_HAS(line, "  loss_scale 6.554e+04");
  // %.4g would print 1.234e+04.
  EXPECT_HAS(line, "  skipped_steps 12345\n");
}

}  // namespace
}  // namespace trainyard::testing
