#include "trainyard/parallel/tensor_parallel.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "released_collective.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/process_mesh.hpp"

namespace trainyard {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string shape_text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return out + "]";
}

std::int64_t wrapped_dim(std::int64_t dim, const at::Tensor& tensor, const char* what) {
  const std::int64_t rank = tensor.dim();
  if (dim < -rank || dim >= rank) {
    throw Error(std::string(what) + ": dimension " + std::to_string(dim) +
                " is out of range for a tensor of shape " + shape_text(tensor.sizes()));
  }
  return dim < 0 ? dim + rank : dim;
}

const c10::intrusive_ptr<c10d::Backend>& backend_of(const TensorParallelGroup& group) {
  if (!group.backend) {
    throw Error("a tensor-parallel group of " + std::to_string(group.size) +
                " ranks has no backend");
  }
  return group.backend;
}

// The collectives below never touch their argument: each works on a buffer of its own, which
// autograd may hand on as a gradient or an output.

// The element-wise reduction of `tensor` over the group.
at::Tensor all_reduce(const at::Tensor& tensor, const TensorParallelGroup& group,
                      c10d::ReduceOp::RedOpType operation = c10d::ReduceOp::SUM) {
  std::vector<at::Tensor> buffer{tensor.clone(at::MemoryFormat::Contiguous)};
  c10d::AllreduceOptions options;
  options.reduceOp = operation;
  ReleasedCollective released(buffer);
  released.wait(backend_of(group)->allreduce(buffer, options));
  return buffer[0];
}

// The results are tensors of their own, never views: autograd forbids modifying a custom
// Function's output in place when it is a view, and a layer adds its bias in place.

// An all-gather in flight: `gathered` holds every rank's part, rank-major, once `work` completes.
struct PendingGather {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor input;     // kept alive until the gather completes
  at::Tensor gathered;  // the parts along dimension 0; [size, *part.shape] otherwise
  at::Tensor flat;      // what c10d writes: `gathered`, flat
  std::int64_t dim;
  std::optional<ReleasedCollective> released;  // of `input` and `flat`

  // The ranks' parts concatenated along `dim`.
  at::Tensor finish() {
    released->wait(std::move(work));
    if (dim == 0) return gathered;
    at::Tensor out = gathered.movedim(0, dim).flatten(dim, dim + 1).contiguous();
    return out.is_view() ? out.clone() : out;
  }
};

// Flat buffers throughout: c10d's gather and reduce-scatter into one tensor take it as the ranks'
// equal parts, one after another.
PendingGather start_all_gather(const at::Tensor& part, std::int64_t dim,
                               const TensorParallelGroup& group) {
  PendingGather pending;
  pending.dim = dim;
  pending.input = part.contiguous().view({-1});
  std::vector<std::int64_t> shape = part.sizes().vec();
  if (dim == 0) {
    shape[0] *= group.size;
  } else {
    shape.insert(shape.begin(), group.size);
  }
  pending.gathered = at::empty(shape, part.options());
  pending.flat = pending.gathered.view({-1});
  pending.released.emplace(std::vector<at::Tensor>{pending.input, pending.flat});
  pending.work = backend_of(group)->_allgather_base(pending.flat, pending.input);
  return pending;
}

at::Tensor all_gather(const at::Tensor& part, std::int64_t dim, const TensorParallelGroup& group) {
  return start_all_gather(part, dim, group).finish();
}

struct PendingReduceScatter {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor input;
  at::Tensor output;
  at::Tensor flat;                             // what c10d writes: `output`, flat
  std::optional<ReleasedCollective> released;  // of `input` and `flat`

  at::Tensor finish() {
    released->wait(std::move(work));
    return output;
  }
};

// This rank's part, along `dim`, of the sum over the group of `whole`.
PendingReduceScatter start_reduce_scatter(const at::Tensor& whole, std::int64_t dim,
                                          const TensorParallelGroup& group, const char* what) {
  const std::int64_t part =
      group.split(whole.size(dim), std::string(what) + "'s dimension " + std::to_string(dim));
  PendingReduceScatter pending;
  // Rank r's part moved to the front, so that the parts lie one after another.
  pending.input = whole.unflatten(dim, {group.size, part}).movedim(dim, 0).contiguous().view({-1});
  std::vector<std::int64_t> shape = whole.sizes().vec();
  shape[static_cast<std::size_t>(dim)] = part;
  pending.output = at::empty(shape, whole.options());
  pending.flat = pending.output.view({-1});
  pending.released.emplace(std::vector<at::Tensor>{pending.input, pending.flat});
  pending.work = backend_of(group)->_reduce_scatter_base(pending.flat, pending.input);
  return pending;
}

at::Tensor reduce_scatter(const at::Tensor& whole, std::int64_t dim,
                          const TensorParallelGroup& group, const char* what) {
  return start_reduce_scatter(whole, dim, group, what).finish();
}

// This rank's part of `whole` along `dim`, in a tensor of its own.
at::Tensor own_part(const at::Tensor& whole, std::int64_t dim, const TensorParallelGroup& group,
                    const char* what) {
  const std::int64_t part =
      group.split(whole.size(dim), std::string(what) + "'s dimension " + std::to_string(dim));
  return whole.narrow(dim, group.rank * part, part).clone(at::MemoryFormat::Contiguous);
}

// What a region operator's backward needs of its forward call.
struct Region : torch::CustomClassHolder {
  Region(TensorParallelGroup group_in, std::int64_t dim_in)
      : group(std::move(group_in)), dim(dim_in) {}
  TensorParallelGroup group;
  std::int64_t dim;
};

using RegionPtr = c10::intrusive_ptr<Region>;

void keep(AutogradContext* context, const RegionPtr& region) {
  context->saved_data["region"] = c10::IValue::make_capsule(region);
}

RegionPtr kept(AutogradContext* context) {
  return c10::static_intrusive_pointer_cast<Region>(context->saved_data.at("region").toCapsule());
}

class CopyToRegion : public torch::autograd::Function<CopyToRegion> {
 public:
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input,
                            const RegionPtr& region) {
    keep(context, region);
    return input;
  }
  static variable_list backward(AutogradContext* context, variable_list grad) {
    return {all_reduce(grad[0], kept(context)->group), {}};
  }
};

class ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
 public:
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input,
                            const RegionPtr& region) {
    return all_reduce(input, region->group);
  }
  static variable_list backward(AutogradContext* context, variable_list grad) {
    return {grad[0], {}};
  }
};

class GatherFromRegion : public torch::autograd::Function<GatherFromRegion> {
 public:
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input,
                            const RegionPtr& region) {
    keep(context, region);
    return all_gather(input, region->dim, region->group);
  }
  static variable_list backward(AutogradContext* context, variable_list grad) {
    const RegionPtr region = kept(context);
    return {own_part(grad[0], region->dim, region->group, "gather_from_tensor_parallel_region"),
            {}};
  }
};

class GatherFromSequenceRegion : public torch::autograd::Function<GatherFromSequenceRegion> {
 public:
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input,
                            const RegionPtr& region) {
    keep(context, region);
    return all_gather(input, region->dim, region->group);
  }
  static variable_list backward(AutogradContext* context, variable_list grad) {
    const RegionPtr region = kept(context);
    return {reduce_scatter(grad[0], region->dim, region->group,
                           "gather_from_sequence_parallel_region's gradient"),
            {}};
  }
};

class ReduceScatterToSequenceRegion
    : public torch::autograd::Function<ReduceScatterToSequenceRegion> {
 public:
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input,
                            const RegionPtr& region) {
    keep(context, region);
    return reduce_scatter(input, region->dim, region->group,
                          "reduce_scatter_to_sequence_parallel_region");
  }
  static variable_list backward(AutogradContext* context, variable_list grad) {
    const RegionPtr region = kept(context);
    return {all_gather(grad[0], region->dim, region->group), {}};
  }
};

class ScatterToSequenceRegion : public torch::autograd::Function<ScatterToSequenceRegion> {
 public:
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input,
                            const RegionPtr& region) {
    keep(context, region);
    return own_part(input, region->dim, region->group, "scatter_to_sequence_parallel_region");
  }
  static variable_list backward(AutogradContext* context, variable_list grad) {
    const RegionPtr region = kept(context);
    return {all_gather(grad[0], region->dim, region->group), {}};
  }
};

// A column-parallel linear layer on a sequence-parallel input, as Megatron-LM's
// LinearWithGradAccumulationAndAsyncCommunication: the forward gathers the sequence, but only
// this rank's slice is kept for backward, which gathers it again for the weight's gradient. That
// costs one more all-gather per backward and saves holding tp times the input. The products are
// those torch::nn::Linear takes (the input's matrix product with the weight, then the bias added
// in place) and those autograd takes for its gradients, so this rank's rows are the whole
// layer's.
class SequenceParallelColumnLinear
    : public torch::autograd::Function<SequenceParallelColumnLinear> {
 public:
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input,
                            const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            const RegionPtr& region) {
    keep(context, region);
    context->save_for_backward({input, weight});
    const bool has_bias = bias.has_value() && bias->defined();
    context->saved_data["bias"] = has_bias;
    if (has_bias) context->saved_data["bias_dtype"] = bias->scalar_type();
    // Under autocast the product runs in the autocast dtype; backward, where autocast is off,
    // computes in its gradient's dtype (that one) and casts back as autocast's casts would.
    const at::Tensor output =
        at::linear(all_gather(input, region->dim, region->group), weight, bias);
    return output.is_view() ? output.clone() : output;
  }

  static variable_list backward(AutogradContext* context, variable_list grad) {
    const RegionPtr region = kept(context);
    const variable_list saved = context->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const bool input_grad = context->needs_input_grad(0);
    const bool weight_grad = context->needs_input_grad(1);
    const bool bias_grad = context->saved_data.at("bias").toBool() && context->needs_input_grad(2);
    // The gather runs while the input's gradient is computed, the reduce-scatter while the
    // weight's is.
    std::optional<PendingGather> gathering;
    if (weight_grad) gathering = start_all_gather(input, region->dim, region->group);
    const at::Tensor grad_output = grad[0].reshape({-1, grad[0].size(-1)});
    const at::ScalarType compute = grad_output.scalar_type();
    std::optional<PendingReduceScatter> scattering;
    if (input_grad) {
      std::vector<std::int64_t> shape = grad[0].sizes().vec();
      shape.back() = weight.size(1);
      scattering = start_reduce_scatter(grad_output.mm(weight.to(compute)).view(shape), region->dim,
                                        region->group, "ColumnParallelLinear's input gradient");
    }
    variable_list out(4);
    if (weight_grad) {
      const at::Tensor gathered = gathering->finish();
      out[1] = grad_output.t()
                   .mm(gathered.reshape({-1, gathered.size(-1)}).to(compute))
                   .to(weight.scalar_type());
    }
    if (bias_grad) {
      out[2] = grad_output.sum(0).to(context->saved_data.at("bias_dtype").toScalarType());
    }
    if (scattering) out[0] = scattering->finish().to(input.scalar_type());
    return out;
  }
};

class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* context, const at::Tensor& local_logits,
                            const at::Tensor& target, const RegionPtr& region,
                            std::int64_t ignore_index) {
    const TensorParallelGroup& group = region->group;
    const std::int64_t local_vocab = local_logits.size(-1);
    // In float32, as at::cross_entropy_loss runs under autocast.
    const at::Tensor logits = local_logits.reshape({-1, local_vocab}).to(at::kFloat);
    const at::Tensor flat_target = target.reshape({-1});
    at::Tensor row_max = std::get<0>(logits.max(-1));
    if (group.size > 1) row_max = all_reduce(row_max, group, c10d::ReduceOp::MAX);
    const at::Tensor shifted = logits - row_max.unsqueeze(-1);

    // Only the rank that holds a row's target sees its logit; the others add zero.
    const std::int64_t begin = group.rank * local_vocab;
    const at::Tensor elsewhere = (flat_target < begin) | (flat_target >= begin + local_vocab);
    const at::Tensor local_target = (flat_target - begin).masked_fill(elsewhere, 0);
    const at::Tensor target_logit =
        shifted.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(elsewhere, 0);
    const at::Tensor exponentials = shifted.exp();
    // Both sums in one all-reduce.
    at::Tensor sums = at::stack({target_logit, exponentials.sum(-1)});
    if (group.size > 1) sums = all_reduce(sums, group);
    const at::Tensor sum_exp = sums[1];
    const at::Tensor ignored = flat_target == ignore_index;
    const at::Tensor loss = (sum_exp.log() - sums[0]).masked_fill(ignored, 0);

    context->save_for_backward(
        {exponentials.div_(sum_exp.unsqueeze(-1)), local_target, elsewhere, ignored});
    context->saved_data["dtype"] = local_logits.scalar_type();
    context->saved_data["shape"] = local_logits.sizes().vec();
    // Not a view of the flat loss (see the collectives above).
    return target.dim() == 1 ? loss : loss.reshape(target.sizes()).clone();
  }

  static variable_list backward(AutogradContext* context, variable_list grad) {
    const variable_list saved = context->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local_target = saved[1];
    const at::Tensor& elsewhere = saved[2];
    const at::Tensor& ignored = saved[3];
    // softmax - one-hot(target), the one-hot only on the rank that holds the target.
    at::Tensor grad_logits = softmax.clone();
    grad_logits.scatter_add_(
        1, local_target.unsqueeze(1),
        elsewhere.logical_not().to(grad_logits.scalar_type()).neg().unsqueeze(1));
    const at::Tensor grad_loss = grad[0].reshape({-1}).to(at::kFloat).masked_fill(ignored, 0);
    grad_logits.mul_(grad_loss.unsqueeze(1));
    return {grad_logits.to(context->saved_data.at("dtype").toScalarType())
                .view(context->saved_data.at("shape").toIntVector()),
            {},
            {},
            {}};
  }
};

void require_shape(const at::Tensor& tensor, const std::vector<std::int64_t>& expected,
                   const std::string& what) {
  if (!tensor.defined() || tensor.sizes() != at::IntArrayRef(expected)) {
    throw Error(what + " must have shape " + shape_text(expected) + ", got " +
                (tensor.defined() ? shape_text(tensor.sizes()) : std::string("none")));
  }
}

void copy_into(at::Tensor& parameter, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  parameter.copy_(value);
}

}  // namespace

TensorParallelGroup TensorParallelGroup::of(const ProcessMesh* mesh) {
  TensorParallelGroup group;
  if (!mesh) return group;
  group.rank = mesh->rank(MeshGroup::kTensor);
  group.size = mesh->size(MeshGroup::kTensor);
  if (group.size > 1) group.backend = mesh->group(MeshGroup::kTensor);
  return group;
}

std::int64_t TensorParallelGroup::split(std::int64_t size_to_split, const std::string& what) const {
  if (size < 1 || size_to_split % size != 0) {
    throw Error(what + " (" + std::to_string(size_to_split) + ") does not divide by tp (" +
                std::to_string(size) + ")");
  }
  return size_to_split / size;
}

at::Tensor TensorParallelGroup::shard_of(const at::Tensor& whole, std::int64_t dim) const {
  dim = wrapped_dim(dim, whole, "shard_of");
  const std::int64_t part =
      split(whole.size(dim), "dimension " + std::to_string(dim) + " of the whole tensor " +
                                 shape_text(whole.sizes()));
  return whole.detach().narrow(dim, rank * part, part).clone(at::MemoryFormat::Contiguous);
}

at::Tensor copy_to_tensor_parallel_region(const at::Tensor& input,
                                          const TensorParallelGroup& group) {
  if (group.size == 1) return input;
  return CopyToRegion::apply(input, c10::make_intrusive<Region>(group, -1));
}

at::Tensor reduce_from_tensor_parallel_region(const at::Tensor& input,
                                              const TensorParallelGroup& group) {
  if (group.size == 1) return input;
  return ReduceFromRegion::apply(input, c10::make_intrusive<Region>(group, -1));
}

at::Tensor gather_from_tensor_parallel_region(const at::Tensor& input,
                                              const TensorParallelGroup& group) {
  if (group.size == 1) return input;
  const std::int64_t last = wrapped_dim(-1, input, "gather_from_tensor_parallel_region");
  return GatherFromRegion::apply(input, c10::make_intrusive<Region>(group, last));
}

at::Tensor gather_from_sequence_parallel_region(const at::Tensor& input, std::int64_t dim,
                                                const TensorParallelGroup& group) {
  if (group.size == 1) return input;
  dim = wrapped_dim(dim, input, "gather_from_sequence_parallel_region");
  return GatherFromSequenceRegion::apply(input, c10::make_intrusive<Region>(group, dim));
}

at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& input, std::int64_t dim,
                                                      const TensorParallelGroup& group) {
  if (group.size == 1) return input;
  dim = wrapped_dim(dim, input, "reduce_scatter_to_sequence_parallel_region");
  return ReduceScatterToSequenceRegion::apply(input, c10::make_intrusive<Region>(group, dim));
}

at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& input, std::int64_t dim,
                                               const TensorParallelGroup& group) {
  if (group.size == 1) return input;
  dim = wrapped_dim(dim, input, "scatter_to_sequence_parallel_region");
  return ScatterToSequenceRegion::apply(input, c10::make_intrusive<Region>(group, dim));
}

void all_reduce_sequence_parallel_gradients(const std::vector<at::Tensor>& parameters,
                                            const TensorParallelGroup& group) {
  if (group.size == 1) return;
  // One all-reduce per dtype and device over the gradients laid end to end.
  std::map<std::pair<at::ScalarType, std::string>, std::vector<at::Tensor>> by_kind;
  for (const auto& parameter : parameters) {
    const at::Tensor& gradient = parameter.grad();
    if (!gradient.defined()) continue;
    by_kind[{gradient.scalar_type(), gradient.device().str()}].push_back(gradient);
  }
  at::NoGradGuard no_grad;
  for (auto& [kind, gradients] : by_kind) {
    std::vector<at::Tensor> flat;
    for (const auto& gradient : gradients) flat.push_back(gradient.reshape({-1}));
    std::vector<at::Tensor> buffer{at::cat(flat)};
    ReleasedCollective released(buffer);
    released.wait(backend_of(group)->allreduce(buffer));
    std::int64_t offset = 0;
    for (auto& gradient : gradients) {
      gradient.copy_(buffer[0].narrow(0, offset, gradient.numel()).view_as(gradient));
      offset += gradient.numel();
    }
  }
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(std::int64_t in_features,
                                                   std::int64_t out_features, bool with_bias,
                                                   TensorParallelGroup group, bool gather_output,
                                                   bool sequence_parallel,
                                                   std::int64_t sequence_dim)
    : group_(std::move(group)),
      gather_output_(gather_output),
      sequence_parallel_(sequence_parallel),
      sequence_dim_(sequence_dim) {
  const std::int64_t local = group_.split(out_features, "ColumnParallelLinear's out_features");
  weight = register_parameter("weight", at::zeros({local, in_features}));
  // Undefined and registered, as torch::nn::Linear keeps a bias it does not have.
  bias = register_parameter("bias", with_bias ? at::zeros({local}) : at::Tensor(), with_bias);
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  at::Tensor output;
  if (sequence_parallel_ && group_.size > 1) {
    const std::int64_t dim = wrapped_dim(sequence_dim_, input, "ColumnParallelLinear");
    output = SequenceParallelColumnLinear::apply(
        input, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
        c10::make_intrusive<Region>(group_, dim));
  } else {
    // at::linear, as torch.nn.functional.linear: it adds the bias inside the product. The C++
    // frontend's torch::nn::functional::linear multiplies a 3-d input first and adds the bias
    // after, which under bf16 autocast rounds twice and trains differently from Python.
    output = at::linear(copy_to_tensor_parallel_region(input, group_), weight, bias);
  }
  return gather_output_ ? gather_from_tensor_parallel_region(output, group_) : output;
}

void ColumnParallelLinearImpl::load_whole(const at::Tensor& whole_weight,
                                          const at::Tensor& whole_bias) {
  const std::int64_t out = weight.size(0) * group_.size;
  require_shape(whole_weight, {out, weight.size(1)}, "ColumnParallelLinear's whole weight");
  copy_into(weight, group_.shard_of(whole_weight, 0));
  if (!whole_bias.defined()) return;
  if (!bias.defined()) throw Error("ColumnParallelLinear has no bias to load");
  require_shape(whole_bias, {out}, "ColumnParallelLinear's whole bias");
  copy_into(bias, group_.shard_of(whole_bias, 0));
}

RowParallelLinearImpl::RowParallelLinearImpl(std::int64_t in_features, std::int64_t out_features,
                                             bool with_bias, TensorParallelGroup group,
                                             bool sequence_parallel, std::int64_t sequence_dim)
    : group_(std::move(group)), sequence_parallel_(sequence_parallel), sequence_dim_(sequence_dim) {
  const std::int64_t local = group_.split(in_features, "RowParallelLinear's in_features");
  weight = register_parameter("weight", at::zeros({out_features, local}));
  bias =
      register_parameter("bias", with_bias ? at::zeros({out_features}) : at::Tensor(), with_bias);
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  if (group_.size == 1) return at::linear(input, weight, bias);
  const at::Tensor partial = at::linear(input, weight);
  at::Tensor output = sequence_parallel_ ? reduce_scatter_to_sequence_parallel_region(
                                               partial, sequence_dim_, group_)
                                         : reduce_from_tensor_parallel_region(partial, group_);
  // Once, after the partial products are summed; in place as torch::nn::Linear adds it, so that
  // the output keeps the product's dtype under autocast.
  if (bias.defined()) output.add_(bias);
  return output;
}

void RowParallelLinearImpl::load_whole(const at::Tensor& whole_weight,
                                       const at::Tensor& whole_bias) {
  const std::int64_t out = weight.size(0);
  require_shape(whole_weight, {out, weight.size(1) * group_.size},
                "RowParallelLinear's whole weight");
  copy_into(weight, group_.shard_of(whole_weight, 1));
  if (!whole_bias.defined()) return;
  if (!bias.defined()) throw Error("RowParallelLinear has no bias to load");
  require_shape(whole_bias, {out}, "RowParallelLinear's whole bias");
  copy_into(bias, whole_bias.detach());
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(std::int64_t vocab, std::int64_t dim,
                                                       TensorParallelGroup group)
    : group_(std::move(group)) {
  const std::int64_t local = group_.split(vocab, "VocabParallelEmbedding's vocabulary");
  vocab_begin_ = group_.rank * local;
  weight = register_parameter("weight", at::zeros({local, dim}));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (group_.size == 1) return at::embedding(weight, ids);
  const at::Tensor elsewhere = (ids < vocab_begin_) | (ids >= vocab_begin_ + weight.size(0));
  const at::Tensor local = at::embedding(weight, (ids - vocab_begin_).masked_fill(elsewhere, 0))
                               .masked_fill(elsewhere.unsqueeze(-1), 0);
  return reduce_from_tensor_parallel_region(local, group_);
}

void VocabParallelEmbeddingImpl::load_whole(const at::Tensor& whole_weight) {
  require_shape(whole_weight, {weight.size(0) * group_.size, weight.size(1)},
                "VocabParallelEmbedding's whole weight");
  copy_into(weight, group_.shard_of(whole_weight, 0));
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& target,
                                        const TensorParallelGroup& group,
                                        std::int64_t ignore_index) {
  if (local_logits.dim() < 1 ||
      target.sizes() != local_logits.sizes().slice(0, local_logits.dim() - 1)) {
    throw Error("vocab_parallel_cross_entropy: the target's shape " + shape_text(target.sizes()) +
                " is not the logits' " + shape_text(local_logits.sizes()) +
                " without their last dimension");
  }
  if (group.size > 1) backend_of(group);
  return VocabParallelCrossEntropy::apply(local_logits, target,
                                          c10::make_intrusive<Region>(group, -1), ignore_index);
}

at::Tensor vocab_parallel_argmax(const at::Tensor& local_logits, const TensorParallelGroup& group) {
  at::NoGradGuard no_grad;
  const at::Tensor local = local_logits.detach();
  const at::Tensor index = at::argmax(local, -1);
  if (group.size == 1) return index;
  const at::Tensor value = local.gather(-1, index.unsqueeze(-1)).squeeze(-1);
  // Each rank's best value and its whole index, as doubles (exact for both), in one gather.
  const at::Tensor candidate =
      at::stack({value.to(at::kDouble), (index + group.rank * local.size(-1)).to(at::kDouble)});
  const at::Tensor candidates = all_gather(candidate.unsqueeze(0), 0, group);  // [tp, 2, ...]
  // at::argmax takes the first maximum (and a NaN over any number): the lowest rank, which holds
  // the lowest indices.
  const at::Tensor winner = at::argmax(candidates.select(1, 0), 0, /*keepdim=*/true);
  return candidates.select(1, 1).gather(0, winner).squeeze(0).to(at::kLong);
}

}  // namespace trainyard
