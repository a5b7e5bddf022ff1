#include "stage_executor.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>

#include "trainyard/api/error.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/api/step_phases.hpp"

namespace trainyard {
namespace {

// A tensor as it enters a stage: detached from the sender's graph, and a leaf that collects its
// gradient when it is floating point.
Activations as_stage_input(const Activations& received) {
  Activations input;
  for (const auto& [name, tensor] : received.tensors) {
    at::Tensor leaf = tensor.detach();
    if (at::isFloatingType(leaf.scalar_type())) leaf.requires_grad_(true);
    input.tensors.emplace(name, leaf);
  }
  return input;
}

// The micro-batches whose backward (or its input half) `stage` runs before it sends `micro_batch`'s
// activations: the gradients it waited for there have arrived by the time that send's data does.
std::vector<int> backwards_before_send(const PipelineSchedule& schedule, int stage,
                                       int micro_batch) {
  std::vector<int> answered;
  const auto& actions =
      schedule.rank_actions[static_cast<std::size_t>(schedule.shape.rank_of_stage(stage))];
  for (const PipelineAction& action : actions) {
    if (action.stage != stage) continue;
    if (action.kind == PipelineActionKind::kSendActivation && action.micro_batch == micro_batch) {
      break;
    }
    if (action.kind == PipelineActionKind::kBackward ||
        action.kind == PipelineActionKind::kBackwardInput) {
      answered.push_back(action.micro_batch);
    }
  }
  return answered;
}

Activations take_handover(std::map<std::pair<int, int>, Activations>& handovers,
                          const std::pair<int, int>& key, const char* what) {
  auto it = handovers.find(key);
  if (it == handovers.end()) {
    throw Error(std::string("pipeline: stage ") + std::to_string(key.first) + " has no " + what +
                " for micro-batch " + std::to_string(key.second));
  }
  Activations out = std::move(it->second);
  handovers.erase(it);
  return out;
}

// The tensors backward starts from: the stage's floating outputs that carry a graph, with the
// gradients the next stage sent for them.
void set_roots(InFlight& flight, const Activations& grads) {
  flight.roots.clear();
  flight.root_grads.clear();
  for (const auto& [name, output] : flight.output.tensors) {
    if (!output.requires_grad()) continue;
    auto grad = grads.tensors.find(name);
    if (grad == grads.tensors.end()) continue;
    flight.roots.push_back(output);
    flight.root_grads.push_back(grad->second);
  }
}

std::vector<at::Tensor> input_leaves(const InFlight& flight) {
  std::vector<at::Tensor> leaves;
  for (const auto& [name, tensor] : flight.input.tensors) {
    if (tensor.requires_grad()) leaves.push_back(tensor);
  }
  return leaves;
}

}  // namespace

StageExecutor::StageExecutor(std::vector<LocalStage>& stages, StageChannel* channel,
                             const PipelineSchedule& schedule, int pp_rank,
                             const StrategyContext& context,
                             std::optional<at::ScalarType> autocast_dtype)
    : stages_(stages),
      channel_(channel),
      schedule_(schedule),
      pp_rank_(pp_rank),
      context_(context),
      autocast_dtype_(autocast_dtype) {}

void StageExecutor::start_recording() {
  recording_origin_ = Clock::now();
  recording_ = true;
  timeline_.clear();
}

std::vector<MeasuredAction> StageExecutor::finish_recording() {
  recording_ = false;
  return std::move(timeline_);
}

double StageExecutor::now_us() const {
  return std::chrono::duration<double, std::micro>(Clock::now() - recording_origin_).count();
}

void StageExecutor::run(const std::vector<Batch>& parts, bool synchronising, double rounds,
                        at::Tensor& loss_sum) {
  weights_ = loss_weights(parts, rounds);
  const auto& actions = schedule_.rank_actions[static_cast<std::size_t>(pp_rank_)];
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& action = actions[i];
    const Batch& part = parts[static_cast<std::size_t>(action.micro_batch)];
    const Key key{action.stage, action.micro_batch};
    // The next compute action's receives go out before this one computes
    // (receives_to_post_before): posted only when needed, a transfer waits for the peer's
    // process to be scheduled, which on a loaded host can take milliseconds.
    for (std::size_t ahead : receives_to_post_before(actions, i))
      post_receive(actions[ahead], parts);
    double started = recording_ ? now_us() : 0;
    switch (action.kind) {
      case PipelineActionKind::kReceiveActivation:
      case PipelineActionKind::kReceiveGradient:
        post_receive(action, parts);
        break;
      case PipelineActionKind::kForward:
        forward(action, part, action.stage > 0 ? forward_input(key, started) : Activations(),
                loss_sum);
        break;
      case PipelineActionKind::kSendActivation:
        channel_->send(in_flight_.at(key).output, rank_of(action.stage + 1),
                       StageMessage::kActivation, action.stage + 1, action.micro_batch, part.size);
        break;
      case PipelineActionKind::kBackward:
      case PipelineActionKind::kBackwardInput:
        run_backward(action, i, synchronising, started);
        break;
      case PipelineActionKind::kBackwardWeight:
        backward_weight(action, in_flight_.at(key),
                        synchronising && i == stage(action.stage).last_weight_action);
        break;
      case PipelineActionKind::kSendGradient: {
        InFlight& flight = in_flight_.at(key);
        channel_->send(flight.input_grads, rank_of(action.stage - 1), StageMessage::kGradient,
                       action.stage - 1, action.micro_batch, part.size);
        flight.grads_delivered = true;
        release_if_done(key);
        break;
      }
    }
    if (recording_) timeline_.push_back({action, started, now_us()});
  }
}

// Posts a receive unless it is posted already (ahead of its place in the list).
void StageExecutor::post_receive(const PipelineAction& action, const std::vector<Batch>& parts) {
  const Key key{action.stage, action.micro_batch};
  const std::int64_t rows = parts[static_cast<std::size_t>(action.micro_batch)].size;
  if (action.kind == PipelineActionKind::kReceiveActivation) {
    if (activation_receives_.contains(key)) return;
    activation_receives_[key] =
        channel_->receive(rank_of(action.stage - 1), StageMessage::kActivation, action.stage,
                          action.micro_batch, rows);
  } else {
    if (gradient_receives_.contains(key)) return;
    gradient_receives_[key] = channel_->receive(rank_of(action.stage + 1), StageMessage::kGradient,
                                                action.stage, action.micro_batch, rows);
  }
}

// The input of a forward that is not the first stage's: received from the previous rank, or
// handed over by the previous stage on this rank. A wait restarts the action's clock.
Activations StageExecutor::forward_input(const Key& key, double& started) {
  auto pending = activation_receives_.find(key);
  if (pending == activation_receives_.end()) {
    return take_handover(handover_activations_, key, "activations");
  }
  Activations input = channel_->wait(pending->second);
  activation_receives_.erase(pending);
  // The activations answer the gradients this stage sent back for the micro-batches the
  // previous stage took backward before sending them: those sends are done. (A send completes
  // only when waited for; otherwise each micro-batch's input gradient would stay alive until
  // wait_sends at the step's end.)
  for (int answered : backwards_before_send(schedule_, key.first - 1, key.second)) {
    channel_->release_sent(rank_of(key.first - 1), StageMessage::kGradient, key.first - 1,
                           answered);
  }
  if (context_.phases) context_.phases->mark(StepPhase::CommWait);
  if (recording_) started = now_us();
  return input;
}

// The gradients of a stage's outputs, from the next stage (received or handed over).
Activations StageExecutor::output_gradients(const Key& key, double& started) {
  auto pending = gradient_receives_.find(key);
  if (pending == gradient_receives_.end()) {
    return take_handover(handover_gradients_, key, "gradients");
  }
  Activations grads = channel_->wait(pending->second);
  gradient_receives_.erase(pending);
  // The gradient answers this micro-batch's activations: their send is done.
  channel_->release_sent(rank_of(key.first + 1), StageMessage::kActivation, key.first + 1,
                         key.second);
  if (context_.phases) context_.phases->mark(StepPhase::CommWait);
  if (recording_) started = now_us();
  return grads;
}

void StageExecutor::run_backward(const PipelineAction& action, std::size_t index,
                                 bool synchronising, double& started) {
  const Key key{action.stage, action.micro_batch};
  InFlight& flight = in_flight_.at(key);
  if (!stage(action.stage).last) set_roots(flight, output_gradients(key, started));
  if (action.kind == PipelineActionKind::kBackward) {
    backward(action, flight, synchronising && index == stage(action.stage).last_weight_action);
  } else {
    backward_input(action, flight);
  }
}

// For the last stage: the factor each micro-batch's loss carries so that their sum is the
// batch's loss as the model reduces it, divided by the step's batches (accumulation).
std::vector<double> StageExecutor::loss_weights(const std::vector<Batch>& parts,
                                                double rounds) const {
  std::vector<double> weights(parts.size(), 1.0 / rounds);
  const LocalStage* last = nullptr;
  for (const auto& stage : stages_) {
    if (stage.last) last = &stage;
  }
  if (!last || last->model->loss_reduction() == LossReduction::kSum) return weights;
  std::vector<double> terms;
  double total = 0;
  for (const Batch& part : parts) {
    terms.push_back(last->model->loss_terms(part));
    total += terms.back();
  }
  for (std::size_t i = 0; i < parts.size(); ++i) {
    weights[i] = total > 0 ? terms[i] / total / rounds : 0.0;
  }
  return weights;
}

void StageExecutor::forward(const PipelineAction& action, const Batch& part,
                            const Activations& received, at::Tensor& loss_sum) {
  LocalStage& here = stage(action.stage);
  InFlight& flight = in_flight_[{action.stage, action.micro_batch}];
  {
    AutocastGuard autocast(context_.build.device.type(), autocast_dtype_);
    flight.input = here.first ? Activations(here.model->input(part)) : as_stage_input(received);
    Activations x = flight.input;
    for (const auto& block : here.run) x = block.forward(x);
    if (here.last) {
      at::Tensor loss = here.model->loss(x.hidden(), part);
      const double weight = weights_[static_cast<std::size_t>(action.micro_batch)];
      flight.loss = loss * weight;
      at::Tensor weighted = flight.loss.detach();
      loss_sum = loss_sum.defined() ? loss_sum + weighted : weighted;
    } else {
      flight.output = x;
    }
  }
  if (!here.last && holds(action.stage + 1)) {
    handover_activations_[{action.stage + 1, action.micro_batch}] = flight.output;
  }
  if (context_.phases) context_.phases->mark(StepPhase::Forward);
}

std::vector<at::Tensor> StageExecutor::loss_roots(InFlight& flight) const {
  if (flight.loss.defined()) return {context_.precision->scale_loss(flight.loss)};
  return flight.roots;
}

// The gradient of each floating input (zeros where none flowed), for the previous stage.
void StageExecutor::collect_input_grads(const LocalStage& here, const PipelineAction& action,
                                        InFlight& flight, const std::vector<at::Tensor>& grads) {
  if (here.first) {
    flight.grads_delivered = true;
    return;
  }
  flight.input_grads = Activations();
  std::size_t next = 0;
  for (const auto& [name, tensor] : flight.input.tensors) {
    if (!tensor.requires_grad()) continue;
    at::Tensor grad = next < grads.size() ? grads[next] : at::Tensor();
    ++next;
    flight.input_grads.tensors.emplace(name, grad.defined() ? grad : at::zeros_like(tensor));
  }
  if (holds(action.stage - 1)) {
    handover_gradients_[{action.stage - 1, action.micro_batch}] = flight.input_grads;
    flight.grads_delivered = true;
  }
}

void StageExecutor::backward(const PipelineAction& action, InFlight& flight, bool synchronise) {
  LocalStage& here = stage(action.stage);
  here.held->before_backward(synchronise);
  const std::vector<at::Tensor> roots = loss_roots(flight);
  if (!roots.empty()) torch::autograd::backward(roots, flight.root_grads);
  here.held->after_backward();
  std::vector<at::Tensor> grads;
  for (const auto& leaf : input_leaves(flight)) grads.push_back(leaf.grad());
  collect_input_grads(here, action, flight, grads);
  if (context_.phases) context_.phases->mark(StepPhase::Backward);
  release_if_done({action.stage, action.micro_batch});
}

// Zero bubble's first half: only the gradients of the stage's inputs, keeping the graph and,
// where branches leave for the parameters, the gradients that reached them (SplitBackward).
void StageExecutor::backward_input(const PipelineAction& action, InFlight& flight) {
  LocalStage& here = stage(action.stage);
  flight.weights_pending = true;
  const std::vector<at::Tensor> leaves = input_leaves(flight);
  flight.roots = loss_roots(flight);  // the scaled loss, once
  flight.split = std::make_shared<SplitBackward>();
  const std::vector<at::Tensor> grads =
      flight.split->input_half(flight.roots, flight.root_grads, leaves, here.parameters);
  collect_input_grads(here, action, flight, grads);
  if (context_.phases) context_.phases->mark(StepPhase::Backward);
}

// Zero bubble's second half: the weight gradients, running only the parameter branches from
// what the first half kept, nothing of the input path again.
void StageExecutor::backward_weight(const PipelineAction& action, InFlight& flight,
                                    bool synchronise) {
  LocalStage& here = stage(action.stage);
  here.held->before_weight_backward(synchronise);
  if (flight.split) flight.split->weight_half();
  flight.split.reset();
  here.held->after_backward();
  flight.weights_pending = false;
  if (context_.phases) context_.phases->mark(StepPhase::Backward);
  release_if_done({action.stage, action.micro_batch});
}

// Drops a micro-batch's activations and graph once nothing needs them: both halves of a split
// backward have run and the input gradient has left (sent, handed over, or not needed).
void StageExecutor::release_if_done(const Key& key) {
  auto it = in_flight_.find(key);
  if (it != in_flight_.end() && !it->second.weights_pending && it->second.grads_delivered) {
    in_flight_.erase(it);
  }
}

}  // namespace trainyard
