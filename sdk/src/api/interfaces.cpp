// Out-of-line destructors (which anchor each interface's type information in the SDK library)
// and the default behaviours the interfaces promise.

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Reduction.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <mutex>
#include <unordered_set>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/models/classification.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/api/held_bytes.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/api/sample_timing.hpp"
#include "trainyard/runtime/dtype_name.hpp"
#include "trainyard/api/scheduler.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {

MapSource::~MapSource() = default;
SampleStream::~SampleStream() = default;
StreamSource::~StreamSource() = default;
DeviceEvent::~DeviceEvent() = default;
BucketCompressor::~BucketCompressor() = default;

void HostClockEvent::record() { time_ = std::chrono::steady_clock::now(); }

double HostClockEvent::elapsed_ms(const DeviceEvent& later) const {
  const auto& other = dynamic_cast<const HostClockEvent&>(later);
  return std::chrono::duration<double, std::milli>(other.time_ - time_).count();
}

std::shared_ptr<DeviceEvent> DeviceBackend::create_event(int index) {
  return keep_library_loaded(std::shared_ptr<DeviceEvent>(make_event(index)), library());
}

torch::Tensor DeviceBackend::rng_state(int index) const {
  at::Generator generator = at::globalContext().defaultGenerator(device(index));
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void DeviceBackend::set_rng_state(int index, const torch::Tensor& state) {
  at::Generator generator = at::globalContext().defaultGenerator(device(index));
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

std::shared_ptr<const MapSource> Dataset::map_source(const std::string& split) const {
  return keep_library_loaded(map_split(split), library());
}

std::shared_ptr<const StreamSource> Dataset::stream_source(const std::string& split) const {
  return keep_library_loaded(stream_split(split), library());
}

const torch::Tensor& Batch::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    std::string known;
    for (const auto& [key, value] : tensors) known += (known.empty() ? "" : ", ") + key;
    throw Error("batch has no tensor '" + name + "' (it has: " + known + ")");
  }
  return it->second;
}

Batch Batch::to(const torch::Device& device, bool non_blocking) const {
  Batch out;
  out.size = size;
  for (const auto& [name, tensor] : tensors) {
    out.tensors.emplace(name, tensor.to(device, non_blocking));
  }
  return out;
}

Batch collate(const std::vector<TensorMap>& samples) {
  Batch batch;
  batch.size = static_cast<std::int64_t>(samples.size());
  if (samples.empty()) return batch;
  for (const auto& [name, first] : samples.front()) {
    std::vector<torch::Tensor> parts;
    parts.reserve(samples.size());
    for (const auto& sample : samples) {
      auto it = sample.find(name);
      if (it == sample.end()) throw Error("cannot collate: a sample lacks '" + name + "'");
      if (!it->second.sizes().equals(first.sizes())) {
        throw Error("cannot collate '" + name + "': shapes differ between samples");
      }
      parts.push_back(it->second);
    }
    batch.tensors.emplace(name, at::stack(parts));
  }
  return batch;
}

Batch MapSource::get_batch(std::span<const std::int64_t> indices) const {
  std::vector<TensorMap> samples;
  samples.reserve(indices.size());
  for (auto index : indices) samples.push_back(get(index));
  const SampleTimer timer(SampleStage::kCollate);
  return collate(samples);
}

Batch MapSource::get_batch_drawn(std::span<const std::int64_t> indices,
                                 const SampleDraws&) const {
  return get_batch(indices);
}

std::uint64_t SampleDraws::for_sample(std::int64_t index) const {
  // splitmix64's finaliser over each input in turn: every bit of seed, epoch and index reaches
  // every bit of the result.
  auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::uint64_t state = mix(seed + 0x9e3779b97f4a7c15ULL);
  state = mix(state ^ (static_cast<std::uint64_t>(epoch) + 0x9e3779b97f4a7c15ULL));
  return mix(state ^ (static_cast<std::uint64_t>(index) + 0x9e3779b97f4a7c15ULL));
}

std::shared_ptr<const MapSource> Dataset::map_split(const std::string&) const { return nullptr; }
std::shared_ptr<const StreamSource> Dataset::stream_split(const std::string&) const {
  return nullptr;
}

TensorMap Model::eval_sums(const torch::Tensor&, const Batch&) { return {}; }
LossReduction Model::loss_reduction() const { return LossReduction::kMean; }
double Model::loss_terms(const Batch& batch) const { return static_cast<double>(batch.size); }
bool Model::builds_stages() const { return false; }
std::vector<std::string> Model::block_names() {
  std::vector<std::string> names;
  for (const auto& block : blocks()) names.push_back(block.name);
  return names;
}
std::vector<TiedParameter> Model::tied_parameters() { return {}; }
std::map<std::string, std::string> Model::export_files() const { return {}; }
std::vector<HeldLayout> parameter_layouts(Model& model) {
  std::vector<HeldLayout> layouts;
  for (const auto& item : model.module().named_parameters(true)) {
    layouts.push_back(model.parameter_layout(item.key(), item.value()));
  }
  return layouts;
}

HeldLayout Model::parameter_layout(const std::string& name, const torch::Tensor& held) const {
  return whole_parameter_layout(name, held.sizes().vec());
}

torch::Tensor run_blocks(Model& model, const std::vector<Block>& blocks, const Batch& batch) {
  Activations x(model.input(batch));
  for (const auto& block : blocks) x = block.forward(x);
  return x.hidden();
}

const torch::Tensor& Activations::hidden() const {
  auto it = tensors.find(kHidden);
  if (it == tensors.end()) {
    std::string names;
    for (const auto& [name, tensor] : tensors) names += (names.empty() ? "" : ", ") + name;
    throw Error("a block's activations have no '" + std::string(kHidden) + "' tensor (they have: " +
                (names.empty() ? std::string("none") : names) + ")");
  }
  return it->second;
}

Activations Activations::with_hidden(torch::Tensor hidden) const {
  Activations out = *this;
  out.tensors[kHidden] = std::move(hidden);
  return out;
}

std::filesystem::path per_rank_file(const RunInfo& run, const std::string& stem,
                                    const std::string& extension) {
  const std::string rank = run.world_size > 1 ? ".rank" + std::to_string(run.rank) : "";
  return std::filesystem::path(run.output_dir) / (stem + rank + extension);
}

double MetricRecord::get(const std::string& name, double fallback) const {
  for (const auto& [key, value] : values) {
    if (key == name) return value;
  }
  return fallback;
}

bool is_count_metric(std::string_view name) {
  if (name.starts_with("eval_")) name.remove_prefix(5);
  for (std::string_view count : {"steps", "samples", "tokens", "epoch"}) {
    if (name == count) return true;
  }
  for (std::string_view suffix : {"_steps", "_samples", "_tokens", "_bytes", "_calls", "_count",
                                  "_total", "_workers", "_threads", "_ranks", "_index"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

void check_native_dtype(const std::string& precision, const torch::Device& device,
                        torch::ScalarType dtype, const DeviceBackend* backend,
                        const std::string& instead) {
  if (device.is_cpu()) return;
  const std::string refusal = "precision '" + precision + "' cannot run on device '" +
                              device.str() + "': ";
  const std::string dtype_text = dtype_name(dtype);
  if (!at::autocast::is_autocast_available(device.type())) {
    throw Error(refusal + "LibTorch has no autocast for this type of device; use precision '" +
                instead + "'");
  }
  if (backend == nullptr || backend->device(0).type() != device.type()) {
    throw Error(refusal + "no device backend of the run drives it, so whether it computes " +
                dtype_text + " natively is unknown");
  }
  const auto native = backend->fast_compute_dtypes(device.has_index() ? device.index() : 0);
  if (std::find(native.begin(), native.end(), dtype) != native.end()) return;
  std::string listed;
  for (const auto type : native) listed += (listed.empty() ? "" : ", ") + dtype_name(type);
  throw Error(refusal + "it does not compute " + dtype_text + " natively (its native dtypes: " +
              listed + "); use precision '" + instead + "'");
}

bool Precision::should_step(const torch::Tensor& found_inf) {
  return !found_inf.defined() || found_inf.item<double>() == 0;
}

bool Precision::unscale_and_check(const std::vector<torch::Tensor>& gradients) {
  return should_step(unscale(gradients));
}

void Precision::update(bool found_inf) { update(at::full({}, found_inf ? 1.0 : 0.0, at::kFloat)); }

AutocastGuard::AutocastGuard(torch::DeviceType device_type, std::optional<torch::ScalarType> dtype)
    : device_type_(device_type) {
  if (!dtype) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

namespace {

std::string param_key(const std::string& prefix, std::size_t index, const char* field) {
  return prefix + "param." + std::to_string(index) + "." + field;
}

torch::Tensor step_tensor(std::int64_t step) { return at::scalar_tensor(step, at::kLong); }

template <typename Visitor>
void for_each_param(const torch::optim::Optimizer& optimizer, Visitor visit) {
  std::size_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) visit(index++, param);
  }
}

}  // namespace

// Calls visit(field, tensor) for each state tensor of one parameter; false for a state type
// this file does not know.
template <typename Visitor>
bool visit_param_state(const torch::optim::OptimizerParamState* state, Visitor visit) {
  if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
    visit("momentum_buffer", sgd->momentum_buffer());
  } else if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
    visit("step", step_tensor(adam->step()));
    visit("exp_avg", adam->exp_avg());
    visit("exp_avg_sq", adam->exp_avg_sq());
    visit("max_exp_avg_sq", adam->max_exp_avg_sq());
  } else if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
    visit("step", step_tensor(adamw->step()));
    visit("exp_avg", adamw->exp_avg());
    visit("exp_avg_sq", adamw->exp_avg_sq());
    visit("max_exp_avg_sq", adamw->max_exp_avg_sq());
  } else {
    return false;
  }
  return true;
}

namespace {

// The state of every parameter of `optimizer` as entries of `out`, copied or as views of the
// live tensors; false (and `out` partly filled) when a state type is unknown here.
bool save_known_state(const torch::optim::Optimizer& optimizer, const std::string& prefix,
                      StateDict& out, bool copy) {
  const auto& states = optimizer.state();
  bool known = true;
  for_each_param(optimizer, [&](std::size_t index, const torch::Tensor& param) {
    auto it = states.find(param.unsafeGetTensorImpl());
    if (it == states.end() || !known) return;
    known = visit_param_state(it->second.get(), [&](const char* field, const torch::Tensor& value) {
      if (value.defined()) {
        out.tensors[param_key(prefix, index, field)] =
            copy ? value.detach().clone() : value.detach();
      }
    });
  });
  return known;
}

}  // namespace

void Optimizer::save_state(const torch::optim::Optimizer& optimizer, const std::string& prefix,
                           StateDict& out) const {
  if (!save_known_state(optimizer, prefix, out, /*copy=*/true)) {
    throw Error(
        "optimizer state of this type cannot be saved by default; the optimizer "
        "plugin must override save_state");
  }
}

void Optimizer::save_state_views(const torch::optim::Optimizer& optimizer,
                                 const std::string& prefix, StateDict& out) const {
  StateDict views;
  if (!save_known_state(optimizer, prefix, views, /*copy=*/false)) {
    save_state(optimizer, prefix, out);  // a state type only the plugin knows: its copies
    return;
  }
  for (auto& [key, value] : views.tensors) out.tensors[key] = std::move(value);
}

std::vector<torch::Tensor> stepped_tensors(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> tensors;
  for_each_param(optimizer, [&](std::size_t, const torch::Tensor& param) {
    tensors.push_back(param);
  });
  for (const auto& [key, state] : optimizer.state()) {
    // A state type this file does not know keeps its tensors out: they are copied at once.
    visit_param_state(state.get(), [&](const char*, const torch::Tensor& value) {
      if (value.defined()) tensors.push_back(value);
    });
  }
  return tensors;
}

namespace {

// Adds each storage's bytes once, to the category that reaches it first.
class StorageCounter {
 public:
  void count(const torch::Tensor& tensor, std::int64_t& into) {
    if (!tensor.defined() || !tensor.has_storage()) return;
    const auto& storage = tensor.storage();
    if (seen_.insert(storage.unsafeGetStorageImpl()).second) {
      into += static_cast<std::int64_t>(storage.nbytes());
    }
  }

 private:
  std::unordered_set<const void*> seen_;
};

HeldBytes count_parameters_and_gradients(StorageCounter& counter,
                                         const std::vector<torch::Tensor>& parameters,
                                         const std::vector<torch::Tensor>& gradient_buffers) {
  HeldBytes held;
  for (const auto& parameter : parameters) counter.count(parameter, held.parameters);
  for (const auto& parameter : parameters) counter.count(parameter.grad(), held.gradients);
  for (const auto& buffer : gradient_buffers) counter.count(buffer, held.gradients);
  return held;
}

// Counts the state types visit_param_state knows; false when `optimizer` holds another.
bool count_known_state(StorageCounter& counter, const torch::optim::Optimizer& optimizer,
                       std::int64_t& into) {
  // The step counters are made here for saving; the optimizer holds them as integers.
  auto count_tensor = [&](const char*, const torch::Tensor& value) {
    if (value.defined() && value.dim() > 0) counter.count(value, into);
  };
  bool known = true;
  for (const auto& [key, state] : optimizer.state()) {
    if (!visit_param_state(state.get(), count_tensor)) known = false;
  }
  return known;
}

}  // namespace

HeldBytes count_held_bytes(const std::vector<torch::Tensor>& parameters,
                           const torch::optim::Optimizer* optimizer,
                           const std::vector<torch::Tensor>& gradient_buffers) {
  StorageCounter counter;
  HeldBytes held = count_parameters_and_gradients(counter, parameters, gradient_buffers);
  if (optimizer) count_known_state(counter, *optimizer, held.optimizer_state);
  return held;
}

HeldBytes count_held_bytes(const std::vector<torch::Tensor>& parameters,
                           const torch::optim::Optimizer* optimizer, const Optimizer& plugin,
                           const std::vector<torch::Tensor>& gradient_buffers) {
  StorageCounter counter;
  HeldBytes held = count_parameters_and_gradients(counter, parameters, gradient_buffers);
  if (!optimizer || count_known_state(counter, *optimizer, held.optimizer_state)) return held;
  // A state type only the plugin knows: its entries, views of the live state or copies of the
  // same size (the known states counted above are views of storages already seen). Scalars
  // (step counts) are left out, as the optimizer holds them as integers.
  StateDict entries;
  plugin.save_state_views(*optimizer, "", entries);
  for (const auto& [key, value] : entries.tensors) {
    if (value.dim() > 0) counter.count(value, held.optimizer_state);
  }
  return held;
}

void Optimizer::load_state(torch::optim::Optimizer& optimizer, const std::string& prefix,
                           const StateDict& in) const {
  auto& states = optimizer.state();
  auto find = [&](std::size_t index, const char* field) -> torch::Tensor {
    auto it = in.tensors.find(param_key(prefix, index, field));
    return it == in.tensors.end() ? torch::Tensor() : it->second;
  };
  for_each_param(optimizer, [&](std::size_t index, const torch::Tensor& param) {
    auto on_param = [&](const torch::Tensor& t) {
      return t.defined() ? t.to(param.device()).clone() : t;
    };
    void* key = param.unsafeGetTensorImpl();
    if (dynamic_cast<torch::optim::SGD*>(&optimizer)) {
      torch::Tensor buffer = find(index, "momentum_buffer");
      if (!buffer.defined()) return;
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(on_param(buffer));
      states[key] = std::move(state);
    } else if (dynamic_cast<torch::optim::Adam*>(&optimizer) ||
               dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
      torch::Tensor step = find(index, "step");
      if (!step.defined()) return;
      auto fill = [&](auto state) {
        state->step(step.item<std::int64_t>());
        state->exp_avg(on_param(find(index, "exp_avg")));
        state->exp_avg_sq(on_param(find(index, "exp_avg_sq")));
        torch::Tensor max_sq = find(index, "max_exp_avg_sq");
        if (max_sq.defined()) state->max_exp_avg_sq(on_param(max_sq));
        states[key] = std::move(state);
      };
      if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
        fill(std::make_unique<torch::optim::AdamWParamState>());
      } else {
        fill(std::make_unique<torch::optim::AdamParamState>());
      }
    } else {
      throw Error(
          "optimizer state of this type cannot be loaded by default; the optimizer "
          "plugin must override load_state");
    }
  });
}

}  // namespace trainyard

namespace trainyard {

torch::Tensor classification_loss(const torch::Tensor& logits, const Batch& batch) {
  return classification_loss(logits, batch, LossReduction::kMean);
}

torch::Tensor classification_loss(const torch::Tensor& logits, const Batch& batch,
                                  LossReduction reduction) {
  const auto aten_reduction =
      reduction == LossReduction::kSum ? at::Reduction::Sum : at::Reduction::Mean;
  return at::cross_entropy_loss(logits, batch.at("target"), /*weight=*/{}, aten_reduction);
}

TensorMap classification_sums(const torch::Tensor& logits, const Batch& batch) {
  return {{"accuracy", logits.argmax(1).eq(batch.at("target")).sum()}};
}

}  // namespace trainyard
