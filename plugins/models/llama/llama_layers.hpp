#pragma once
// The llama's building blocks: how a build holds each parameter (ParameterSource: published
// weights or per-parameter streams, whole or this rank's tensor-parallel share) and the modules
// its blocks are made of (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, the
// embedding and the head), with the tensor-parallel collectives each needs. Included by llama.cpp
// alone.

#include <ATen/ATen.h>
#include <torch/nn/module.h>
// TensorParallelGroup holds its backend by value: copying one needs the complete type, which
// tensor_parallel.hpp only declares.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cmath>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "llama_config.hpp"
#include "lora.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/models/deferred_parameters.hpp"
#include "trainyard/models/parameter_init.hpp"
#include "trainyard/models/pretrained_weights.hpp"
#include "trainyard/parallel/tensor_parallel.hpp"

namespace trainyard::llama {

// A target that is not scored: PyTorch's default ignore_index.
inline constexpr std::int64_t kIgnoredTarget = -100;
// The dimension the sequence runs along in the residual stream [B, T, d].
inline constexpr std::int64_t kSequenceDim = 1;
inline const std::string kEmbedWeight = "model.embed_tokens.weight";
inline const std::string kHeadWeight = "lm_head.weight";

inline std::string layer_prefix(std::int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".";
}

// How this build splits the model over the mesh's tp group.
struct TensorSplit {
  TensorParallelGroup group;
  bool sequence_parallel = false;  // only with more than one rank
  // Whether each rank holds its share of the key/value heads (tp divides their count) rather
  // than all of them.
  bool kv_heads_split = false;

  bool split() const { return group.size > 1; }
};

// How a parameter is held: whole, or this rank's even share along one dimension.
struct Holding {
  std::vector<std::int64_t> whole;
  std::int64_t split_dim = -1;

  std::vector<std::int64_t> offsets(const TensorParallelGroup& group) const {
    std::vector<std::int64_t> result(whole.size(), 0);
    if (split_dim >= 0) result[split_dim] = whole[split_dim] / group.size * group.rank;
    return result;
  }
  std::vector<std::int64_t> held(const TensorParallelGroup& group) const {
    std::vector<std::int64_t> result = whole;
    if (split_dim >= 0) result[split_dim] /= group.size;
    return result;
  }
};

enum class Initial { kNormal, kOnes };

// The first values of each parameter, from published weights or from its own stream: this
// rank's part of whole parameter `name`. Shared by the closures that make deferred parameters
// later, so it owns what it reads from.
class ParameterValues {
 public:
  ParameterValues(const LlamaConfig& config, const TensorSplit& split,
                  std::shared_ptr<const PretrainedWeights> weights, std::uint64_t seed)
      : config_(config), split_(split), weights_(std::move(weights)), init_(seed) {}

  const TensorSplit& split() const { return split_; }
  // The group a parameter held as `holding` is split over: a group of one when held whole.
  const TensorParallelGroup& group_of(const Holding& holding) const {
    return holding.split_dim >= 0 ? split_.group : whole_group_;
  }

  torch::Tensor held(const std::string& name, const Holding& holding, Initial initial) const {
    const TensorParallelGroup& group = group_of(holding);
    if (weights_) {
      return weights_->read(name, holding.offsets(group), holding.held(group), at::kFloat);
    }
    // Drawn whole, whatever this rank holds, so that every slice is the whole model's.
    torch::Tensor drawn = at::empty(holding.whole);
    if (initial == Initial::kOnes) {
      init_.fill(drawn, 1.0);
    } else {
      init_.normal(drawn, name, 0.0, config_.initializer_range);
      if (name == kEmbedWeight && config_.pad_token_id) drawn[*config_.pad_token_id].zero_();
    }
    return group.size > 1 ? group.shard_of(drawn, holding.split_dim) : drawn;
  }

  // This rank's part of adapter matrix `name`, drawn whatever the base weights came from:
  // lora_A kaiming-uniform (a = sqrt(5)), lora_B zeros, as PEFT initialises them.
  torch::Tensor adapter(const std::string& name, const Holding& holding, bool is_a) const {
    torch::Tensor drawn = at::zeros(holding.whole);
    if (is_a) init_.kaiming_uniform(drawn, name, std::sqrt(5.0));
    const TensorParallelGroup& group = group_of(holding);
    return group.size > 1 ? group.shard_of(drawn, holding.split_dim) : drawn;
  }

 private:
  LlamaConfig config_;
  TensorSplit split_;
  TensorParallelGroup whole_group_;  // a group of one: the whole tensor
  std::shared_ptr<const PretrainedWeights> weights_;
  ParameterInit init_;
};

// Gives each parameter its first values (ParameterValues), now or, when the strategy defers
// them (deferred_parameters.hpp), when it makes them; and records how each is held
// (parameter_layout).
class ParameterSource {
 public:
  // `compute_dtype`: what the run's matrix products compute in, when autocast lowers it; the
  // frozen base of a model with adapters is kept in it.
  ParameterSource(const LlamaConfig& config, const TensorSplit& split,
                  std::shared_ptr<const PretrainedWeights> weights, std::uint64_t seed,
                  const llama::LoraSettings& lora, std::shared_ptr<DeferredParameters> deferred,
                  std::optional<c10::ScalarType> compute_dtype)
      : values_(std::make_shared<const ParameterValues>(config, split, std::move(weights), seed)),
        lora_(lora),
        deferred_(std::move(deferred)) {
    if (lora_.enabled() && compute_dtype && *compute_dtype != at::kFloat) {
      frozen_projection_dtype_ = compute_dtype;
    }
  }

  const llama::LoraSettings& lora() const { return lora_; }
  const TensorSplit& split() const { return values_->split(); }

  // Adapters are made at once: they are small, and what trains.
  torch::Tensor make_adapter(const std::string& name, const Holding& holding, bool is_a) {
    return values_->adapter(name, holding, is_a);
  }

  // A new parameter tensor holding this rank's part of whole parameter `name`.
  torch::Tensor make(const std::string& name, const Holding& holding, Initial initial) {
    if (!deferred_) return values_->held(name, holding, initial);
    return deferred_->defer(holding.held(values_->group_of(holding)),
                            maker(name, holding, initial));
  }

  // A projection's weight: with adapters it is frozen and read by matrix products alone, so it
  // is made at once in the compute dtype, where autocast would cast it for every product; fsdp
  // keeps frozen weights whole, outside its units, and has nothing to defer.
  torch::Tensor make_projection(const std::string& name, const Holding& holding) {
    if (!frozen_projection_dtype_) return make(name, holding, Initial::kNormal);
    return values_->held(name, holding, Initial::kNormal).to(*frozen_projection_dtype_);
  }

  // Gives `parameter` (a module's own) its values, as make() would.
  void assign(const torch::Tensor& parameter, const std::string& name, const Holding& holding,
              Initial initial) {
    if (!deferred_) {
      at::Tensor(parameter).copy_(values_->held(name, holding, initial));
      return;
    }
    deferred_->defer_existing(parameter, maker(name, holding, initial));
  }

  // The layout of a parameter held as `holding` of whole parameter `name`.
  HeldLayout layout(const std::string& name, const Holding& holding) const {
    if (holding.split_dim < 0 || !split().split()) {
      return whole_parameter_layout(name, holding.whole);
    }
    return parameter_box_layout(name, holding.whole, holding.offsets(split().group),
                                holding.held(split().group));
  }

 private:
  std::shared_ptr<const ParameterValues> values_;
  llama::LoraSettings lora_;
  std::shared_ptr<DeferredParameters> deferred_;
  std::optional<c10::ScalarType> frozen_projection_dtype_;

  DeferredParameters::Make maker(const std::string& name, const Holding& holding,
                                 Initial initial) const {
    return [values = values_, name, holding, initial] {
      return values->held(name, holding, initial);
    };
  }
};

// Every parameter of the whole model, by its transformers name, with its whole shape: what a

// the ranks' partial gradients.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(torch::Tensor initial, double eps, const TensorSplit& split)
      : weight(register_parameter("weight", std::move(initial))), eps_(eps), split_(split) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = x.to(at::kFloat);
    const torch::Tensor normalised = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    const torch::Tensor scale =
        split_.sequence_parallel ? copy_to_tensor_parallel_region(weight, split_.group) : weight;
    return scale * normalised.to(x.scalar_type());
  }

  torch::Tensor weight;

 private:
  double eps_;
  TensorSplit split_;
};
TORCH_MODULE(RmsNorm);

// A bias-free projection holding this rank's part of a whole weight (a parameter-only module:
// the layers apply it with the collectives their position needs).
class ProjectionImpl : public torch::nn::Module {
 public:
  explicit ProjectionImpl(torch::Tensor initial)
      : weight(register_parameter("weight", std::move(initial))) {}

  // Adds LoRA adapters (lora.hpp) as the submodules lora_A and lora_B. An adapter held whole
  // while the layer runs split over tp ranks serves only this rank's share of the computation:
  // its gradient is summed across the group, as for key/value weights held whole.
  void add_adapters(torch::Tensor a, bool a_whole, torch::Tensor b, bool b_whole, double scale,
                    const TensorSplit& split) {
    lora_A = register_module("lora_A", std::make_shared<ProjectionImpl>(std::move(a)));
    lora_B = register_module("lora_B", std::make_shared<ProjectionImpl>(std::move(b)));
    sum_a_ = a_whole && split.split();
    sum_b_ = b_whole && split.split();
    group_ = split.group;
    scale_ = scale;
  }

  // x base_weight^T, plus the adapters' ((x A^T) B^T) * alpha / r when there are any, in PEFT's
  // order. `base_weight` is this projection's weight as the layer uses it.
  torch::Tensor apply(const torch::Tensor& x, const torch::Tensor& base_weight) const {
    torch::Tensor y = at::linear(x, base_weight);
    if (!lora_A) return y;
    const torch::Tensor a =
        sum_a_ ? copy_to_tensor_parallel_region(lora_A->weight, group_) : lora_A->weight;
    const torch::Tensor b =
        sum_b_ ? copy_to_tensor_parallel_region(lora_B->weight, group_) : lora_B->weight;
    return y + at::linear(at::linear(x, a), b) * scale_;
  }

  torch::Tensor weight;
  std::shared_ptr<ProjectionImpl> lora_A, lora_B;

 private:
  bool sum_a_ = false, sum_b_ = false;
  TensorParallelGroup group_;
  double scale_ = 1.0;
};
TORCH_MODULE(Projection);

// The inverse frequencies of the rotary embedding, computed as transformers computes them (in
// fp32, in the same order), with Llama 3.1's scaling when configured.
inline torch::Tensor rotary_inverse_frequencies(const LlamaConfig& config) {
  const auto dim = static_cast<double>(config.head_dim);
  const torch::Tensor exponents =
      at::arange(0, config.head_dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) / dim;
  torch::Tensor inv_freq = 1.0 / at::pow(config.rope_theta, exponents);
  if (!config.llama3_scaling) return inv_freq;
  const llama::Llama3RopeScaling& s = *config.llama3_scaling;
  const auto old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const torch::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
  torch::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const torch::Tensor smooth =
      (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const torch::Tensor medium =
      (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

// Rotates `x` [B, heads, T, head_dim] by its positions: x cos + rotate_half(x) sin.
inline torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                                  const torch::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated =
      at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, /*dim=*/-1);
  return x * cos + rotated * sin;
}

// The tensor a column-parallel projection multiplies: the whole sequence on every rank.
inline torch::Tensor enter_column_parallel(const torch::Tensor& x, const TensorSplit& split) {
  if (split.sequence_parallel) {
    return gather_from_sequence_parallel_region(x, kSequenceDim, split.group);
  }
  return split.split() ? copy_to_tensor_parallel_region(x, split.group) : x;
}

// A row-parallel projection's partial sums combined: summed, or with sequence parallelism summed
// and scattered along the sequence.
inline torch::Tensor leave_row_parallel(const torch::Tensor& partial, const TensorSplit& split) {
  if (split.sequence_parallel) {
    return reduce_scatter_to_sequence_parallel_region(partial, kSequenceDim, split.group);
  }
  return split.split() ? reduce_from_tensor_parallel_region(partial, split.group) : partial;
}

// Registers projection `name` of `owner` (whole name prefix + name + ".weight"), held as `holding`,
// and records its layout.
inline Projection add_projection(torch::nn::Module& owner, const std::string& name,
                                 const std::string& prefix, const Holding& holding,
                                 ParameterSource& source,
                                 std::map<std::string, HeldLayout>& layouts) {
  const std::string whole = prefix + name + ".weight";
  layouts[whole] = source.layout(whole, holding);
  Projection projection =
      owner.register_module(name, Projection(source.make_projection(whole, holding)));
  const llama::LoraSettings& lora = source.lora();
  if (!lora.targets_projection(name)) return projection;
  // A [r, in] is split like W's columns (row-parallel W), B [out, r] like W's rows
  // (column-parallel W); otherwise each is held whole.
  const std::int64_t out = holding.whole[0], in = holding.whole[1];
  const Holding a{{lora.rank, in}, holding.split_dim == 1 ? 1 : -1};
  const Holding b{{out, lora.rank}, holding.split_dim == 0 ? 0 : -1};
  const std::string a_name = prefix + name + ".lora_A.weight";
  const std::string b_name = prefix + name + ".lora_B.weight";
  layouts[a_name] = source.layout(a_name, a);
  layouts[b_name] = source.layout(b_name, b);
  projection->add_adapters(source.make_adapter(a_name, a, true), a.split_dim < 0,
                           source.make_adapter(b_name, b, false), b.split_dim < 0, lora.scale(),
                           source.split());
  return projection;
}

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const LlamaConfig& config, const TensorSplit& split, ParameterSource& source,
                const std::string& prefix, std::map<std::string, HeldLayout>& layouts)
      : head_dim_(config.head_dim), split_(split) {
    const std::int64_t d = config.hidden_size, heads = config.num_attention_heads,
                       kv_heads = config.num_key_value_heads;
    const std::int64_t tp = split.group.size;
    local_heads_ = heads / tp;
    const std::int64_t kv_split_dim = split.kv_heads_split ? 0 : -1;
    q_proj = add("q_proj", prefix, Holding{{heads * head_dim_, d}, 0}, source, layouts);
    k_proj =
        add("k_proj", prefix, Holding{{kv_heads * head_dim_, d}, kv_split_dim}, source, layouts);
    v_proj =
        add("v_proj", prefix, Holding{{kv_heads * head_dim_, d}, kv_split_dim}, source, layouts);
    o_proj = add("o_proj", prefix, Holding{{d, heads * head_dim_}, 1}, source, layouts);
    // Which of this rank's key/value heads each of its query heads reads (transformers'
    // repeat_kv: query head h reads key/value head h / groups).
    const std::int64_t groups = config.query_groups();
    const std::int64_t first_query = split.group.rank * local_heads_;
    const std::int64_t first_kv = split.kv_heads_split ? first_query / groups : 0;
    std::vector<std::int64_t> index;
    for (std::int64_t h = 0; h < local_heads_; ++h)
      index.push_back((first_query + h) / groups - first_kv);
    plain_groups_ = split.kv_heads_split || !split.split();
    kv_index_ = at::tensor(index, at::TensorOptions().dtype(at::kLong));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    const torch::Tensor input = enter_column_parallel(x, split_);
    const std::int64_t batch = input.size(0), length = input.size(1);
    const auto heads_of = [&](const torch::Tensor& projected) {
      return projected.view({batch, length, -1, head_dim_}).transpose(1, 2);
    };
    torch::Tensor q = heads_of(q_proj->apply(input, q_proj->weight));
    torch::Tensor k = heads_of(k_proj->apply(input, kv_weight(k_proj->weight)));
    torch::Tensor v = heads_of(v_proj->apply(input, kv_weight(v_proj->weight)));
    q = apply_rotary(q, cos, sin);
    k = apply_rotary(k, cos, sin);
    bool grouped = false;
    if (k.size(1) != local_heads_) {
      if (plain_groups_) {
        grouped = true;  // contiguous groups of query heads per key/value head
      } else {
        const torch::Tensor index = kv_index_.to(k.device());
        k = k.index_select(1, index);
        v = v.index_select(1, index);
      }
    }
    torch::Tensor attended = at::scaled_dot_product_attention(
        q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
        /*scale=*/std::pow(static_cast<double>(head_dim_), -0.5), /*enable_gqa=*/grouped);
    attended = attended.transpose(1, 2).reshape({batch, length, local_heads_ * head_dim_});
    return leave_row_parallel(o_proj->apply(attended, o_proj->weight), split_);
  }

  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  std::int64_t head_dim_;
  std::int64_t local_heads_ = 0;
  bool plain_groups_ = true;
  torch::Tensor kv_index_;
  TensorSplit split_;

  // Key/value weights held whole on every tp rank serve only this rank's query heads here: their
  // gradients are summed across the group, so every rank ends with the whole gradient.
  torch::Tensor kv_weight(const torch::Tensor& weight) const {
    if (!split_.split() || split_.kv_heads_split) return weight;
    return copy_to_tensor_parallel_region(weight, split_.group);
  }

  Projection add(const std::string& name, const std::string& prefix, const Holding& holding,
                 ParameterSource& source, std::map<std::string, HeldLayout>& layouts) {
    return add_projection(*this, name, prefix, holding, source, layouts);
  }
};
TORCH_MODULE(Attention);

class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(const LlamaConfig& config, const TensorSplit& split, ParameterSource& source,
                  const std::string& prefix, std::map<std::string, HeldLayout>& layouts)
      : split_(split) {
    const std::int64_t d = config.hidden_size, ff = config.intermediate_size;
    gate_proj = add("gate_proj", prefix, Holding{{ff, d}, 0}, source, layouts);
    up_proj = add("up_proj", prefix, Holding{{ff, d}, 0}, source, layouts);
    down_proj = add("down_proj", prefix, Holding{{d, ff}, 1}, source, layouts);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor input = enter_column_parallel(x, split_);
    const torch::Tensor hidden = at::silu(gate_proj->apply(input, gate_proj->weight)) *
                                 up_proj->apply(input, up_proj->weight);
    return leave_row_parallel(down_proj->apply(hidden, down_proj->weight), split_);
  }

  Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  TensorSplit split_;

  Projection add(const std::string& name, const std::string& prefix, const Holding& holding,
                 ParameterSource& source, std::map<std::string, HeldLayout>& layouts) {
    return add_projection(*this, name, prefix, holding, source, layouts);
  }
};
TORCH_MODULE(FeedForward);

// The cos and sin of every position's rotation [T, head_dim], shared by the layers of a build.
class RotaryTable {
 public:
  explicit RotaryTable(const LlamaConfig& config) : inv_freq_(rotary_inverse_frequencies(config)) {}

  std::pair<torch::Tensor, torch::Tensor> at_positions(std::int64_t length, c10::Device device,
                                                       c10::ScalarType dtype) const {
    const torch::Tensor positions =
        at::arange(length, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat);
    const torch::Tensor freqs = positions.unsqueeze(-1) * inv_freq_.to(device);
    const torch::Tensor angles = at::cat({freqs, freqs}, -1);
    return {angles.cos().to(dtype), angles.sin().to(dtype)};
  }

 private:
  torch::Tensor inv_freq_;
};

class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const LlamaConfig& config, const TensorSplit& split, ParameterSource& source,
               std::int64_t index, std::shared_ptr<const RotaryTable> rotary,
               std::map<std::string, HeldLayout>& layouts)
      : rotary_(std::move(rotary)), split_(split) {
    const std::string prefix = layer_prefix(index);
    const Holding norm{{config.hidden_size}, -1};
    input_layernorm = register_module(
        "input_layernorm",
        RmsNorm(source.make(prefix + "input_layernorm.weight", norm, Initial::kOnes),
                config.rms_norm_eps, split));
    self_attn = register_module("self_attn",
                                Attention(config, split, source, prefix + "self_attn.", layouts));
    post_attention_layernorm = register_module(
        "post_attention_layernorm",
        RmsNorm(source.make(prefix + "post_attention_layernorm.weight", norm, Initial::kOnes),
                config.rms_norm_eps, split));
    mlp = register_module("mlp", FeedForward(config, split, source, prefix + "mlp.", layouts));
  }

  // `x` is [B, T, d], or with sequence parallelism this rank's [B, T / tp, d].
  torch::Tensor forward(const torch::Tensor& x) {
    const std::int64_t length = x.size(1) * (split_.sequence_parallel ? split_.group.size : 1);
    auto [cos, sin] = rotary_->at_positions(length, x.device(), x.scalar_type());
    const torch::Tensor h = x + self_attn->forward(input_layernorm(x), cos, sin);
    return h + mlp(post_attention_layernorm(h));
  }

  RmsNorm input_layernorm{nullptr};
  Attention self_attn{nullptr};
  RmsNorm post_attention_layernorm{nullptr};
  FeedForward mlp{nullptr};

 private:
  std::shared_ptr<const RotaryTable> rotary_;
  TensorSplit split_;
};

// Token ids to activations. The padding token's row (pad_token_id) takes no gradient, as in
// nn.Embedding with padding_idx: its lookups are detached.
class EmbedBlock : public torch::nn::Module {
 public:
  EmbedBlock(VocabParallelEmbedding embedding, std::optional<std::int64_t> pad, TensorSplit split)
      : embed_tokens(register_module("embed_tokens", std::move(embedding))),
        pad_(pad),
        split_(std::move(split)) {}

  torch::Tensor forward(const torch::Tensor& ids) {
    if (ids.dim() != 2 || at::isFloatingType(ids.scalar_type())) {
      throw Error("model 'llama' takes integer token ids [batch, sequence], got a " +
                  std::to_string(ids.dim()) + "-d tensor of " +
                  std::string(c10::toString(ids.scalar_type())));
    }
    if (split_.sequence_parallel && ids.size(1) % split_.group.size != 0) {
      throw Error("model 'llama' with sequence_parallel got sequences of " +
                  std::to_string(ids.size(1)) + " tokens, which do not divide by tp (" +
                  std::to_string(split_.group.size) + ")");
    }
    torch::Tensor x = embed_tokens(ids);
    if (pad_) x = at::where(ids.eq(*pad_).unsqueeze(-1), x.detach(), x);
    if (split_.sequence_parallel) {
      x = scatter_to_sequence_parallel_region(x, kSequenceDim, split_.group);
    }
    return x;
  }

  VocabParallelEmbedding embed_tokens;

 private:
  std::optional<std::int64_t> pad_;
  TensorSplit split_;
};

// The final norm and the output projection: with tp, this rank's rows of the vocabulary.
class HeadBlock : public torch::nn::Module {
 public:
  HeadBlock(RmsNorm norm, const torch::Tensor& head_weight, TensorSplit split)
      : norm(register_module("norm", std::move(norm))),
        weight(register_parameter("weight", head_weight)),
        split_(std::move(split)) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return at::linear(enter_column_parallel(norm(x), split_), weight);
  }

  RmsNorm norm;
  torch::Tensor weight;

 private:
  TensorSplit split_;
};

}  // namespace trainyard::llama
