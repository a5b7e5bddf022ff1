#pragma once
// The shape of a Llama-family model as transformers' LlamaConfig spells it in a config.json, read
// strictly: every key is either built, harmless to the computation (token ids, initialisation
// range, cache switches) or refused by name, so a model is never trained with a setting quietly
// left out. No LibTorch here.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace trainyard::llama {

// Llama 3.1's frequency-dependent rotary scaling ("rope_type": "llama3").
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads = 32;
  std::int64_t head_dim = 128;
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> llama3_scaling;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  // The embedding row whose gradient is always zero (nn.Embedding's padding_idx).
  std::optional<std::int64_t> pad_token_id;
  std::optional<std::int64_t> bos_token_id;
  std::optional<std::int64_t> eos_token_id;

  // Query heads per key/value head.
  std::int64_t query_groups() const { return num_attention_heads / num_key_value_heads; }
  // The config.json transformers writes for this shape (LlamaForCausalLM).
  nlohmann::json to_json() const;
};

// A model small enough to train on a CPU in minutes: the shape a recipe starts from when it names
// no config.json (LlamaConfig's own defaults are a 7B model).
LlamaConfig small_llama();

// Reads `settings` (a config.json's object with the recipe's keys laid over it); a key neither
// gives takes its value from `defaults` (LlamaConfig{} holds transformers' defaults, what
// from_pretrained reads a config.json with), and the vocabulary is `dataset_vocab` unless given.
// `source` names where the keys came from in errors, which are one line: "<source>: <key> ...".
LlamaConfig read_llama_config(const nlohmann::json& settings, const std::string& source,
                              std::int64_t dataset_vocab, const LlamaConfig& defaults = {});

}  // namespace trainyard::llama
