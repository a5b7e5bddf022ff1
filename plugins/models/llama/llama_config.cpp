#include "llama_config.hpp"

#include <cmath>
#include <set>

#include "trainyard/api/error.hpp"

namespace trainyard::llama {
namespace {

using json = nlohmann::json;

// Keys that describe the checkpoint or generation, not the computation of a training step.
const std::set<std::string> kInformational = {
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "pretraining_tp",
    "tokenizer_class",
    "name_or_path",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "problem_type",
    "id2label",
    "label2id",
    "max_length",
    "prefix",
    "task_specific_params",
    "bad_words_ids",
};

class Reader {
 public:
  Reader(const json& settings, std::string source)
      : settings_(settings), source_(std::move(source)) {
    if (!settings_.is_object()) fail("the configuration is not a JSON object");
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw Error(source_ + ": " + message);
  }

  const json* find(const std::string& key) {
    seen_.insert(key);
    auto it = settings_.find(key);
    return it == settings_.end() || it->is_null() ? nullptr : &*it;
  }

  std::int64_t integer(const std::string& key, std::int64_t fallback, std::int64_t at_least) {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_number_integer()) fail(key + " must be an integer, got " + value->dump());
    const auto result = value->get<std::int64_t>();
    if (result < at_least) {
      fail(key + " must be at least " + std::to_string(at_least) + ", got " + value->dump());
    }
    return result;
  }

  std::optional<std::int64_t> optional_integer(const std::string& key) {
    const json* value = find(key);
    if (!value) return std::nullopt;
    // A list of end-of-sequence ids (Llama 3's instruct models) names more than one token.
    if (value->is_array()) return std::nullopt;
    if (!value->is_number_integer()) fail(key + " must be an integer, got " + value->dump());
    return value->get<std::int64_t>();
  }

  double number(const json& object, const std::string& key, double fallback, bool positive,
                const std::string& where) {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail(where + key + " must be a number, got " + it->dump());
    const double result = it->get<double>();
    if (!std::isfinite(result) || (positive && result <= 0)) {
      fail(where + key + " must be a positive number, got " + it->dump());
    }
    return result;
  }
  double number(const std::string& key, double fallback, bool positive = true) {
    seen_.insert(key);
    return number(settings_, key, fallback, positive, "");
  }

  bool boolean(const std::string& key, bool fallback) {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_boolean()) fail(key + " must be true or false, got " + value->dump());
    return value->get<bool>();
  }

  // `key` may be given only with `allowed` (what this model computes).
  void require(const std::string& key, const json& allowed, const std::string& why) {
    const json* value = find(key);
    if (value && *value != allowed) {
      fail(key + " = " + value->dump() + " is not supported: " + why);
    }
  }

  void refuse_unknown_keys() const {
    for (const auto& [key, value] : settings_.items()) {
      if (seen_.count(key) || kInformational.count(key) || key.starts_with("_")) continue;
      fail("unknown key '" + key + "' (not a LlamaConfig setting this model builds)");
    }
  }

 private:
  const json& settings_;
  std::string source_;
  std::set<std::string> seen_;
};

// The rotary settings, from either spelling: transformers 5's "rope_parameters"
// ({"rope_type", "rope_theta", ...}) or the older "rope_theta" with "rope_scaling".
void read_rope(Reader& reader, LlamaConfig& config) {
  config.rope_theta = reader.number("rope_theta", config.rope_theta);
  const json* parameters = reader.find("rope_parameters");
  const json* scaling = reader.find("rope_scaling");
  if (parameters && scaling) reader.fail("give rope_parameters or rope_scaling, not both");
  const json* rope = parameters ? parameters : scaling;
  if (!rope) return;
  const std::string key = parameters ? "rope_parameters" : "rope_scaling";
  if (!rope->is_object()) reader.fail(key + " must be an object, got " + rope->dump());
  std::string type = "default";
  for (const char* name : {"rope_type", "type"}) {
    if (auto it = rope->find(name); it != rope->end()) {
      if (!it->is_string()) reader.fail(key + "." + name + " must be a string");
      type = it->get<std::string>();
    }
  }
  const std::set<std::string> common = {"rope_type", "type", "rope_theta"};
  std::set<std::string> allowed = common;
  if (parameters) {
    config.rope_theta = reader.number(*rope, "rope_theta", config.rope_theta, true, key + ".");
  }
  if (type == "llama3") {
    Llama3RopeScaling llama3;
    const std::string where = key + ".";
    llama3.factor = reader.number(*rope, "factor", llama3.factor, true, where);
    llama3.low_freq_factor =
        reader.number(*rope, "low_freq_factor", llama3.low_freq_factor, true, where);
    llama3.high_freq_factor =
        reader.number(*rope, "high_freq_factor", llama3.high_freq_factor, true, where);
    const double original =
        reader.number(*rope, "original_max_position_embeddings",
                      static_cast<double>(config.max_position_embeddings), true, where);
    llama3.original_max_position_embeddings = static_cast<std::int64_t>(original);
    if (llama3.high_freq_factor <= llama3.low_freq_factor) {
      reader.fail(where + "high_freq_factor must exceed low_freq_factor");
    }
    config.llama3_scaling = llama3;
    allowed.insert(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (type != "default") {
    reader.fail(key + ".rope_type '" + type +
                "' is not built (this model computes the default rotary embedding and llama3)");
  }
  for (const auto& [name, value] : rope->items()) {
    if (!allowed.count(name)) {
      reader.fail(key + "." + name + " is not a setting of rope_type '" + type + "'");
    }
  }
}

void read_architecture(Reader& reader) {
  if (const json* type = reader.find("model_type"); type && *type != "llama") {
    reader.fail("model_type " + type->dump() + " is not \"llama\"");
  }
  if (const json* architectures = reader.find("architectures")) {
    if (!architectures->is_array() || architectures->size() != 1 ||
        (*architectures)[0] != "LlamaForCausalLM") {
      reader.fail("architectures " + architectures->dump() +
                  " is not [\"LlamaForCausalLM\"], the architecture this model builds");
    }
  }
}

}  // namespace

LlamaConfig small_llama() {
  LlamaConfig config;
  config.hidden_size = 128;
  config.intermediate_size = 352;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 4;
  config.head_dim = 32;
  return config;
}

LlamaConfig read_llama_config(const json& settings, const std::string& source,
                              std::int64_t dataset_vocab, const LlamaConfig& defaults) {
  Reader reader(settings, source);
  read_architecture(reader);
  LlamaConfig config = defaults;
  config.vocab_size =
      reader.integer("vocab_size", dataset_vocab > 0 ? dataset_vocab : defaults.vocab_size, 1);
  config.hidden_size = reader.integer("hidden_size", config.hidden_size, 1);
  config.intermediate_size = reader.integer("intermediate_size", config.intermediate_size, 1);
  config.num_hidden_layers = reader.integer("num_hidden_layers", config.num_hidden_layers, 1);
  config.num_attention_heads = reader.integer("num_attention_heads", config.num_attention_heads, 1);
  config.num_key_value_heads = reader.integer("num_key_value_heads", config.num_attention_heads, 1);
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    reader.fail("num_key_value_heads (" + std::to_string(config.num_key_value_heads) +
                ") must divide num_attention_heads (" + std::to_string(config.num_attention_heads) +
                ")");
  }
  if (!reader.find("head_dim") && config.hidden_size % config.num_attention_heads != 0) {
    reader.fail("num_attention_heads (" + std::to_string(config.num_attention_heads) +
                ") must divide hidden_size (" + std::to_string(config.hidden_size) +
                ") unless head_dim is given");
  }
  config.head_dim = reader.integer("head_dim", config.hidden_size / config.num_attention_heads, 2);
  if (config.head_dim % 2 != 0) reader.fail("head_dim must be even (rotary pairs)");
  config.max_position_embeddings =
      reader.integer("max_position_embeddings", config.max_position_embeddings, 1);
  config.rms_norm_eps = reader.number("rms_norm_eps", config.rms_norm_eps);
  read_rope(reader, config);
  config.tie_word_embeddings = reader.boolean("tie_word_embeddings", config.tie_word_embeddings);
  config.initializer_range = reader.number("initializer_range", config.initializer_range);
  config.pad_token_id = reader.optional_integer("pad_token_id");
  config.bos_token_id = reader.optional_integer("bos_token_id");
  config.eos_token_id = reader.optional_integer("eos_token_id");
  if (config.pad_token_id &&
      (*config.pad_token_id < 0 || *config.pad_token_id >= config.vocab_size)) {
    reader.fail("pad_token_id " + std::to_string(*config.pad_token_id) +
                " is outside the vocabulary of " + std::to_string(config.vocab_size));
  }
  reader.require("hidden_act", "silu", "the feed-forward is SwiGLU (silu)");
  reader.require("attention_bias", false, "the attention projections have no bias");
  reader.require("mlp_bias", false, "the feed-forward projections have no bias");
  reader.require("attention_dropout", 0.0, "attention has no dropout");
  reader.require("partial_rotary_factor", 1.0, "rotary embeddings cover the whole head");
  reader.refuse_unknown_keys();
  return config;
}

nlohmann::json LlamaConfig::to_json() const {
  json out = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"tie_word_embeddings", tie_word_embeddings},
      {"initializer_range", initializer_range},
      {"dtype", "float32"},
      {"pad_token_id", pad_token_id ? json(*pad_token_id) : json(nullptr)},
      {"bos_token_id", bos_token_id ? json(*bos_token_id) : json(nullptr)},
      {"eos_token_id", eos_token_id ? json(*eos_token_id) : json(nullptr)},
  };
  json rope = {{"rope_type", "default"}, {"rope_theta", rope_theta}};
  if (llama3_scaling) {
    rope = {{"rope_type", "llama3"},
            {"rope_theta", rope_theta},
            {"factor", llama3_scaling->factor},
            {"low_freq_factor", llama3_scaling->low_freq_factor},
            {"high_freq_factor", llama3_scaling->high_freq_factor},
            {"original_max_position_embeddings", llama3_scaling->original_max_position_embeddings}};
  }
  out["rope_parameters"] = rope;
  return out;
}

}  // namespace trainyard::llama
