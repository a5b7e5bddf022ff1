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

#include <any>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "llama_config.hpp"
#include "llama_layers.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/models/deferred_parameters.hpp"
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
using namespace llama;

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

// The strategy's DeferredParameters, when it asks for them: the llama then makes each
// parameter's values only when the strategy needs them (deferred_parameters.hpp).
std::shared_ptr<DeferredParameters> deferred_parameters(const BuildContext& context) {
  auto it = context.extensions.find(kDeferredParametersExtension);
  if (it == context.extensions.end()) return nullptr;
  const auto* deferred = std::any_cast<std::shared_ptr<DeferredParameters>>(&it->second);
  return deferred ? *deferred : nullptr;
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
    std::shared_ptr<const PretrainedWeights> weights;
    if (!options.get_string("weights").empty()) {
      weights = std::make_shared<const PretrainedWeights>(options.get_path("weights"));
      check_weights_match(*weights, config_);
    }

    block_names_.push_back("embed");
    for (std::int64_t i = 0; i < config_.num_hidden_layers; ++i) {
      block_names_.push_back("layer" + std::to_string(i));
    }
    block_names_.push_back("head");
    selection_.emplace(context.blocks, static_cast<std::int64_t>(block_names_.size()), "llama");

    lora_ =
        llama::read_lora_settings(toml_to_json(options.value("lora")), options.qualified("lora"));
    ParameterSource source(config_, split_, std::move(weights), context.seed, lora_,
                           deferred_parameters(context), compute_dtype(context));
    // torch::nn modules built here draw nothing, but the guard keeps the contract obvious.
    GlobalGeneratorGuard keep_global_stream;
    at::NoGradGuard no_grad;
    auto body = std::make_shared<torch::nn::Module>("model");
    root_->register_module("model", body);
    build_embed(source, *body);
    build_layers(source, *body);
    build_head(source, *body);
    if (lora_.enabled()) freeze_all_but_adapters();
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

  // The parameter names are transformers' already; its config.json is the rest of a model
  // directory that from_pretrained loads.
  // With LoRA, what trains and is saved is the adapters alone: PEFT's adapter_config.json.
  std::map<std::string, std::string> export_files() const override {
    if (lora_.enabled()) return {{"peft/adapter_config.json", lora_.peft_config().dump(2) + "\n"}};
    return {{"hf/config.json", config_.to_json().dump(2) + "\n"}};
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
  llama::LoraSettings lora_;

  // PEFT's LoRA trains the adapters alone: every other parameter takes no gradient.
  void freeze_all_but_adapters() {
    for (auto& item : root_->named_parameters(true)) {
      const std::string& name = item.key();
      const bool adapter =
          name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
      if (!adapter) item.value().requires_grad_(false);
    }
  }

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
    source.assign(embedding->weight, kEmbedWeight, vocabulary_rows(), Initial::kNormal);
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

void register_components(Registry& registry) {
  registry.add<Model>(
      "llama",
      {option("config_file", "",
              "a transformers config.json (default: the weights folder's config.json, if any)"),
       table_option("config",
                    "transformers LlamaConfig keys (hidden_size, num_hidden_layers, "
                    "num_key_value_heads, rope_theta, rope_scaling, tie_word_embeddings, ...), "
                    "laid over config_file's; without a config file the keys not given describe "
                    "a small model (hidden_size 128, 4 layers of 4 heads, intermediate_size 352)"),
       table_option("lora",
                    "LoRA adapters, as PEFT's LoraConfig: { rank = r, alpha = 8, targets = "
                    "[\"q_proj\", \"v_proj\"] }; the base model is frozen and only the "
                    "adapters train and are saved (empty: full training)"),
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
