// The `llama` model against transformers' LlamaForCausalLM: Hugging Face folders made at test
// time by llama/make_references.py (random models: multi-head, grouped-query and multi-query
// attention, tied and untied embeddings, the default and llama3 rotary embeddings, one file and
// sharded), loaded with `weights`, give transformers' logits within fp32 tolerances whole, split
// over tp 2 (with and without sequence parallelism) and as two pipeline stages. Two negative
// controls show the comparison catches a wrong mapping: q/k in Meta's interleaved rotary layout,
// and gate and up swapped. Randomly initialised builds split over tp equal the whole model in
// logits and gradients (key/value heads split, and replicated when tp does not divide them), and
// what does not fit is refused by name: a foreign architecture, an unbuilt rope type or key, a
// missing shard, a header that lies, a tensor missing, extra or of the wrong shape.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "step_harness.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/models/pretrained_weights.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kVocab = 64;
constexpr std::int64_t kLength = 16;
constexpr double kRtol = 1.3e-6;
constexpr double kAtol = 1e-5;

const std::vector<std::string> kCases = {"mha_untied", "gqa_tied", "mqa_llama3", "gqa_tied_llama3"};

BuildContext language_context() {
  BuildContext context;
  context.seed = 5;
  context.data.input_shape = {kLength};
  context.data.vocab_size = kVocab;
  context.data.sequence_length = kLength;
  return context;
}

std::shared_ptr<Model> build_llama(const std::string& options, const BuildContext& context) {
  // Building saves and restores the global generator: one rank at a time.
  static std::mutex building;
  std::lock_guard<std::mutex> lock(building);
  return bundled_registry().create<Model>("llama", options_section("model", options), context);
}

std::string weights_option(const fs::path& folder) {
  return "weights = \"" + folder.string() + "\"\n";
}

// The references, made once for the whole suite.
class LlamaReferences : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    folder_ = fs::temp_directory_path() / ("trainyard_llama_refs_" + std::to_string(::getpid()));
    fs::create_directories(folder_);
    const fs::path script = source_dir() / "tests/unit/llama/make_references.py";
    const CommandResult made = run_command(
        {(source_dir() / ".venv/bin/python").string(), script.string(), folder_.string()}, {}, 300);
    made_ = made.exit_code == 0;
    if (!made_) ADD_FAILURE() << describe(made);
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    fs::remove_all(folder_, ignored);
  }

  void SetUp() override { ASSERT_TRUE(made_) << "the references could not be made"; }

  static fs::path folder(const std::string& name) { return folder_ / name; }
  static at::Tensor reference(const std::string& name, const std::string& tensor) {
    return PretrainedWeights(folder(name) / "reference.safetensors").read(tensor, at::kFloat);
  }
  static at::Tensor ids(const std::string& name) { return reference(name, "ids").to(at::kLong); }

  static inline fs::path folder_;
  static inline bool made_ = false;
};

Batch batch_of(const at::Tensor& ids) {
  Batch batch;
  batch.size = ids.size(0);
  batch.tensors["input"] = ids;
  batch.tensors["target"] = ids.roll(-1, 1).clone();
  return batch;
}

at::Tensor logits_of(Model& model, const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  model.module().eval();
  return run_blocks(model, model.blocks(), batch_of(ids));
}

::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " vs " << expected.sizes();
  }
  if (at::allclose(actual, expected, kRtol, kAtol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |difference| " << (actual - expected).abs().max().item<double>();
}

// Logits of a build split over tp ranks as threads, assembled from the ranks' vocabulary shares.
at::Tensor tensor_parallel_logits(int tp, const std::string& options, const at::Tensor& ids) {
  auto shares = on_tp_ranks<at::Tensor>(tp, language_context(), [&](const BuildContext& context) {
    auto model = build_llama(options, context);
    return logits_of(*model, ids);
  });
  return at::cat(shares, -1);
}

// Logits of the model built as two pipeline stages, the first's output fed to the second.
at::Tensor two_stage_logits(const std::string& options, const at::Tensor& ids) {
  BuildContext first = language_context(), second = language_context();
  first.blocks = BlockRange{0, 2};
  second.blocks = BlockRange{2, -1};
  auto front = build_llama(options, first);
  auto back = build_llama(options, second);
  at::NoGradGuard no_grad;
  front->module().eval();
  back->module().eval();
  Activations x(front->input(batch_of(ids)));
  for (const Block& block : front->blocks()) x = block.forward(x);
  for (const Block& block : back->blocks()) x = block.forward(x);
  return x.hidden();
}

class LlamaMatchesTransformers : public LlamaReferences,
                                 public ::testing::WithParamInterface<std::string> {};

TEST_P(LlamaMatchesTransformers, Whole) {
  auto model = build_llama(weights_option(folder(GetParam())), language_context());
  EXPECT_TRUE(close(logits_of(*model, ids(GetParam())), reference(GetParam(), "logits")));
}

TEST_P(LlamaMatchesTransformers, TensorParallelTwo) {
  EXPECT_TRUE(close(tensor_parallel_logits(2, weights_option(folder(GetParam())), ids(GetParam())),
                    reference(GetParam(), "logits")));
}

TEST_P(LlamaMatchesTransformers, TensorParallelTwoSequenceParallel) {
  EXPECT_TRUE(close(
      tensor_parallel_logits(2, weights_option(folder(GetParam())) + "sequence_parallel = true\n",
                             ids(GetParam())),
      reference(GetParam(), "logits")));
}

TEST_P(LlamaMatchesTransformers, PipelineTwoStages) {
  EXPECT_TRUE(close(two_stage_logits(weights_option(folder(GetParam())), ids(GetParam())),
                    reference(GetParam(), "logits")));
}

INSTANTIATE_TEST_SUITE_P(Cases, LlamaMatchesTransformers, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param; });

// The comparison is not blind: weights in the wrong layout give logits outside the tolerance.
TEST_F(LlamaReferences, NegativeControlsFailTheComparison) {
  for (const char* control : {"negative_interleaved_rotary", "negative_swapped_gate_up"}) {
    auto model = build_llama(weights_option(folder(control)), language_context());
    EXPECT_FALSE(close(logits_of(*model, ids("mha_untied")), reference("mha_untied", "logits")))
        << control;
  }
}

// The recipe's [model.config] keys override the folder's config.json.
TEST_F(LlamaReferences, RecipeKeysOverrideTheConfigFile) {
  const std::string error = error_of([&] {
    build_llama(weights_option(folder("mha_untied")) + "config = { num_key_value_heads = 2 }\n",
                language_context());
  });
  EXPECT_NE(error.find("'model.layers.0.self_attn.k_proj.weight' has shape [32, 32] but the "
                       "config makes it [16, 32]"),
            std::string::npos)
      << error;
}

TEST_F(LlamaReferences, RefusesWeightsThatDoNotMatch) {
  const std::string extra = error_of([&] {
    build_llama(weights_option(folder("mha_untied")) + "config = { tie_word_embeddings = true }\n",
                language_context());
  });
  EXPECT_NE(extra.find("tensor 'lm_head.weight' (in model.safetensors) is not a parameter"),
            std::string::npos)
      << extra;
  const std::string missing = error_of([&] {
    build_llama(weights_option(folder("gqa_tied")) + "config = { tie_word_embeddings = false }\n",
                language_context());
  });
  EXPECT_NE(missing.find("tensor 'lm_head.weight' of shape [64, 32] is missing"), std::string::npos)
      << missing;
}

TEST_F(LlamaReferences, RefusesAMissingShardAndALyingHeader) {
  const fs::path broken = folder("broken_shards");
  fs::create_directories(broken);
  fs::copy(folder("gqa_tied"), broken,
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  fs::remove(broken / "model-00002-of-00004.safetensors");
  const std::string missing =
      error_of([&] { build_llama(weights_option(broken), language_context()); });
  EXPECT_NE(missing.find("names shard model-00002-of-00004.safetensors, which is missing"),
            std::string::npos)
      << missing;

  fs::copy(folder("gqa_tied") / "model-00002-of-00004.safetensors", broken);
  // Cut the last bytes: the header now claims more data than the file holds.
  const fs::path shard = broken / "model-00003-of-00004.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 4);
  const std::string lying =
      error_of([&] { build_llama(weights_option(broken), language_context()); });
  EXPECT_NE(lying.find(shard.string()), std::string::npos) << lying;
  EXPECT_EQ(lying.find('\n'), std::string::npos) << lying;
}

TEST_F(LlamaReferences, RefusesConfigsItDoesNotBuild) {
  const fs::path foreign = folder("foreign");
  fs::create_directories(foreign);
  {
    std::ofstream config(foreign / "config.json");
    config << R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral"})";
  }
  const std::string architecture = error_of([&] {
    build_llama("config_file = \"" + (foreign / "config.json").string() + "\"\n",
                language_context());
  });
  EXPECT_NE(architecture.find("config.json: model_type \"mistral\" is not \"llama\""),
            std::string::npos)
      << architecture;
  const std::map<std::string, std::string> refusals = {
      {"config = { hidden_size = 32, num_attention_heads = 4, rope_scaling = { rope_type = "
       "\"yarn\", factor = 2.0 } }",
       "rope_scaling.rope_type 'yarn' is not built"},
      {"config = { hidden_size = 32, num_attention_heads = 4, attention_bias = true }",
       "attention_bias = true is not supported"},
      {"config = { hidden_size = 32, num_attention_heads = 4, sliding_window = 8 }",
       "unknown key 'sliding_window'"},
      {"config = { hidden_size = 32, num_attention_heads = 4, num_key_value_heads = 3 }",
       "num_key_value_heads (3) must divide num_attention_heads (4)"},
  };
  for (const auto& [options, expected] : refusals) {
    const std::string error = error_of([&] { build_llama(options + "\n", language_context()); });
    EXPECT_NE(error.find("model.config: " + expected), std::string::npos) << error;
  }
}

// LoRA options PEFT would take differently, or not at all, are refused by name.
TEST(LlamaLora, RefusesWhatItDoesNotBuild) {
  const std::map<std::string, std::string> refusals = {
      {"lora = { rank = 0 }", "rank must be an integer of at least 1"},
      {"lora = { alpha = 8 }", "rank is required"},
      {"lora = { rank = 4, targets = [\"lm_head\"] }",
       "target \"lm_head\" is not a projection of a layer"},
      {"lora = { rank = 4, dropout = 0.1 }", "dropout other than 0 is not built"},
      {"lora = { rank = 4, use_dora = true }", "unknown key 'use_dora'"},
  };
  for (const auto& [options, expected] : refusals) {
    const std::string error = error_of([&] { build_llama(options + "\n", language_context()); });
    EXPECT_NE(error.find("model.lora: " + expected), std::string::npos) << error;
  }
}

// With adapters, only lora_A and lora_B take gradients, and since lora_B starts at zero the
// model starts as the one without them, logit for logit.
TEST(LlamaLora, TrainsTheAdaptersAloneAndStartsAsTheBaseModel) {
  const std::string base =
      "config = { hidden_size = 32, intermediate_size = 48, "
      "num_hidden_layers = 2, num_attention_heads = 4 }\n";
  auto plain = build_llama(base, language_context());
  auto adapted = build_llama(base + "lora = { rank = 2, targets = [\"q_proj\", \"down_proj\"] }\n",
                             language_context());
  std::size_t trainable = 0;
  for (const auto& item : adapted->module().named_parameters()) {
    const bool adapter = item.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(item.value().requires_grad(), adapter) << item.key();
    trainable += adapter;
  }
  EXPECT_EQ(trainable, 2u * 2u * 2u);
  at::Generator generator = at::detail::createCPUGenerator(5);
  const Batch batch = batch_of(at::randint(kVocab, {2, kLength}, generator, at::kLong));
  const at::Tensor expected = run_blocks(*plain, plain->blocks(), batch);
  const at::Tensor actual = run_blocks(*adapted, adapted->blocks(), batch);
  EXPECT_TRUE(at::equal(actual, expected));
  adapted->loss(actual, batch).backward();
  for (const auto& item : adapted->module().named_parameters()) {
    // lora_A's gradient is zero while lora_B is; lora_B's is not.
    if (item.key().find(".lora_B.") != std::string::npos) {
      EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0.0) << item.key();
    }
  }
}

// Under a precision that autocasts to bf16, the frozen base's projections are kept in bf16
// (half their fp32 bytes) while the adapters, norms and embedding stay fp32; autocast casts the
// projections to bf16 for every product anyway, so logits, loss and the adapters' gradients are
// bit for bit those of a model whose base is fp32.
TEST(LlamaLora, KeepsTheFrozenBaseInTheComputeDtype) {
  const std::string options =
      "config = { hidden_size = 32, intermediate_size = 48, num_hidden_layers = 2, "
      "num_attention_heads = 4 }\nlora = { rank = 2, targets = [\"q_proj\", \"v_proj\"] }\n";
  BuildContext bf16 = language_context();
  bf16.extensions[kComputeDtypeExtension] = at::kBFloat16;
  auto compact = build_llama(options, bf16);
  auto reference = build_llama(options, language_context());
  std::int64_t compact_bytes = 0, reference_bytes = 0;
  for (const auto& item : compact->module().named_parameters()) {
    const bool projection = item.key().find("_proj.weight") != std::string::npos &&
                            item.key().find(".lora_") == std::string::npos;
    EXPECT_EQ(item.value().scalar_type(), projection ? at::kBFloat16 : at::kFloat) << item.key();
    compact_bytes += item.value().numel() * static_cast<std::int64_t>(item.value().element_size());
  }
  for (const auto& item : reference->module().named_parameters()) {
    reference_bytes += item.value().numel() * static_cast<std::int64_t>(item.value().element_size());
  }
  EXPECT_LT(compact_bytes, reference_bytes);
  at::Generator generator = at::detail::createCPUGenerator(9);
  const Batch batch = batch_of(at::randint(kVocab, {2, kLength}, generator, at::kLong));
  std::map<std::string, at::Tensor> gradients[2];
  at::Tensor logits[2];
  Model* models[2] = {compact.get(), reference.get()};
  for (int m = 0; m < 2; ++m) {
    AutocastGuard autocast(at::kCPU, at::kBFloat16);
    logits[m] = run_blocks(*models[m], models[m]->blocks(), batch);
    models[m]->loss(logits[m], batch).backward();
    for (const auto& item : models[m]->module().named_parameters()) {
      if (item.value().requires_grad()) gradients[m][item.key()] = item.value().grad();
    }
  }
  EXPECT_TRUE(at::equal(logits[0], logits[1]));
  ASSERT_EQ(gradients[0].size(), 2u * 2u * 2u);
  for (const auto& [name, gradient] : gradients[0]) {
    EXPECT_TRUE(at::equal(gradient, gradients[1].at(name))) << name;
  }
}

// A small model from scratch: [model.config] keys without a config file.
const std::string kScratch =
    "config = { hidden_size = 32, intermediate_size = 48, num_hidden_layers = 2, "
    "num_attention_heads = 4, num_key_value_heads = %KV%, tie_word_embeddings = %TIED% }\n";

std::string scratch(int kv_heads, bool tied) {
  std::string text = kScratch;
  text.replace(text.find("%KV%"), 4, std::to_string(kv_heads));
  text.replace(text.find("%TIED%"), 6, tied ? "true" : "false");
  return text;
}

struct Gradients {
  at::Tensor logits;
  std::map<std::string, std::pair<at::Tensor, HeldLayout>> parameters;  // gradient, layout
};

Gradients forward_backward(Model& model, const Batch& batch) {
  model.module().train();
  Gradients out;
  out.logits = run_blocks(model, model.blocks(), batch);
  model.loss(out.logits, batch).backward();
  for (const auto& item : model.module().named_parameters()) {
    out.parameters[item.key()] = {item.value().grad().clone(),
                                  model.parameter_layout(item.key(), item.value())};
  }
  return out;
}

// A held gradient equals the whole model's over the boxes its layout names.
void expect_gradient_matches(const std::string& name, const at::Tensor& held,
                             const HeldLayout& layout,
                             const std::map<std::string, at::Tensor>& whole) {
  ASSERT_EQ(layout.size(), 1u) << name;
  const ParameterPiece& piece = layout.front();
  at::Tensor expected = whole.at(piece.name);
  const std::vector<std::int64_t>& offsets = piece.placement.offsets;
  for (std::size_t d = 0; d < offsets.size(); ++d) {
    expected = expected.narrow(static_cast<std::int64_t>(d), offsets[d], held.size(d));
  }
  EXPECT_TRUE(close(held, expected)) << name;
}

class LlamaTensorParallelFromScratch
    : public ::testing::TestWithParam<std::tuple<int, int, bool, bool>> {};

// Split over tp ranks, a randomly initialised model equals the whole one: logits, loss and every
// parameter's gradient (key/value heads split when tp divides them, replicated otherwise).
TEST_P(LlamaTensorParallelFromScratch, EqualsTheWholeModel) {
  const auto [tp, kv_heads, tied, sequence_parallel] = GetParam();
  const std::string options =
      scratch(kv_heads, tied) + (sequence_parallel ? "sequence_parallel = true\n" : "");
  at::Generator generator = at::detail::createCPUGenerator(3);
  const Batch batch = batch_of(at::randint(kVocab, {3, kLength}, generator, at::kLong));
  auto whole = build_llama(options, language_context());
  const Gradients reference = forward_backward(*whole, batch);
  std::map<std::string, at::Tensor> whole_gradients;
  for (const auto& [name, entry] : reference.parameters) whole_gradients[name] = entry.first;

  auto ranks = on_tp_ranks<Gradients>(tp, language_context(), [&](const BuildContext& context) {
    auto model = build_llama(options, context);
    return forward_backward(*model, batch);
  });
  std::vector<at::Tensor> shares;
  for (const Gradients& rank : ranks) shares.push_back(rank.logits.detach());
  EXPECT_TRUE(close(at::cat(shares, -1), reference.logits.detach()));
  for (const Gradients& rank : ranks) {
    for (const auto& [name, entry] : rank.parameters) {
      expect_gradient_matches(name, entry.first, entry.second, whole_gradients);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, LlamaTensorParallelFromScratch,
                         ::testing::Values(std::make_tuple(2, 2, false, false),
                                           std::make_tuple(2, 1, true, false),
                                           std::make_tuple(4, 2, false, true),
                                           std::make_tuple(2, 4, true, true)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) + "_kv" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_tied" : "") +
                                  (std::get<3>(info.param) ? "_sp" : "");
                         });

// Stage builds hold exactly the whole model's values, the tied head's copy included.
TEST(LlamaStages, HoldTheWholeModelsValues) {
  const std::string options = scratch(2, true);
  auto whole = build_llama(options, language_context());
  std::map<std::string, at::Tensor> values;
  for (const auto& item : whole->module().named_parameters()) values[item.key()] = item.value();
  BuildContext last = language_context();
  last.blocks = BlockRange{2, -1};
  auto stage = build_llama(options, last);
  for (const auto& item : stage->module().named_parameters()) {
    const std::string name = stage->parameter_layout(item.key(), item.value()).front().name;
    ASSERT_TRUE(values.count(name)) << item.key();
    EXPECT_TRUE(at::equal(item.value(), values.at(name))) << item.key();
  }
  ASSERT_EQ(stage->tied_parameters().size(), 1u);
  EXPECT_EQ(stage->tied_parameters().front().held_as, "lm_head.weight");
}

}  // namespace
}  // namespace trainyard::testing
