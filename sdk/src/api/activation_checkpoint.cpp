#include "trainyard/api/activation_checkpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>

#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/model.hpp"

namespace trainyard {

namespace {

constexpr const char* kForms =
    "\"none\", \"all\", \"every:K\" (K >= 1) or \"blocks:NAME,NAME...\"";

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string::size_type start = 0;
  while (true) {
    auto end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

// Set while this thread replays a checkpointed forward (recomputing_checkpointed_forward).
thread_local bool recomputing = false;

// Marks the scope as a replay, and puts back what it found on leaving, by an exception too.
class Replaying {
 public:
  Replaying() : outer_(std::exchange(recomputing, true)) {}
  ~Replaying() { recomputing = outer_; }
  Replaying(const Replaying&) = delete;
  Replaying& operator=(const Replaying&) = delete;

 private:
  bool outer_;
};

// What a recompute must reproduce of the original call: its function, random streams and autocast.
struct AutocastState {
  c10::DeviceType device_type = c10::DeviceType::CPU;
  bool enabled = false;
  at::ScalarType dtype = at::kFloat;
};

AutocastState autocast_state(c10::DeviceType device_type) {
  return {device_type, at::autocast::is_autocast_enabled(device_type),
          at::autocast::get_autocast_dtype(device_type)};
}

void set_autocast_state(const AutocastState& state) {
  at::autocast::set_autocast_enabled(state.device_type, state.enabled);
  at::autocast::set_autocast_dtype(state.device_type, state.dtype);
}

at::Generator generator_of(const c10::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

at::Tensor rng_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// A generator the forward may draw from: read and written through the device backend that drives
// its device, or ATen's default generator of the device when no backend drives it.
struct DeviceGenerator {
  c10::Device device = c10::Device(c10::kCPU);
  std::shared_ptr<DeviceBackend> backend;  // null: ATen's default generator

  at::Tensor state() const {
    return backend ? backend->rng_state(device.index()) : rng_state(generator_of(device));
  }
  void set_state(const at::Tensor& state) const {
    if (backend) {
      backend->set_rng_state(device.index(), state);
    } else {
      set_rng_state(generator_of(device), state);
    }
  }
};

// The generator a forward on `inputs` may draw from besides the CPU's: that of the first input
// not on the CPU, through `backend` when it drives that type of device (the host's included:
// a backend driving the CPU may keep a generator of its own).
std::optional<DeviceGenerator> device_generator(const torch::autograd::variable_list& inputs,
                                                const std::shared_ptr<DeviceBackend>& backend) {
  c10::Device device(c10::kCPU, 0);
  for (const auto& input : inputs) {
    if (!input.defined() || input.is_cpu()) continue;
    device = input.device();
    if (!device.has_index()) device.set_index(0);
    break;
  }
  if (backend && backend->device(0).type() == device.type()) return DeviceGenerator{device, backend};
  if (device.is_cpu()) return std::nullopt;
  return DeviceGenerator{device, nullptr};
}

struct Recompute : torch::CustomClassHolder {
  std::function<Activations(const Activations&)> forward;
  std::shared_ptr<DeviceBackend> backend;  // the run's, when known
  std::vector<std::string> input_names;   // of the bundle's tensors, in the order passed
  std::vector<std::string> output_names;  // in the order returned
  at::Tensor cpu_rng_state;
  std::optional<DeviceGenerator> device;  // another generator the forward may draw from
  at::Tensor device_rng_state;
  std::vector<AutocastState> autocast;  // the CPU's, and the device's when it has autocast
};

// Sets the random streams to a recorded state and puts the current one back on destruction
// (torch.random.fork_rng): a recompute must not shift the draws that come after it. Restored in
// reverse order, so a generator reached twice (the host's, through a backend that drives it)
// ends as it was.
class ForkedRng {
 public:
  explicit ForkedRng(const Recompute& recompute) {
    const DeviceGenerator cpu;
    forks_.push_back({cpu, cpu.state()});
    cpu.set_state(recompute.cpu_rng_state);
    if (recompute.device) {
      forks_.push_back({*recompute.device, recompute.device->state()});
      recompute.device->set_state(recompute.device_rng_state);
    }
  }
  ~ForkedRng() {
    for (auto fork = forks_.rbegin(); fork != forks_.rend(); ++fork) {
      fork->generator.set_state(fork->saved);
    }
  }
  ForkedRng(const ForkedRng&) = delete;
  ForkedRng& operator=(const ForkedRng&) = delete;

 private:
  struct Fork {
    DeviceGenerator generator;
    at::Tensor saved;
  };
  std::vector<Fork> forks_;
};

// Puts autocast as it was during the original forward, and back afterwards.
class RestoredAutocast {
 public:
  explicit RestoredAutocast(const Recompute& recompute) {
    for (const auto& recorded : recompute.autocast) {
      previous_.push_back(autocast_state(recorded.device_type));
      set_autocast_state(recorded);
    }
    at::autocast::increment_nesting();
  }
  ~RestoredAutocast() {
    // The casts cached during the recompute belong to its graph only.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    for (const auto& previous : previous_) set_autocast_state(previous);
  }
  RestoredAutocast(const RestoredAutocast&) = delete;
  RestoredAutocast& operator=(const RestoredAutocast&) = delete;

 private:
  std::vector<AutocastState> previous_;
};

// The bundle of `tensors` under `names`, in order.
Activations bundle(const std::vector<std::string>& names, const torch::autograd::variable_list& tensors) {
  Activations activations;
  for (std::size_t i = 0; i < names.size(); ++i) activations.tensors.emplace(names[i], tensors[i]);
  return activations;
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* context,
                                                at::TensorList inputs,
                                                at::TensorList parameters,
                                                c10::intrusive_ptr<Recompute> recompute) {
    recompute->cpu_rng_state = rng_state(generator_of(c10::Device(c10::kCPU)));
    recompute->autocast.push_back(autocast_state(c10::DeviceType::CPU));
    recompute->device = device_generator(inputs.vec(), recompute->backend);
    if (recompute->device) {
      recompute->device_rng_state = recompute->device->state();
      // A backend that drives the CPU usually hands out the CPU's own generator: one copy of a
      // state both generators hold is enough (each block keeps its states until its backward).
      if (recompute->device_rng_state.dtype() == recompute->cpu_rng_state.dtype() &&
          recompute->device_rng_state.device() == recompute->cpu_rng_state.device() &&
          at::equal(recompute->device_rng_state, recompute->cpu_rng_state)) {
        recompute->device_rng_state = recompute->cpu_rng_state;
      }
      const c10::DeviceType type = recompute->device->device.type();
      if (type != c10::DeviceType::CPU && at::autocast::is_autocast_available(type)) {
        recompute->autocast.push_back(autocast_state(type));
      }
    }
    std::vector<at::Tensor> saved = inputs.vec();
    saved.insert(saved.end(), parameters.begin(), parameters.end());
    context->save_for_backward(saved);
    Activations output;
    {
      // Casts made here carry no graph: keep them out of autocast's weight cache, where a later
      // grad-enabled use would pick them up and lose the weights' gradients.
      const bool cache_enabled = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      at::NoGradGuard no_grad;
      try {
        output = recompute->forward(bundle(recompute->input_names, inputs.vec()));
      } catch (...) {
        at::autocast::set_autocast_cache_enabled(cache_enabled);
        throw;
      }
      at::autocast::set_autocast_cache_enabled(cache_enabled);
    }
    torch::autograd::variable_list outputs;
    recompute->output_names.clear();
    for (auto& [name, tensor] : output.tensors) {
      recompute->output_names.push_back(name);
      outputs.push_back(tensor);
    }
    context->saved_data["recompute"] = c10::IValue::make_capsule(std::move(recompute));
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grad_outputs) {
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(
        context->saved_data.at("recompute").toCapsule());
    torch::autograd::variable_list saved = context->get_saved_variables();
    const std::size_t input_count = recompute->input_names.size();

    torch::autograd::variable_list detached;
    for (std::size_t i = 0; i < input_count; ++i) {
      detached.push_back(saved[i].detach());
      detached.back().requires_grad_(saved[i].requires_grad());
    }
    Activations output;
    {
      ForkedRng rng(*recompute);
      RestoredAutocast autocast(*recompute);
      at::AutoGradMode grad_mode(true);
      Replaying replaying;
      output = recompute->forward(bundle(recompute->input_names, detached));
    }

    // Differentiate with respect to whatever requires grad and whose gradient this backward
    // needs (a split backward asks for the inputs' first and the parameters' later); the rest
    // gets no gradient.
    std::vector<std::size_t> positions;
    torch::autograd::variable_list targets;
    for (std::size_t i = 0; i < saved.size(); ++i) {
      const at::Tensor& target = i < input_count ? detached[i] : saved[i];
      if (target.requires_grad() && context->needs_input_grad(i)) {
        positions.push_back(i);
        targets.push_back(target);
      }
    }
    // From every recomputed output that requires grad and whose gradient arrived.
    torch::autograd::variable_list roots;
    torch::autograd::variable_list root_gradients;
    for (std::size_t i = 0; i < recompute->output_names.size(); ++i) {
      auto it = output.tensors.find(recompute->output_names[i]);
      if (it == output.tensors.end() || !it->second.requires_grad()) continue;
      if (i >= grad_outputs.size() || !grad_outputs[i].defined()) continue;
      roots.push_back(it->second);
      root_gradients.push_back(grad_outputs[i]);
    }
    // One gradient per input of apply(): each input tensor, each parameter, and the capsule.
    torch::autograd::variable_list gradients(saved.size() + 1);
    if (targets.empty() || roots.empty()) return gradients;
    torch::autograd::variable_list computed =
        torch::autograd::grad(roots, targets, root_gradients, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t k = 0; k < positions.size(); ++k) gradients[positions[k]] = computed[k];
    return gradients;
  }
};

}  // namespace

ActivationCheckpointing ActivationCheckpointing::parse(const std::string& text) {
  ActivationCheckpointing selection;
  if (text == "none") return selection;
  if (text == "all") {
    selection.mode = Mode::kAll;
    return selection;
  }
  if (text.rfind("every:", 0) == 0) {
    const std::string number = text.substr(6);
    std::size_t used = 0;
    long long every = 0;
    try {
      every = std::stoll(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (number.empty() || used != number.size() || every < 1) {
      throw Error("'" + text + "' is not a valid block selection: K in \"every:K\" must be an "
                  "integer >= 1");
    }
    selection.mode = every == 1 ? Mode::kAll : Mode::kEvery;
    selection.every = every;
    return selection;
  }
  if (text.rfind("blocks:", 0) == 0) {
    selection.mode = Mode::kNamed;
    for (const auto& name : split(text.substr(7), ',')) {
      if (name.empty()) throw Error("'" + text + "' names an empty block");
      selection.names.push_back(name);
    }
    return selection;
  }
  throw Error("'" + text + "' is not a valid block selection; expected " + kForms);
}

std::string ActivationCheckpointing::to_string() const {
  switch (mode) {
    case Mode::kNone:
      return "none";
    case Mode::kAll:
      return "all";
    case Mode::kEvery:
      return "every:" + std::to_string(every);
    case Mode::kNamed: {
      std::string out = "blocks:";
      for (std::size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i];
      return out;
    }
  }
  return "none";
}

bool ActivationCheckpointing::selects(std::size_t index, const std::string& name) const {
  switch (mode) {
    case Mode::kNone:
      return false;
    case Mode::kAll:
      return true;
    case Mode::kEvery:
      return index % static_cast<std::size_t>(every) == 0;
    case Mode::kNamed:
      return std::find(names.begin(), names.end(), name) != names.end();
  }
  return false;
}

std::vector<Block> with_activation_checkpointing(std::vector<Block> blocks,
                                                 const ActivationCheckpointing& selection,
                                                 std::shared_ptr<DeviceBackend> device) {
  if (selection.mode == ActivationCheckpointing::Mode::kNamed) {
    std::set<std::string> known;
    std::string listed;
    for (const auto& block : blocks) {
      known.insert(block.name);
      listed += (listed.empty() ? "" : ", ") + block.name;
    }
    for (const auto& name : selection.names) {
      if (!known.count(name)) {
        throw Error("activation checkpointing (run.activation_checkpointing) names block '" + name +
                    "', which the model does not have (its blocks: " + listed + ")");
      }
    }
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (!selection.selects(i, blocks[i].name)) continue;
    auto forward = blocks[i].forward;
    auto module = blocks[i].module;
    blocks[i].forward = [forward, module, device](const Activations& x) {
      // Read at call time: a strategy may move or replace the parameters after wrapping.
      return checkpointed_call(
          forward, x, module ? module->parameters(true) : std::vector<at::Tensor>{}, device);
    };
  }
  return blocks;
}

Activations checkpointed_call(const std::function<Activations(const Activations&)>& forward,
                              const Activations& input, const std::vector<at::Tensor>& parameters,
                              const std::shared_ptr<DeviceBackend>& device) {
  bool needs_graph = false;
  if (at::GradMode::is_enabled()) {
    for (const auto& [name, tensor] : input.tensors) {
      needs_graph = needs_graph || (tensor.defined() && tensor.requires_grad());
    }
    for (const auto& parameter : parameters) needs_graph = needs_graph || parameter.requires_grad();
  }
  if (!needs_graph) return forward(input);
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->forward = forward;
  recompute->backend = device;
  torch::autograd::variable_list inputs;
  for (const auto& [name, tensor] : input.tensors) {
    recompute->input_names.push_back(name);
    inputs.push_back(tensor);
  }
  Recompute& names = *recompute;
  torch::autograd::variable_list outputs =
      CheckpointFunction::apply(at::TensorList(inputs), at::TensorList(parameters), recompute);
  Activations output;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    output.tensors.emplace(names.output_names[i], outputs[i]);
  }
  return output;
}

bool recomputing_checkpointed_forward() { return recomputing; }

}  // namespace trainyard
