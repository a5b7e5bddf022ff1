#include "trainyard/parallel/sharded_units.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Storage.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>

#include "released_collective.hpp"
#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/models/deferred_parameters.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/parallel/gradients.hpp"

namespace trainyard {

namespace {

// Frees a tensor's memory while every view into it keeps its shape (PyTorch's FSDP frees the
// unsharded flat parameter the same way); restore_storage gives it memory again. Autograd's saved
// references to the views stay valid: they are refilled before backward reads them.
void release_storage(const at::Tensor& tensor) {
  c10::Storage storage = tensor.storage();
  if (storage.nbytes() == 0) return;
  storage.set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage.set_nbytes(0);
}

void restore_storage(const at::Tensor& tensor) {
  c10::Storage storage = tensor.storage();
  const auto bytes = static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
  if (storage.nbytes() == bytes) return;
  storage.set_data_ptr_noswap(storage.allocator()->allocate(bytes));
  storage.set_nbytes(bytes);
}

// One unit: its layout and what it holds and has in flight.
struct Unit {
  ShardedUnitLayout layout;
  at::Tensor shard;  // this rank's slice of the flat parameters; what the optimizer steps
  at::Tensor full;   // the gathered flat parameters, which the model's parameters view
  bool gathered = false;
  c10::intrusive_ptr<c10d::Work> gather_work;  // an in-flight all-gather into `full`
  at::Tensor gather_input;                     // the shard in the gathered dtype, while in flight
  std::size_t pending = 0;                     // parameters still without a gradient
  bool reduced = false;                        // its gradient reduction was launched
  at::Tensor gradient_flat;                    // the flat gradient being reduced
  at::Tensor gradient_shard;                   // this rank's part of the reduced sum
  c10::intrusive_ptr<c10d::Work> reduce_work;
  c10::intrusive_ptr<c10d::Work> replica_work;  // its sum over the replicate group (hybrid)
};

}  // namespace

struct ShardedUnits::State {
  State(std::vector<at::Tensor> parameters_in, std::vector<std::string> names_in,
        const std::vector<Block>& blocks, c10::intrusive_ptr<c10d::Backend> group_in,
        const ShardedUnitsOptions& options_in, const DeferredParameters* deferred_in,
        std::optional<c10::Device> device_in)
      : parameters(std::move(parameters_in)),
        names(std::move(names_in)),
        group(std::move(group_in)),
        options(options_in),
        group_size(group ? group->getSize() : 1),
        deferred(deferred_in),
        device(device_in) {
    const bool replicated = options.sharding == UnitSharding::kNone;
    shard_ranks = replicated ? 1 : group_size;
    shard_rank = replicated || !group ? 0 : group->getRank();
    // Replicated parameters are the fp32 master copy itself: only sharded modes gather in
    // another dtype.
    if (replicated) options.gather_dtype = at::kFloat;
    build_units(blocks);
    deferred = nullptr;  // the caller's, needed no longer
    // A unit's gradients are reduced as soon as its last one is complete.
    accumulators = trainyard::on_gradient_ready(
        parameters, [this](std::size_t index) { on_gradient_ready(index); });
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      Block block = blocks[k];
      auto inner = block.forward;
      block.forward = [this, k, inner](const Activations& x) { return run_block(k, inner, x); };
      wrapped.push_back(std::move(block));
    }
  }

  void build_units(const std::vector<Block>& blocks) {
    std::unordered_map<const void*, std::size_t> index_of;
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      index_of[parameters[i].unsafeGetTensorImpl()] = i;
    }
    std::vector<int> uses(parameters.size(), 0);
    std::vector<std::vector<std::size_t>> members(blocks.size());
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      for (const auto& parameter : blocks[k].module->parameters(true)) {
        auto it = index_of.find(parameter.unsafeGetTensorImpl());
        if (it == index_of.end()) continue;
        if (std::find(members[k].begin(), members[k].end(), it->second) != members[k].end())
          continue;
        members[k].push_back(it->second);
        ++uses[it->second];
      }
    }
    Unit root;
    root.layout.name = "root";
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      if (uses[i] != 1) root.layout.parameters.push_back(i);
    }
    if (!root.layout.parameters.empty()) {
      units.push_back(std::move(root));
      root_unit = 0;
    }
    unit_of_block.assign(blocks.size(), -1);
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      Unit unit;
      unit.layout.name = blocks[k].name;
      for (std::size_t i : members[k]) {
        if (uses[i] == 1) unit.layout.parameters.push_back(i);
      }
      if (unit.layout.parameters.empty()) continue;
      unit_of_block[k] = static_cast<int>(units.size());
      units.push_back(std::move(unit));
    }
    unit_of_parameter.assign(parameters.size(), 0);
    at::NoGradGuard no_grad;
    for (std::size_t u = 0; u < units.size(); ++u) {
      Unit& unit = units[u];
      ShardedUnitLayout& layout = unit.layout;
      for (std::size_t i : layout.parameters) {
        unit_of_parameter[i] = u;
        layout.offsets.push_back(layout.numel);
        layout.numel += parameters[i].numel();
      }
      layout.shard_numel = (layout.numel + shard_ranks - 1) / shard_ranks;
      const at::Tensor& first = parameters[layout.parameters.front()];
      if (first.scalar_type() != at::kFloat) {
        throw Error("parameter '" + names[layout.parameters.front()] +
                    "' is not float32; sharded units keep fp32 master shards");
      }
      const at::TensorOptions buffer_options =
          first.options().device(device.value_or(first.device())).requires_grad(false);
      // Only this rank's shard is filled, from one parameter at a time; the gathered buffer
      // starts without memory (a replicated unit's is the shard itself).
      unit.shard = shard_values(layout, buffer_options);
      if (options.sharding == UnitSharding::kNone) {
        unit.full = unit.shard;  // the model's parameters view what the optimizer steps
        unit.gathered = true;
      } else {
        unit.full = storage_free(layout.shard_numel * shard_ranks,
                                 buffer_options.dtype(options.gather_dtype));
      }
      for (std::size_t j = 0; j < layout.parameters.size(); ++j) {
        at::Tensor& parameter = parameters[layout.parameters[j]];
        // The parameter keeps its identity (autograd, module, optimizer hooks) and now views
        // the flat buffer, in the gathered dtype.
        parameter.set_data(
            unit.full.narrow(0, layout.offsets[j], parameter.numel()).view(parameter.sizes()));
      }
      if (options.sharding != UnitSharding::kNone) release_storage(unit.full);
      unit.shard.requires_grad_(true);
    }
  }

  // This rank's part of the unit's flat parameters: each parameter that overlaps it taken (or,
  // deferred, made) in turn and the overlap copied; the padding past the last one is zero.
  at::Tensor shard_values(const ShardedUnitLayout& layout, const at::TensorOptions& buffer_options) {
    const std::int64_t begin = shard_rank * layout.shard_numel;
    const std::int64_t end = begin + layout.shard_numel;
    at::Tensor shard = at::zeros({layout.shard_numel}, buffer_options);
    for (std::size_t j = 0; j < layout.parameters.size(); ++j) {
      const at::Tensor& parameter = parameters[layout.parameters[j]];
      const std::int64_t first = std::max(begin, layout.offsets[j]);
      const std::int64_t last = std::min(end, layout.offsets[j] + parameter.numel());
      if (first >= last) continue;
      const at::Tensor values = deferred && deferred->holds(parameter)
                                    ? deferred->make(parameter)
                                    : parameter.detach();
      shard.narrow(0, first - begin, last - first)
          .copy_(values.reshape({-1}).narrow(0, first - layout.offsets[j], last - first));
    }
    return shard;
  }

  // A flat tensor of `numel` elements whose storage holds no memory: it claims the bytes, so
  // that views can be cut from it, until release_storage drops the claim (restore_storage then
  // gives it memory when it is gathered).
  static at::Tensor storage_free(std::int64_t numel, const at::TensorOptions& options) {
    at::Tensor tensor = at::empty({0}, options);
    tensor.storage().set_nbytes(static_cast<std::size_t>(numel) * tensor.element_size());
    tensor.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
    return tensor;
  }

  bool sharded_group() const { return group && options.sharding != UnitSharding::kNone; }

  int next_unit_after(std::size_t block) const {
    for (std::size_t k = block + 1; k < unit_of_block.size(); ++k) {
      if (unit_of_block[k] >= 0) return unit_of_block[k];
    }
    return -1;
  }
  int previous_unit_before(std::size_t block) const {
    for (std::size_t k = block; k-- > 0;) {
      if (unit_of_block[k] >= 0) return unit_of_block[k];
    }
    return -1;
  }
  int last_block_unit() const {
    for (std::size_t k = unit_of_block.size(); k-- > 0;) {
      if (unit_of_block[k] >= 0) return unit_of_block[k];
    }
    return -1;
  }

  Unit& unit_at(int u) { return units[static_cast<std::size_t>(u)]; }

  Activations run_block(std::size_t k, const std::function<Activations(const Activations&)>& inner,
                        const Activations& x) {
    const bool training = at::GradMode::is_enabled();
    // A checkpointed block's recompute runs in backward, where the next unit's backward is done:
    // nothing to prefetch, and this unit's backward follows at once.
    const bool recomputing = recomputing_checkpointed_forward();
    if (root_unit >= 0) gather(unit_at(root_unit));
    const int u = unit_of_block[k];
    if (u >= 0) gather(unit_at(u));
    // The next unit's all-gather runs while this one computes; at most two units are gathered.
    if (options.prefetch && !recomputing) {
      const int next = next_unit_after(k);
      if (next >= 0) start_gather(unit_at(next));
    }
    Activations y = inner(x);
    if (u < 0 || options.sharding == UnitSharding::kNone) return y;
    Unit& unit = unit_at(u);
    if (!training) {
      release(unit);  // evaluation (or a forward to be recomputed): nothing comes back for it
      return y;
    }
    // Full sharding frees the parameters until backward; the last unit's backward comes next.
    if (options.sharding == UnitSharding::kFull && u != last_block_unit() && !recomputing) {
      release(unit);
    }
    // The first gradient to reach any of the block's outputs means its backward is next.
    auto started = std::make_shared<bool>(false);
    for (auto& [name, tensor] : y.tensors) {
      if (!tensor.defined() || !tensor.requires_grad()) continue;
      // A tensor passed on unchanged belongs to an earlier block's backward.
      auto input = x.tensors.find(name);
      if (input != x.tensors.end() && input->second.is_same(tensor)) continue;
      tensor.register_hook([this, k, u, started](const at::Tensor&) {
        if (std::exchange(*started, true)) return;
        before_backward(k, u);
      });
    }
    return y;
  }

  // Runs when the gradient of a unit's output arrives: its backward is next.
  void before_backward(std::size_t k, int u) {
    gather(unit_at(u));
    if (options.prefetch) {
      const int previous = previous_unit_before(k);
      if (previous >= 0) start_gather(unit_at(previous));
    }
  }

  void start_gather(Unit& unit) {
    if (unit.gathered || unit.gather_work) return;
    restore_storage(unit.full);
    if (!group || shard_ranks == 1) {
      at::NoGradGuard no_grad;
      unit.full.copy_(unit.shard.detach());
      unit.gathered = true;
      return;
    }
    // The input must outlive the collective: kept with the unit until the gather completes.
    unit.gather_input = unit.shard.detach().to(options.gather_dtype);
    unit.gather_work = group->_allgather_base(unit.full, unit.gather_input);
  }

  void gather(Unit& unit) {
    if (unit.gathered) return;
    start_gather(unit);
    if (unit.gather_work) {
      wait_released(std::move(unit.gather_work), unit.full.is_cpu());
      unit.gather_input = at::Tensor();
    }
    unit.gathered = true;
  }

  void release(Unit& unit) {
    if (options.sharding == UnitSharding::kNone) return;
    if (unit.gather_work) {  // a prefetch nobody used: complete it before freeing its target
      wait_released(std::move(unit.gather_work), unit.full.is_cpu());
      unit.gather_input = at::Tensor();
    }
    release_storage(unit.full);
    unit.gathered = false;
  }

  void release_all() {
    for (auto& unit : units) release(unit);
  }

  void on_gradient_ready(std::size_t index) {
    Unit& unit = units[unit_of_parameter[index]];
    if (unit.pending == 0) return;
    if (--unit.pending == 0) unit_backward_done(unit);
  }

  // A unit's gradients are complete: reduce them (last micro-batch) and free its parameters.
  void unit_backward_done(Unit& unit) {
    if (synchronise) {
      launch_reduction(unit);
      advance_replica_reductions(false);
    }
    // The root unit's parameters may still be read by other units' backward.
    if (root_unit < 0 || &unit != &unit_at(root_unit)) release(unit);
  }

  void launch_reduction(Unit& unit) {
    if (unit.reduced) return;
    unit.reduced = true;
    if (options.sharding != UnitSharding::kNone) {
      // One sharded unit's reduction in flight at a time: the one before is completed and its
      // flat gradient freed before this unit's is made, so a backward holds one flat gradient
      // besides the unit's whole gradients, not one per unit until the step's end.
      if (reducing) complete_reduction(*reducing);
      reducing = &unit;
    }
    at::NoGradGuard no_grad;
    const ShardedUnitLayout& layout = unit.layout;
    const std::int64_t padded = layout.shard_numel * shard_ranks;
    unit.gradient_flat =
        at::zeros({padded}, unit.shard.options().dtype(options.reduce_dtype).requires_grad(false));
    for (std::size_t i = 0; i < layout.parameters.size(); ++i) {
      at::Tensor& parameter = parameters[layout.parameters[i]];
      if (parameter.grad().defined()) {
        unit.gradient_flat.narrow(0, layout.offsets[i], parameter.numel())
            .copy_(parameter.grad().reshape({-1}));
      }
      // Whole gradients live only until they are in the flat buffer.
      parameter.mutable_grad() = at::Tensor();
    }
    if (replicate) replica_queue.push_back(&unit);
    if (!group) {
      unit.gradient_shard = unit.gradient_flat;
      return;
    }
    unit.gradient_flat.div_(group_size);
    std::vector<at::Tensor> tensors{unit.gradient_flat};
    if (options.sharding == UnitSharding::kNone) {
      unit.gradient_shard = unit.gradient_flat;
      unit.reduce_work = group->allreduce(tensors);
    } else if (unit.gradient_flat.is_cpu()) {
      // A host communicator's reduce-scatter all-reduces a copy of its input, which its worker
      // thread frees when it lets go of the work, a moment after the wait or much later. Here
      // the flat gradient is all-reduced in place and this rank's part taken when it is done
      // (complete_reduction): the same traffic, one flat copy fewer, nothing freed late.
      unit.reduce_work = group->allreduce(tensors);
    } else {
      unit.gradient_shard = at::empty({layout.shard_numel}, unit.gradient_flat.options());
      unit.reduce_work = group->_reduce_scatter_base(unit.gradient_shard, unit.gradient_flat);
    }
  }

  // Waits for the unit's reduction, takes this rank's part of an in-place all-reduce, and frees
  // the flat gradient of a sharded unit (its memory, whoever still refers to it).
  void complete_reduction(Unit& unit) {
    if (!unit.reduce_work) return;
    wait_released(std::move(unit.reduce_work), unit.gradient_flat.is_cpu());
    if (options.sharding == UnitSharding::kNone) return;  // the flat gradient is the shard's
    if (!unit.gradient_shard.defined()) {
      unit.gradient_shard =
          unit.gradient_flat
              .narrow(0, shard_rank * unit.layout.shard_numel, unit.layout.shard_numel)
              .clone();
    }
    release_storage(unit.gradient_flat);
  }

  // Hybrid sharding: each reduced shard is summed over the replicate group, launched in the
  // order the units were reduced (the same on every rank, as the collectives need) as soon as
  // the unit at the head of that order has its reduce-scatter done, so the all-reduces travel
  // while the backward goes on. `all`: launch the rest now (their reduce-scatters are done).
  void advance_replica_reductions(bool all) {
    while (!replica_queue.empty()) {
      Unit& unit = *replica_queue.front();
      if (!all && unit.reduce_work && !unit.reduce_work->isCompleted()) return;
      complete_reduction(unit);
      std::vector<at::Tensor> tensors{unit.gradient_shard};
      unit.replica_work = replicate->allreduce(tensors);
      replica_queue.pop_front();
    }
  }

  void finish_backward() {
    for (auto& unit : units) {
      if (unit.pending > 0) {
        unit.pending = 0;
        if (synchronise) launch_reduction(unit);
      }
    }
    if (synchronise) {
      for (auto& unit : units) complete_reduction(unit);
      reducing = nullptr;
      advance_replica_reductions(true);
      for (auto& unit : units) {
        if (!unit.replica_work) continue;
        wait_released(std::move(unit.replica_work), unit.shard.is_cpu());
        unit.gradient_shard.div_(static_cast<double>(replicate->getSize()));
      }
    }
    for (auto& unit : units) {
      if (synchronise && unit.gradient_shard.defined()) {
        unit.shard.mutable_grad() = unit.gradient_shard.to(at::kFloat);  // fp32 master gradient
        unit.gradient_shard = at::Tensor();
      }
      unit.gradient_flat = at::Tensor();
      release(unit);
    }
  }

  at::Tensor gather_copy(const Unit& unit, const at::Tensor& shard) const {
    at::Tensor input = (shard.defined() ? shard : unit.shard).detach().contiguous();
    at::Tensor flat =
        at::empty({unit.layout.shard_numel * shard_ranks}, input.options().requires_grad(false));
    if (!group || shard_ranks == 1) {
      flat.copy_(input);
    } else {
      wait_released(group->_allgather_base(flat, input), flat.is_cpu());
    }
    return flat;
  }

  std::vector<at::Tensor> parameters;
  std::vector<std::string> names;
  c10::intrusive_ptr<c10d::Backend> group;
  ShardedUnitsOptions options;
  std::int64_t group_size;
  // While the units are built: where placeholders' values come from, and the device of the
  // buffers when it is not the parameters' own.
  // Hybrid sharding: the group whose ranks hold the same shards (null otherwise), and the
  // reduced units whose all-reduce over it is still to launch, in launch order.
  c10::intrusive_ptr<c10d::Backend> replicate;
  std::deque<Unit*> replica_queue;
  Unit* reducing = nullptr;  // the sharded unit whose reduction was launched last
  const DeferredParameters* deferred = nullptr;
  std::optional<c10::Device> device;
  std::int64_t shard_ranks = 1;
  std::int64_t shard_rank = 0;
  std::vector<Unit> units;
  int root_unit = -1;
  std::vector<int> unit_of_block;
  std::vector<std::size_t> unit_of_parameter;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<Block> wrapped;
  bool synchronise = true;
};

ShardedUnits::ShardedUnits(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                           const std::vector<Block>& blocks,
                           const c10::intrusive_ptr<c10d::Backend>& group,
                           const ShardedUnitsOptions& options)
    : state_(std::make_unique<State>(std::move(parameters), std::move(names), blocks, group,
                                     options, nullptr, std::nullopt)) {}

ShardedUnits::ShardedUnits(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                           const std::vector<Block>& blocks,
                           const c10::intrusive_ptr<c10d::Backend>& group,
                           const ShardedUnitsOptions& options, const DeferredParameters& deferred,
                           c10::Device device)
    : state_(std::make_unique<State>(std::move(parameters), std::move(names), blocks, group,
                                     options, &deferred, device)) {}

ShardedUnits::~ShardedUnits() = default;

const std::vector<Block>& ShardedUnits::blocks() const { return state_->wrapped; }

std::size_t ShardedUnits::unit_count() const { return state_->units.size(); }

const ShardedUnitLayout& ShardedUnits::layout(std::size_t unit) const {
  return state_->units.at(unit).layout;
}

const at::Tensor& ShardedUnits::shard(std::size_t unit) const {
  return state_->units.at(unit).shard;
}

std::vector<at::Tensor> ShardedUnits::shards() const {
  std::vector<at::Tensor> out;
  for (const auto& unit : state_->units) out.push_back(unit.shard);
  return out;
}

std::int64_t ShardedUnits::shard_ranks() const { return state_->shard_ranks; }

std::int64_t ShardedUnits::shard_rank() const { return state_->shard_rank; }

void ShardedUnits::prepare_backward(bool synchronise) {
  state_->synchronise = synchronise;
  state_->replica_queue.clear();
  state_->reducing = nullptr;
  for (auto& unit : state_->units) {
    unit.pending = unit.layout.parameters.size();
    unit.reduced = false;
  }
}

void ShardedUnits::finish_backward() { state_->finish_backward(); }

void ShardedUnits::average_over(const c10::intrusive_ptr<c10d::Backend>& replicate_group) {
  state_->replicate = replicate_group && replicate_group->getSize() > 1 ? replicate_group : nullptr;
}

void ShardedUnits::release_all() { state_->release_all(); }

void ShardedUnits::gather_all() {
  for (auto& unit : state_->units) state_->start_gather(unit);
  for (auto& unit : state_->units) state_->gather(unit);
}

at::Tensor ShardedUnits::gather_copy(std::size_t unit, const at::Tensor& shard) const {
  return state_->gather_copy(state_->units.at(unit), shard);
}

std::map<std::string, at::Tensor> ShardedUnits::full_parameters() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& unit : state_->units) {
    at::Tensor flat = state_->gather_copy(unit, {});
    const ShardedUnitLayout& layout = unit.layout;
    for (std::size_t i = 0; i < layout.parameters.size(); ++i) {
      const at::Tensor& parameter = state_->parameters[layout.parameters[i]];
      out[state_->names[layout.parameters[i]]] =
          flat.narrow(0, layout.offsets[i], parameter.numel()).view(parameter.sizes()).clone();
    }
  }
  return out;
}

void ShardedUnits::combine_found_inf(at::Tensor& found_inf) const {
  if (!found_inf.defined() || !state_->sharded_group()) return;
  std::vector<at::Tensor> message{found_inf};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  wait_released(state_->group->allreduce(message, options), found_inf.is_cpu());
}

at::Tensor ShardedUnits::gradient_norm(const std::vector<at::Tensor>& gradients) const {
  std::vector<at::Tensor> squares;
  for (const auto& gradient : gradients) {
    squares.push_back(gradient.detach().to(at::kFloat).pow(2).sum());
  }
  at::Tensor total = at::stack(squares).sum().reshape({1});
  if (state_->sharded_group()) {
    std::vector<at::Tensor> message{total};
    wait_released(state_->group->allreduce(message), total.is_cpu());
  }
  return total.sqrt().reshape({});
}

HeldBytes ShardedUnits::held_bytes(const torch::optim::Optimizer* optimizer) const {
  std::vector<at::Tensor> gradient_buffers;
  const std::vector<at::Tensor> tensors = held_tensors(gradient_buffers);
  return count_held_bytes(tensors, optimizer, gradient_buffers);
}

HeldBytes ShardedUnits::held_bytes(const torch::optim::Optimizer* optimizer,
                                   const Optimizer& plugin) const {
  std::vector<at::Tensor> gradient_buffers;
  const std::vector<at::Tensor> tensors = held_tensors(gradient_buffers);
  return count_held_bytes(tensors, optimizer, plugin, gradient_buffers);
}

std::vector<at::Tensor> ShardedUnits::held_tensors(
    std::vector<at::Tensor>& gradient_buffers) const {
  // The model's parameters view the gathered buffers (counted once); those count only while
  // they hold memory.
  std::vector<at::Tensor> tensors;
  for (const auto& unit : state_->units) tensors.push_back(unit.shard);
  for (const auto& unit : state_->units) tensors.push_back(unit.full);
  tensors.insert(tensors.end(), state_->parameters.begin(), state_->parameters.end());
  for (const auto& unit : state_->units) {
    if (unit.gradient_flat.defined()) gradient_buffers.push_back(unit.gradient_flat);
  }
  return tensors;
}

}  // namespace trainyard
