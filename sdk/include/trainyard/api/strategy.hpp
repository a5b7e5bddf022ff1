#pragma once
// Strategies own the training step: how the model is placed, split or sharded across devices
// and ranks, and how one optimizer step is computed.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/batch.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/component.hpp"
#include "trainyard/api/held_bytes.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

class Model;
class Optimizer;
class Precision;
class GradientCompression;
class DeviceBackend;
class Communicator;
class PhaseClock;
class OptimizerStepGate;

// Step mechanics every strategy honours:
// - accumulation: train_step gets K micro-batches; each one's loss is divided by K and gradients
//   are synchronised across ranks only after the last one (no_sync before); one optimizer step.
// - every step, the global norm over every gradient of every shard (unscaled, synchronised) is
//   reported in StepResult::grad_norm; a step whose gradients hold inf or nan does not step the
//   optimizer (StepResult::skipped), on every rank alike; otherwise, with max_grad_norm, the
//   gradients are clipped to it (judge_gradients in trainyard/parallel/gradient_verdict.hpp).
// - activation_checkpointing: the strategy passes its model's blocks through
//   with_activation_checkpointing before running them.
struct StepOptions {
  std::int64_t accumulation = 1;  // micro-batches per optimizer step
  double max_grad_norm = 0;       // clip by global norm when > 0
  ActivationCheckpointing activation_checkpointing;
  // Also report each block's gradient norm (StepResult::block_grad_norms): run.grad_norm_blocks.
  bool block_grad_norms = false;
};

// Everything a strategy builds from. It calls make_model (possibly several times, or with a
// context carrying its own groups) so it can shard or split before any parameter exists in full.
struct StrategyContext {
  std::function<std::shared_ptr<Model>(const BuildContext&)> make_model;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<DeviceBackend> device_backend;
  std::shared_ptr<Communicator> communicator;  // null in a single-process run
  // The recipe's [compression] (null without one): data-parallel strategies that all-reduce
  // gradients hand it to their reducers; others refuse it in setup.
  std::shared_ptr<GradientCompression> compression;
  BuildContext build;                          // device, seed, rank, dataset info
  StepOptions step;
  // The engine's step clock (null outside the engine): strategies mark the end of each
  // micro-batch's forward and backward and of their communication waits (step_phases.hpp).
  PhaseClock* phases = nullptr;
  // Held while a checkpoint copies the tensors only the optimizer step changes (null outside the
  // engine): strategies call before_optimizer_step() right before their optimizer steps.
  OptimizerStepGate* optimizer_step_gate = nullptr;

  // Waits, when the gate is held, until nothing reads what the optimizer is about to change.
  // Called before every optimizer step, also one that non-finite gradients skip.
  void before_optimizer_step() const;
};


// Results stay on the device: reading them is the caller's choice, made once per logging
// interval so the step never waits for the device.
struct StepResult {
  // Mean over the step's samples on this rank, detached. Defined only on the ranks where the
  // loss lives (every rank for data parallel, the last pipeline stage for a pipeline); the
  // engine logs the mean over the ranks that hold one, which is the global batch's mean when
  // each holds the mean of equally many samples.
  torch::Tensor loss;
  torch::Tensor grad_norm;  // before clipping
  // With StepOptions::block_grad_norms: each block's gradient norm before clipping, [blocks] in
  // the order of block_names (the whole model's), over every rank as grad_norm is (so the sum of
  // their squares is grad_norm's square), on every rank.
  torch::Tensor block_grad_norms;
  std::vector<std::string> block_names;
  std::int64_t samples = 0;
  // Forward + backward FLOPs this rank ran in the step, for utilisation. 0: the engine reckons
  // samples x the model's flops_per_sample(), right for a strategy that holds one model built
  // for all its samples (data and tensor parallel); a strategy that holds other pieces (pipeline
  // stages) says what they did.
  double flops = 0;
  bool skipped = false;     // the optimizer step was skipped (non-finite gradients)
  // For a skipped step, the first parameter whose gradient on this rank holds inf or nan; empty
  // when this rank's part of the gradients was finite.
  std::string nonfinite_parameter;
  // Host-side figures of this step (such as comm_wait_ms); the engine logs their interval mean.
  std::vector<std::pair<std::string, double>> metrics;
};

// Defined (samples > 0) only on the ranks where the loss lives, as for StepResult.
struct EvalResult {
  torch::Tensor loss_sum;   // sum over the batch's samples
  TensorMap sums;           // the model's eval_sums
  std::int64_t samples = 0;
};

// Which slice of the data this rank reads: ranks with the same data-parallel rank (tensor or
// pipeline peers) read the same batches.
struct DataParallelPlace {
  int rank = 0;
  int size = 1;
};

// A strategy plugin. Contract:
// - setup() is called once, before anything else.
// - train_step() takes exactly StepOptions::accumulation micro-batches (already on the device)
//   and performs one optimizer step over their union, with gradients averaged over every sample
//   of every data-parallel rank.
// - eval_step() leaves the parameters unchanged; its sums cover this rank's batch only (the
//   engine adds them up across data-parallel ranks).
// - save_state/load_state round-trip everything the strategy owns (parameters, buffers,
//   optimizer and precision state) so that a resumed run continues bit for bit.
class Strategy : public Component {
 public:
  static constexpr const char* kKind = "strategy";
  virtual void setup(StrategyContext& context) = 0;
  virtual StepResult train_step(std::span<const Batch> micro_batches) = 0;
  virtual EvalResult eval_step(const Batch& batch) = 0;
  virtual void set_learning_rate(double lr) = 0;
  virtual DataParallelPlace data_parallel_place() const { return {}; }
  // Entries may share memory with the live tensors (no copy is made): whoever keeps them while
  // training goes on copies them first (snapshot_to_host).
  virtual void save_state(CheckpointState& out) const = 0;
  virtual void load_state(const CheckpointState& in) = 0;
  // Full parameters by name, as a single-device model would hold them (gathered if sharded, in
  // which case it is collective: every rank calls it).
  virtual TensorMap full_parameters() const = 0;
  // The whole model's parameters and buffers by name, as a single-device model's state dict:
  // what the engine exports as the final model. Collective like full_parameters. Default: the
  // parameters, and the buffers this strategy saves whole in its shared state ("model.<name>").
  virtual TensorMap full_model_state() const;
  // What of this strategy's layout a checkpoint depends on beyond the strategy's name and the
  // mesh (such as how a pipeline cuts the model into stages): a checkpoint saved under another
  // description is read from every saved rank's files. Default: empty.
  virtual std::string describe_layout() const;
  // The tensors that only the optimizer step changes, and only after before_optimizer_step():
  // the parameters as the optimizer holds them (and those the step refreshes from them) and the
  // optimizer's state. An asynchronous checkpoint reads the save_state entries stored in their
  // memory during the next step's forward and backward (writing host tensors straight into its
  // files, copying device tensors to the host); every other entry (buffers that forward updates,
  // counters) is copied before the next step starts. Default: none, everything at once.
  virtual std::vector<torch::Tensor> optimizer_stepped_tensors() const;
  // What this rank holds now in parameters, gradients and optimizer state (measured from the
  // tensors themselves, not estimated).
  virtual HeldBytes held_bytes() const = 0;
  // Refuses a model this strategy cannot run as configured (a sharding mode the model's modules
  // cannot take, a model a pipeline cannot cut): an Error in one line naming what and the fix.
  // `trainyard validate` calls it before any process starts, with the whole model built as rank
  // 0 of the run's mesh builds it on the meta device (shapes only: it reads no values) and
  // `build` as the model saw it, its extensions holding the precision's compute dtype
  // (kComputeDtypeExtension) when it autocasts; setup() refuses the same things. Default:
  // accepts every model.
  virtual void check_model(Model& model, const BuildContext& build) const;
};

}  // namespace trainyard
