// A Llama-family decoder (transformers' LlamaForCausalLM): token embedding, pre-norm blocks of
// grouped-query causal self-attention with rotary position embeddings and a SwiGLU feed-forward,
// RMSNorm, and an output head that is its own weight or tied to the embedding.
//
// Parameters carry transformers' names ("model.layers.0.self_attn.q_proj.weight"), so weights
// published in the Hugging Face layout load without renaming and export back the same way, and
// q/k rows are in transformers' rotary layout (the two halves of each head rotate together:
// rotate_half), so its published q_proj and k_proj load as they are.
//
// Blocks, in forward order, each passing one tensor to the next:
//   "embed"   int64 token ids [B, T] -> activations [B, T, d]
//   "layerI"  [B, T, d] -> [B, T, d], for I in 0 .. num_hidden_layers - 1
//   "head"    [B, T, d] -> logits [B, T, vocab] (with tp, this rank's [B, T, vocab / tp])
//
// Where the values come from: with `weights` set, every rank reads from the memory-mapped
// safetensors files only the boxes of the parameters it holds (its stage's blocks, its tensor-
// parallel slices); otherwise each parameter is drawn from its own stream (parameter_init.hpp)
// as transformers initialises it (N(0, initializer_range), norms one, the padding row zero), so
// any stage or slice holds exactly the whole model's values.
//
// Tensor parallelism (the mesh's tp > 1): q, k, v, gate and up are column-parallel (by heads and
// by intermediate columns), o and down row-parallel, the embedding and the head split by
// vocabulary. Key/value heads are split like the query heads when tp divides their count; when
// it does not (multi-query attention on two ranks, say) every rank holds them whole, uses those
// its query heads read, and their gradients are summed across the group. With
// sequence_parallel the residual stream between layers is split along the sequence, and the
// norms' (replicated) weights gather their gradients across the group.

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
// TensorParallelGroup holds its backend by value: copying one needs the complete type, which
// tensor_parallel.hpp only declares.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <numbers>
#include <optional>
#include <sstream>

#include "llama_config.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/models/loss_reduction.hpp"
#include "trainyard/models/parameter_init.hpp"
#include "trainyard/models/pretrained_weights.hpp"
#include "trainyard/parallel/block_selection.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/parallel/tensor_parallel.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard {
namespace {

using llama::LlamaConfig;

// A target that is not scored: PyTorch's default ignore_index.
constexpr std::int64_t kIgnoredTarget = -100;
// The dimension the sequence runs along in the residual stream [B, T, d].
constexpr std::int64_t kSequenceDim = 1;
const std::string kEmbedWeight = "model.embed_tokens.weight";
const std::string kHeadWeight = "lm_head.weight";

std::string layer_prefix(std::int64_t layer) {
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

// Gives each parameter its first values, from published weights or from its own stream, and
// records how it is held (parameter_layout).
class ParameterSource {
 public:
  ParameterSource(const LlamaConfig& config, const TensorSplit& split,
                  const PretrainedWeights* weights, std::uint64_t seed)
      : config_(config), split_(split), weights_(weights), init_(seed) {}

  // A new parameter tensor holding this rank's part of whole parameter `name`.
  torch::Tensor make(const std::string& name, const Holding& holding, Initial initial) {
    const TensorParallelGroup whole_group;  // a group of one: the whole tensor
    const TensorParallelGroup& group = holding.split_dim >= 0 ? split_.group : whole_group;
    torch::Tensor held;
    if (weights_) {
      held = weights_->read(name, holding.offsets(group), holding.held(group), at::kFloat);
    } else {
      // Drawn whole, whatever this rank holds, so that every slice is the whole model's.
      held = at::empty(holding.whole);
      if (initial == Initial::kOnes) {
        init_.fill(held, 1.0);
      } else {
        init_.normal(held, name, 0.0, config_.initializer_range);
        if (name == kEmbedWeight && config_.pad_token_id) held[*config_.pad_token_id].zero_();
      }
      if (holding.split_dim >= 0 && group.size > 1) held = group.shard_of(held, holding.split_dim);
    }
    return held;
  }

  // The layout of a parameter held as `holding` of whole parameter `name`.
  HeldLayout layout(const std::string& name, const Holding& holding) const {
    if (holding.split_dim < 0 || !split_.split()) {
      return whole_parameter_layout(name, holding.whole);
    }
    return parameter_box_layout(name, holding.whole, holding.offsets(split_.group),
                                holding.held(split_.group));
  }

 private:
  const LlamaConfig& config_;
  TensorSplit split_;
  const PretrainedWeights* weights_;
  ParameterInit init_;
};

// Every parameter of the whole model, by its transformers name, with its whole shape: what a
// weights folder must hold, exactly.
std::map<std::string, std::vector<std::int64_t>> whole_model_shapes(const LlamaConfig& config) {
  const std::int64_t d = config.hidden_size, q = config.num_attention_heads * config.head_dim,
                     kv = config.num_key_value_heads * config.head_dim,
                     ff = config.intermediate_size;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  shapes[kEmbedWeight] = {config.vocab_size, d};
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(i);
    shapes[p + "input_layernorm.weight"] = {d};
    shapes[p + "self_attn.q_proj.weight"] = {q, d};
    shapes[p + "self_attn.k_proj.weight"] = {kv, d};
    shapes[p + "self_attn.v_proj.weight"] = {kv, d};
    shapes[p + "self_attn.o_proj.weight"] = {d, q};
    shapes[p + "post_attention_layernorm.weight"] = {d};
    shapes[p + "mlp.gate_proj.weight"] = {ff, d};
    shapes[p + "mlp.up_proj.weight"] = {ff, d};
    shapes[p + "mlp.down_proj.weight"] = {d, ff};
  }
  shapes["model.norm.weight"] = {d};
  if (!config.tie_word_embeddings) shapes[kHeadWeight] = {config.vocab_size, d};
  return shapes;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Refuses weights that are not exactly this configuration's model: a missing, extra or
// wrongly shaped tensor, named with both shapes. Every rank checks the whole model from the
// headers alone, so a stage never trains on a half-matching folder.
void check_weights_match(const PretrainedWeights& weights, const LlamaConfig& config) {
  const auto expected = whole_model_shapes(config);
  const std::string where = "weights " + weights.location().string() + ": ";
  for (const auto& [name, shape] : expected) {
    if (!weights.contains(name)) {
      throw Error(where + "tensor '" + name + "' of shape " + shape_text(shape) + " is missing" +
                  (name == kHeadWeight ? " (tie_word_embeddings is false in the config)" : ""));
    }
    const auto& held = weights.info(name).shape;
    if (held != shape) {
      throw Error(where + "tensor '" + name + "' has shape " + shape_text(held) +
                  " but the config makes it " + shape_text(shape));
    }
  }
  for (const auto& [name, info] : weights.tensors()) {
    if (!expected.count(name)) {
      throw Error(where + "tensor '" + name + "' (in " + info.file.filename().string() +
                  ") is not a parameter of the configured model" +
                  (name == kHeadWeight ? " (tie_word_embeddings is true in the config)" : ""));
    }
  }
}

// Root-mean-square normalisation as transformers computes it: in fp32, then scaled by the weight
// in the input's dtype. With sequence parallelism each rank normalises its slice of the sequence,
// so the replicated weight is used through copy_to_tensor_parallel_region, whose backward sums
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
  torch::Tensor weight;
};
TORCH_MODULE(Projection);

// The inverse frequencies of the rotary embedding, computed as transformers computes them (in
// fp32, in the same order), with Llama 3.1's scaling when configured.
torch::Tensor rotary_inverse_frequencies(const LlamaConfig& config) {
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
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated =
      at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, /*dim=*/-1);
  return x * cos + rotated * sin;
}

// The tensor a column-parallel projection multiplies: the whole sequence on every rank.
torch::Tensor enter_column_parallel(const torch::Tensor& x, const TensorSplit& split) {
  if (split.sequence_parallel) {
    return gather_from_sequence_parallel_region(x, kSequenceDim, split.group);
  }
  return split.split() ? copy_to_tensor_parallel_region(x, split.group) : x;
}

// A row-parallel projection's partial sums combined: summed, or with sequence parallelism summed
// and scattered along the sequence.
torch::Tensor leave_row_parallel(const torch::Tensor& partial, const TensorSplit& split) {
  if (split.sequence_parallel) {
    return reduce_scatter_to_sequence_parallel_region(partial, kSequenceDim, split.group);
  }
  return split.split() ? reduce_from_tensor_parallel_region(partial, split.group) : partial;
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
    torch::Tensor q = heads_of(at::linear(input, q_proj->weight));
    torch::Tensor k = heads_of(at::linear(input, kv_weight(k_proj->weight)));
    torch::Tensor v = heads_of(at::linear(input, kv_weight(v_proj->weight)));
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
    return leave_row_parallel(at::linear(attended, o_proj->weight), split_);
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
    const std::string whole = prefix + name + ".weight";
    layouts[whole] = source.layout(whole, holding);
    return register_module(name, Projection(source.make(whole, holding, Initial::kNormal)));
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
    const torch::Tensor hidden =
        at::silu(at::linear(input, gate_proj->weight)) * at::linear(input, up_proj->weight);
    return leave_row_parallel(at::linear(hidden, down_proj->weight), split_);
  }

  Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  TensorSplit split_;

  Projection add(const std::string& name, const std::string& prefix, const Holding& holding,
                 ParameterSource& source, std::map<std::string, HeldLayout>& layouts) {
    const std::string whole = prefix + name + ".weight";
    layouts[whole] = source.layout(whole, holding);
    return register_module(name, Projection(source.make(whole, holding, Initial::kNormal)));
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

nlohmann::json toml_to_json(const Value& value) {
  switch (value.type()) {
    case ValueType::kBool:
      return value.as_bool();
    case ValueType::kInteger:
      return value.as_integer();
    case ValueType::kFloat:
      return value.as_float();
    case ValueType::kString:
      return value.as_string();
    case ValueType::kArray: {
      nlohmann::json array = nlohmann::json::array();
      for (const Value& item : value.as_array()) array.push_back(toml_to_json(item));
      return array;
    }
    case ValueType::kTable: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& [key, item] : value.as_table().entries()) object[key] = toml_to_json(item);
      return object;
    }
  }
  return nullptr;
}

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The configuration: config_file (or the weights folder's config.json), with the recipe's
// [model.config] keys laid over it.
LlamaConfig configuration(const Config& options, std::int64_t dataset_vocab) {
  namespace fs = std::filesystem;
  std::optional<fs::path> file;
  if (!options.get_string("config_file").empty()) {
    file = options.get_path("config_file");
  } else if (!options.get_string("weights").empty() &&
             fs::is_directory(options.get_path("weights"))) {
    file = options.get_path("weights") / "config.json";
  }
  nlohmann::json settings = nlohmann::json::object();
  std::string source = options.qualified("config");
  if (file) {
    if (!fs::exists(*file)) throw Error(file->string() + ": no such config file");
    settings = parse_strict_json(read_text(*file), file->string());
    if (!settings.is_object()) throw Error(file->string() + ": not a JSON object");
    source = file->string();
  }
  const Table& overrides = options.value("config").as_table();
  for (const auto& [key, value] : overrides.entries()) settings[key] = toml_to_json(value);
  if (file && !overrides.empty()) source += " with " + options.qualified("config");
  return llama::read_llama_config(settings, source, dataset_vocab,
                                  file ? LlamaConfig{} : llama::small_llama());
}

class Llama final : public Model {
 public:
  Llama(const Config& options, const BuildContext& context)
      : reduction_(loss_reduction_from(options)),
        root_(std::make_shared<torch::nn::Module>("llama")) {
    const DatasetInfo& data = context.data;
    if (data.vocab_size < 1 || data.sequence_length < 1) {
      throw Error(
          "model 'llama' needs a language-modelling dataset (one reporting vocab_size "
          "and sequence_length, such as 'text' or 'tokens')");
    }
    config_ = configuration(options, data.vocab_size);
    if (data.vocab_size > config_.vocab_size) {
      throw Error("model 'llama': the dataset's vocabulary (" + std::to_string(data.vocab_size) +
                  " tokens) is larger than the model's vocab_size (" +
                  std::to_string(config_.vocab_size) + ")");
    }
    seq_len_ = data.sequence_length;
    configure_split(options, context);
    std::optional<PretrainedWeights> weights;
    if (!options.get_string("weights").empty()) {
      weights.emplace(options.get_path("weights"));
      check_weights_match(*weights, config_);
    }

    block_names_.push_back("embed");
    for (std::int64_t i = 0; i < config_.num_hidden_layers; ++i) {
      block_names_.push_back("layer" + std::to_string(i));
    }
    block_names_.push_back("head");
    selection_.emplace(context.blocks, static_cast<std::int64_t>(block_names_.size()), "llama");

    ParameterSource source(config_, split_, weights ? &*weights : nullptr, context.seed);
    // torch::nn modules built here draw nothing, but the guard keeps the contract obvious.
    GlobalGeneratorGuard keep_global_stream;
    at::NoGradGuard no_grad;
    auto body = std::make_shared<torch::nn::Module>("model");
    root_->register_module("model", body);
    build_embed(source, *body);
    build_layers(source, *body);
    build_head(source, *body);
  }

  torch::nn::Module& module() override { return *root_; }
  std::vector<Block> blocks() override { return blocks_; }
  torch::Tensor input(const Batch& batch) override {
    selection_->require_first("input()");
    return batch.at("input");
  }
  bool builds_stages() const override { return true; }
  std::vector<std::string> block_names() override { return block_names_; }

  std::vector<TiedParameter> tied_parameters() override {
    if (!config_.tie_word_embeddings) return {};
    TiedParameter tie{kEmbedWeight, {"embed", "head"}, {}};
    if (selection_->holds_first()) {
      tie.held_as = kEmbedWeight;
    } else if (selection_->holds_last()) {
      tie.held_as = kHeadWeight;
    }
    return {tie};
  }

  // Cross-entropy summed over the scored tokens (targets other than -100), then for kMean
  // divided by their count. A batch with no scored token has loss 0.
  torch::Tensor loss(const torch::Tensor& logits, const Batch& batch) override {
    selection_->require_last("loss()");
    const torch::Tensor target = batch.at("target").reshape({-1});
    const torch::Tensor rows = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
    torch::Tensor sum =
        split_.split()
            ? vocab_parallel_cross_entropy(rows, target, split_.group, kIgnoredTarget).sum()
            : at::cross_entropy_loss(rows, target, /*weight=*/{}, at::Reduction::Sum,
                                     kIgnoredTarget);
    if (reduction_ == LossReduction::kSum) return sum;
    return sum / target.ne(kIgnoredTarget).sum().clamp_min(1);
  }
  LossReduction loss_reduction() const override { return reduction_; }
  double loss_terms(const Batch& batch) const override {
    return static_cast<double>(batch.at("target").ne(kIgnoredTarget).sum().item<std::int64_t>());
  }

  // {"accuracy": sum over sequences of the fraction of their scored tokens predicted}.
  TensorMap eval_sums(const torch::Tensor& logits, const Batch& batch) override {
    selection_->require_last("eval_sums()");
    const torch::Tensor& target = batch.at("target");
    const torch::Tensor predicted =
        split_.split() ? vocab_parallel_argmax(logits.reshape({-1, logits.size(-1)}), split_.group)
                             .view(target.sizes())
                       : logits.argmax(-1);
    torch::Tensor correct = predicted.eq(target).sum(-1).to(at::kFloat);
    torch::Tensor scored = target.ne(kIgnoredTarget).sum(-1).clamp_min(1).to(at::kFloat);
    return {{"accuracy", (correct / scored).sum()}};
  }

  // Per token, forward plus backward: 6 N for the matrix multiplies, N the projections' weights
  // of the layers held (q, k, v, o, gate, up, down) plus the head's; 12 * (heads * head_dim) * T
  // per layer for attention's scores and weighted sum (PaLM, appendix B). With tp each rank does
  // 1 / tp of every term.
  double flops_per_sample() const override {
    const auto d = static_cast<double>(config_.hidden_size);
    const auto q = static_cast<double>(config_.num_attention_heads * config_.head_dim);
    const auto kv = static_cast<double>(config_.num_key_value_heads * config_.head_dim);
    const auto ff = static_cast<double>(config_.intermediate_size);
    const auto length = static_cast<double>(seq_len_);
    double layers = 0;
    for (std::int64_t i = 0; i < config_.num_hidden_layers; ++i) {
      if (selection_->holds(i + 1)) layers += 1;
    }
    double matmul_params = layers * (2 * d * q + 2 * d * kv + 3 * d * ff);
    if (selection_->holds_last()) matmul_params += static_cast<double>(config_.vocab_size) * d;
    return length * (6.0 * matmul_params + 12.0 * layers * q * length) /
           static_cast<double>(split_.group.size);
  }

  HeldLayout parameter_layout(const std::string& name, const torch::Tensor& held) const override {
    auto it = layouts_.find(name);
    return it != layouts_.end() ? it->second : whole_parameter_layout(name, held.sizes().vec());
  }

 private:
  LlamaConfig config_;
  std::int64_t seq_len_ = 0;
  LossReduction reduction_;
  std::vector<std::string> block_names_;
  std::optional<BlockSelection> selection_;
  std::shared_ptr<torch::nn::Module> root_;
  std::vector<Block> blocks_;
  TensorSplit split_;
  // How this build holds each parameter, by its name in module().
  std::map<std::string, HeldLayout> layouts_;
  // The embedding's weight when this build holds it: the tied head's weight.
  torch::Tensor embed_weight_;

  void configure_split(const Config& options, const BuildContext& context) {
    split_.group = TensorParallelGroup::of(context.mesh.get());
    const std::int64_t tp = split_.group.size;
    split_.sequence_parallel = options.get_bool("sequence_parallel") && split_.split();
    split_.kv_heads_split = config_.num_key_value_heads % tp == 0;
    const auto refuse = [&](const std::string& what, std::int64_t size, const std::string& why) {
      throw Error("model 'llama': " + what + " (" + std::to_string(size) +
                  ") does not divide by tp (" + std::to_string(tp) + "): " + why);
    };
    if (config_.num_attention_heads % tp != 0) {
      refuse("num_attention_heads", config_.num_attention_heads, "attention is split by heads");
    }
    if (config_.intermediate_size % tp != 0) {
      refuse("intermediate_size", config_.intermediate_size,
             "the feed-forward is split by columns");
    }
    if (config_.vocab_size % tp != 0) {
      refuse("vocab_size", config_.vocab_size,
             "the embedding and the output head are split by vocabulary");
    }
    if (split_.sequence_parallel && seq_len_ % tp != 0) {
      options.fail("sequence_parallel", "needs the sequence length (" + std::to_string(seq_len_) +
                                            ") to divide by tp (" + std::to_string(tp) + ")");
    }
  }

  Holding vocabulary_rows() const { return Holding{{config_.vocab_size, config_.hidden_size}, 0}; }

  void build_embed(ParameterSource& source, torch::nn::Module& body) {
    if (!selection_->holds_first()) return;
    auto embedding = VocabParallelEmbedding(config_.vocab_size, config_.hidden_size, split_.group);
    embedding->weight.copy_(source.make(kEmbedWeight, vocabulary_rows(), Initial::kNormal));
    layouts_[kEmbedWeight] = source.layout(kEmbedWeight, vocabulary_rows());
    auto embed = std::make_shared<EmbedBlock>(embedding, config_.pad_token_id, split_);
    body.register_module("embed_tokens", embedding);
    embed_weight_ = embedding->weight;
    blocks_.push_back(Block{"embed", embed, [embed](const Activations& x) {
                              return x.with_hidden(embed->forward(x.hidden()));
                            }});
  }

  void build_layers(ParameterSource& source, torch::nn::Module& body) {
    auto layers = std::make_shared<torch::nn::Module>("layers");
    auto rotary = std::make_shared<const RotaryTable>(config_);
    bool any = false;
    for (std::int64_t i = 0; i < config_.num_hidden_layers; ++i) {
      if (!selection_->holds(i + 1)) continue;
      auto layer = std::make_shared<DecoderLayer>(config_, split_, source, i, rotary, layouts_);
      layers->register_module(std::to_string(i), layer);
      any = true;
      blocks_.push_back(Block{"layer" + std::to_string(i), layer, [layer](const Activations& x) {
                                return x.with_hidden(layer->forward(x.hidden()));
                              }});
    }
    if (any) body.register_module("layers", layers);
  }

  void build_head(ParameterSource& source, torch::nn::Module& body) {
    if (!selection_->holds_last()) return;
    auto norm = RmsNorm(
        source.make("model.norm.weight", Holding{{config_.hidden_size}, -1}, Initial::kOnes),
        config_.rms_norm_eps, split_);
    body.register_module("norm", norm);
    torch::Tensor head_weight;
    if (config_.tie_word_embeddings && embed_weight_.defined()) {
      head_weight = embed_weight_;
    } else {
      // Untied: the head's own weight. Tied on a stage without the embedding: a copy of the
      // embedding's, a piece of that parameter, which the pipeline keeps equal to it.
      const std::string whole = config_.tie_word_embeddings ? kEmbedWeight : kHeadWeight;
      head_weight = source.make(whole, vocabulary_rows(), Initial::kNormal);
      auto lm_head = std::make_shared<torch::nn::Module>("lm_head");
      head_weight = lm_head->register_parameter("weight", head_weight);
      root_->register_module("lm_head", lm_head);
      layouts_[kHeadWeight] = source.layout(whole, vocabulary_rows());
    }
    // Not registered under root_, which already holds the norm and the head's weight.
    auto head = std::make_shared<HeadBlock>(norm, head_weight, split_);
    blocks_.push_back(Block{"head", head, [head](const Activations& x) {
                              return x.with_hidden(head->forward(x.hidden()));
                            }});
  }
};

OptionSpec config_table_option() {
  OptionSpec spec;
  spec.name = "config";
  spec.type = OptionType::kTable;
  spec.default_value = Value(std::make_shared<const Table>());
  spec.help =
      "transformers LlamaConfig keys (hidden_size, num_hidden_layers, num_key_value_heads, "
      "rope_theta, rope_scaling, tie_word_embeddings, ...), laid over config_file's; without a "
      "config file the keys not given describe a small model (hidden_size 128, 4 layers of 4 "
      "heads, intermediate_size 352)";
  return spec;
}

void register_components(Registry& registry) {
  registry.add<Model>(
      "llama",
      {option("config_file", "",
              "a transformers config.json (default: the weights folder's config.json, if any)"),
       config_table_option(),
       option("weights", "",
              "a Hugging Face model folder (model.safetensors or model.safetensors.index.json) "
              "or one .safetensors file to start from; each rank reads only its pieces"),
       option("sequence_parallel", false,
              "with tp > 1, split the residual stream between the layers along the sequence"),
       loss_reduction_option("per-token cross-entropy over the scored tokens (targets of -100 "
                             "are not scored): their mean or their sum")},
      "Llama-family decoder (RMSNorm, rotary, grouped-query attention, SwiGLU), transformers' "
      "LlamaForCausalLM with its names, config.json and weights",
      [](const Config& options, const BuildContext& context) {
        return std::make_unique<Llama>(options, context);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("llama", "1.0.0", trainyard::register_components)
