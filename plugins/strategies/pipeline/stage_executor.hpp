#pragma once
// Runs this rank's actions of a pipeline schedule over one batch's micro-batches: the forwards
// and backwards of its stages (a backward whole, or split into its input and weight halves
// without recomputing anything), the sends and receives over the stage channel, hand-overs
// between stages on the same rank, and the measured timeline of a recorded step.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "local_stage.hpp"
#include "stage_channel.hpp"
#include "trainyard/parallel/split_backward.hpp"
#include "trainyard/api/activations.hpp"
#include "trainyard/api/batch.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"
#include "trainyard/parallel/pipeline_timeline.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {

// A micro-batch between its forward and its backward on one stage.
struct InFlight {
  Activations input;                   // the stage's input leaves
  Activations output;                  // what the stage produced (not on the last stage)
  at::Tensor loss;                     // the last stage's weighted loss
  std::vector<at::Tensor> roots;       // what backward starts from ...
  std::vector<at::Tensor> root_grads;  // ... with these gradients (empty: the loss)
  Activations input_grads;             // computed by the backward, for the previous stage
  bool weights_pending = false;        // BackwardInput ran, BackwardWeight has not
  // Zero bubble's split backward: what its input half kept for the weight half.
  std::shared_ptr<SplitBackward> split;
  bool grads_delivered = false;        // the input gradient is sent, handed over or not needed
};

class StageExecutor {
 public:
  // `stages`, `channel` (null with one pipeline rank), `schedule` and `context` outlive this.
  StageExecutor(std::vector<LocalStage>& stages, StageChannel* channel,
                const PipelineSchedule& schedule, int pp_rank, const StrategyContext& context,
                std::optional<at::ScalarType> autocast_dtype);

  // One schedule over one batch's micro-batches. `synchronising`: the step's last batch, whose
  // last backward of each stage starts the data-parallel gradient reduction. `rounds`: the
  // step's batches (accumulation). Adds the last stage's weighted losses to `loss_sum`.
  void run(const std::vector<Batch>& parts, bool synchronising, double rounds,
           at::Tensor& loss_sum);

  // Times every action from now until finish_recording, which returns them in the order run.
  // A forward or backward is timed from when its input is here: waiting for a neighbour is idle
  // time in the timeline, not compute.
  void start_recording();
  std::vector<MeasuredAction> finish_recording();

 private:
  using Key = std::pair<int, int>;  // (stage, micro-batch)
  using Clock = std::chrono::steady_clock;

  LocalStage& stage(int index) { return *find_stage(stages_, index); }
  bool holds(int index) { return find_stage(stages_, index) != nullptr; }
  int rank_of(int stage) const { return schedule_.shape.rank_of_stage(stage); }
  double now_us() const;

  std::vector<double> loss_weights(const std::vector<Batch>& parts, double rounds) const;
  void post_receive(const PipelineAction& action, const std::vector<Batch>& parts);
  Activations forward_input(const Key& key, double& started);
  Activations output_gradients(const Key& key, double& started);
  void run_backward(const PipelineAction& action, std::size_t index, bool synchronising,
                    double& started);
  void forward(const PipelineAction& action, const Batch& part, const Activations& received,
               at::Tensor& loss_sum);
  std::vector<at::Tensor> loss_roots(InFlight& flight) const;
  void collect_input_grads(const LocalStage& stage, const PipelineAction& action, InFlight& flight,
                           const std::vector<at::Tensor>& grads);
  void backward(const PipelineAction& action, InFlight& flight, bool synchronise);
  void backward_input(const PipelineAction& action, InFlight& flight);
  void backward_weight(const PipelineAction& action, InFlight& flight, bool synchronise);
  void release_if_done(const Key& key);

  std::vector<LocalStage>& stages_;
  StageChannel* channel_;
  const PipelineSchedule& schedule_;
  int pp_rank_;
  const StrategyContext& context_;
  std::optional<at::ScalarType> autocast_dtype_;
  std::vector<double> weights_;
  std::map<Key, InFlight> in_flight_;
  std::map<Key, Activations> handover_activations_;
  std::map<Key, Activations> handover_gradients_;
  std::map<Key, StageChannel::Pending> activation_receives_;  // posted, not yet waited for
  std::map<Key, StageChannel::Pending> gradient_receives_;
  bool recording_ = false;
  Clock::time_point recording_origin_;
  std::vector<MeasuredAction> timeline_;
};

}  // namespace trainyard
