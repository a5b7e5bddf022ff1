// A decoder-only transformer language model (GPT-2 shape): token and learned position
// embeddings, pre-norm blocks of causal self-attention and a GELU MLP, a final LayerNorm and an
// output head tied to the token embedding.
//
// Blocks, in forward order, each passing one tensor to the next:
//   "embed"   int64 token ids [B, T] -> activations [B, T, d]
//   "layerI"  [B, T, d] -> [B, T, d], for I in 0 .. n_layers - 1
//   "head"    [B, T, d] -> logits [B, T, vocab]
// The token embedding's weight is the output head's weight too, so it appears in both the first
// and the last block (the tie the Model contract allows); module() holds it once. A stage that
// holds the head but not the embedding holds its own copy, "head_token_weight", drawn from the
// same stream as "embed.token.weight" (so equal to it), which the pipeline keeps in sync.
//
// Every parameter is drawn from its own stream (parameter_init.hpp) under its name in the whole
// model, so any stage holds exactly the values of the same blocks of the whole model.
//
// The loss is per token: a target of -100 is not scored (PyTorch's ignore_index default, for
// padding or a prompt the model should not be trained to predict), and loss_reduction says
// whether the loss is the mean or the sum over the scored tokens.

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <optional>

#include "trainyard/block_selection.hpp"
#include "trainyard/error.hpp"
#include "trainyard/loss_reduction.hpp"
#include "trainyard/model.hpp"
#include "trainyard/parameter_init.hpp"
#include "trainyard/plugin.hpp"

namespace trainyard {
namespace {

struct GptShape {
  std::int64_t vocab = 0;
  std::int64_t seq_len = 0;
  std::int64_t d_model = 0;
  std::int64_t n_heads = 0;
  std::int64_t n_layers = 0;
  double dropout = 0;
};

constexpr double kWeightStd = 0.02;
// A target that is not scored: PyTorch's default ignore_index.
constexpr std::int64_t kIgnoredTarget = -100;
const char* const kTokenWeight = "embed.token.weight";
const char* const kHeadCopyOfTokenWeight = "head_token_weight";

// Weights as GPT-2 initialises them: N(0, std), biases zero. `name` is the layer's name in the
// whole model.
void init_linear(const ParameterInit& init, torch::nn::Linear& linear, const std::string& name,
                 double std) {
  init.normal(linear->weight, name + ".weight", 0.0, std);
  if (linear->bias.defined()) init.fill(linear->bias, 0.0);
}

void init_layer_norm(const ParameterInit& init, torch::nn::LayerNorm& norm) {
  init.fill(norm->weight, 1.0);
  init.fill(norm->bias, 0.0);
}

class EmbedBlock : public torch::nn::Module {
 public:
  EmbedBlock(const GptShape& shape, const ParameterInit& init)
      : token(register_module("token", torch::nn::Embedding(shape.vocab, shape.d_model))),
        position(register_module("position", torch::nn::Embedding(shape.seq_len, shape.d_model))),
        dropout(register_module("dropout", torch::nn::Dropout(shape.dropout))),
        seq_len_(shape.seq_len) {
    init.normal(token->weight, kTokenWeight, 0.0, kWeightStd);
    init.normal(position->weight, "embed.position.weight", 0.0, kWeightStd);
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    if (ids.dim() != 2 || at::isFloatingType(ids.scalar_type())) {
      throw Error("model 'gpt' takes integer token ids [batch, sequence], got a " +
                  std::to_string(ids.dim()) + "-d tensor of " +
                  std::string(c10::toString(ids.scalar_type())));
    }
    const std::int64_t length = ids.size(1);
    if (length > seq_len_) {
      throw Error("model 'gpt' got sequences of " + std::to_string(length) +
                  " tokens, longer than its seq_len " + std::to_string(seq_len_));
    }
    torch::Tensor positions = at::arange(length, ids.options().dtype(at::kLong));
    return dropout(token(ids) + position(positions));
  }

  torch::nn::Embedding token;
  torch::nn::Embedding position;
  torch::nn::Dropout dropout;

 private:
  std::int64_t seq_len_;
};

class TransformerLayer : public torch::nn::Module {
 public:
  // `name` is the layer's name in the whole model ("layerI").
  TransformerLayer(const GptShape& shape, const ParameterInit& init, const std::string& name)
      : attention_norm(register_module(
            "attention_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.d_model})))),
        qkv(register_module("qkv", torch::nn::Linear(shape.d_model, 3 * shape.d_model))),
        attention_out(
            register_module("attention_out", torch::nn::Linear(shape.d_model, shape.d_model))),
        mlp_norm(register_module(
            "mlp_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.d_model})))),
        mlp_in(register_module("mlp_in", torch::nn::Linear(shape.d_model, 4 * shape.d_model))),
        mlp_out(register_module("mlp_out", torch::nn::Linear(4 * shape.d_model, shape.d_model))),
        dropout(register_module("dropout", torch::nn::Dropout(shape.dropout))),
        heads_(shape.n_heads),
        dropout_p_(shape.dropout) {
    // Residual projections scaled down with depth, so the residual stream's variance stays
    // bounded (GPT-2).
    const double residual_std = kWeightStd / std::sqrt(2.0 * static_cast<double>(shape.n_layers));
    init_layer_norm(init, attention_norm);
    init_linear(init, qkv, name + ".qkv", kWeightStd);
    init_linear(init, attention_out, name + ".attention_out", residual_std);
    init_layer_norm(init, mlp_norm);
    init_linear(init, mlp_in, name + ".mlp_in", kWeightStd);
    init_linear(init, mlp_out, name + ".mlp_out", residual_std);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const std::int64_t batch = x.size(0), length = x.size(1), width = x.size(2);
    // [B, T, 3d] -> three [B, heads, T, d / heads]
    auto parts = qkv(attention_norm(x))
                     .view({batch, length, 3, heads_, width / heads_})
                     .permute({2, 0, 3, 1, 4})
                     .unbind(0);
    torch::Tensor attended = at::scaled_dot_product_attention(
        parts[0], parts[1], parts[2], /*attn_mask=*/{}, is_training() ? dropout_p_ : 0.0,
        /*is_causal=*/true);
    attended = attended.transpose(1, 2).reshape({batch, length, width});
    torch::Tensor h = x + dropout(attention_out(attended));
    return h + dropout(mlp_out(at::gelu(mlp_in(mlp_norm(h)))));
  }

  torch::nn::LayerNorm attention_norm;
  torch::nn::Linear qkv;
  torch::nn::Linear attention_out;
  torch::nn::LayerNorm mlp_norm;
  torch::nn::Linear mlp_in;
  torch::nn::Linear mlp_out;
  torch::nn::Dropout dropout;

 private:
  std::int64_t heads_;
  double dropout_p_;
};

// The final LayerNorm and the output projection, whose weight is the token embedding's (or, on
// a stage without the embedding, a copy of it).
class HeadBlock : public torch::nn::Module {
 public:
  HeadBlock(torch::nn::LayerNorm norm, const torch::Tensor& token_weight)
      : norm(register_module("norm", std::move(norm))),
        weight(register_parameter("token_weight", token_weight)) {}

  torch::Tensor forward(const torch::Tensor& x) { return at::linear(norm(x), weight); }

  torch::nn::LayerNorm norm;
  torch::Tensor weight;
};

class Gpt final : public Model {
 public:
  Gpt(const Config& options, const BuildContext& context)
      : reduction_(loss_reduction_from(options)),
        root_(std::make_shared<torch::nn::Module>("gpt")) {
    const DatasetInfo& data = context.data;
    if (data.vocab_size < 1 || data.sequence_length < 1) {
      throw Error("model 'gpt' needs a language-modelling dataset (one reporting vocab_size and "
                  "sequence_length, such as 'text' or 'tokens')");
    }
    shape_.vocab = data.vocab_size;
    shape_.seq_len = options.get_int("seq_len");
    shape_.d_model = options.get_int("d_model");
    shape_.n_heads = options.get_int("n_heads");
    shape_.n_layers = options.get_int("n_layers");
    shape_.dropout = options.get_float("dropout");
    if (shape_.seq_len == 0) shape_.seq_len = data.sequence_length;
    if (shape_.seq_len != data.sequence_length) {
      options.fail("seq_len", "is " + std::to_string(shape_.seq_len) + " but the dataset's windows hold " +
                                  std::to_string(data.sequence_length) +
                                  " tokens; set both to the same length (or seq_len = 0)");
    }
    if (shape_.n_layers < 1) options.fail("n_layers", "must be >= 1");
    if (shape_.d_model < 1) options.fail("d_model", "must be >= 1");
    if (shape_.n_heads < 1 || shape_.d_model % shape_.n_heads != 0) {
      options.fail("n_heads", "must be >= 1 and divide d_model (" +
                                  std::to_string(shape_.d_model) + ")");
    }
    if (shape_.dropout < 0 || shape_.dropout >= 1) options.fail("dropout", "must be in [0, 1)");

    block_names_.push_back("embed");
    for (std::int64_t i = 0; i < shape_.n_layers; ++i) {
      block_names_.push_back("layer" + std::to_string(i));
    }
    block_names_.push_back("head");
    selection_.emplace(context.blocks, static_cast<std::int64_t>(block_names_.size()), "gpt");

    const ParameterInit init(context.seed);
    // torch::nn modules draw a default initialization from the global generator as they are
    // constructed, which the per-parameter streams replace: the guard undoes those draws.
    GlobalGeneratorGuard keep_global_stream;
    std::shared_ptr<EmbedBlock> embed;
    if (selection_->holds_first()) {
      embed = std::make_shared<EmbedBlock>(shape_, init);
      root_->register_module("embed", embed);
      blocks_.push_back(
          Block{"embed", embed,
                [embed](const Activations& x) { return x.with_hidden(embed->forward(x.hidden())); }});
    }
    for (std::int64_t i = 0; i < shape_.n_layers; ++i) {
      if (!selection_->holds(i + 1)) continue;
      const std::string name = "layer" + std::to_string(i);
      auto layer = std::make_shared<TransformerLayer>(shape_, init, name);
      root_->register_module(name, layer);
      blocks_.push_back(
          Block{name, layer,
                [layer](const Activations& x) { return x.with_hidden(layer->forward(x.hidden())); }});
    }
    if (!selection_->holds_last()) return;
    // The head module is not registered under root_: root_ already holds the final norm (below)
    // and the tied weight (in "embed", or as the head's copy), and listing them twice would make
    // optimizers step them twice.
    auto norm = torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape_.d_model}));
    init_layer_norm(init, norm);
    root_->register_module("final_norm", norm);
    torch::Tensor token_weight;
    if (embed) {
      token_weight = embed->token->weight;
    } else {
      token_weight = torch::empty({shape_.vocab, shape_.d_model});
      init.normal(token_weight, kTokenWeight, 0.0, kWeightStd);
      root_->register_parameter(kHeadCopyOfTokenWeight, token_weight);
    }
    auto head = std::make_shared<HeadBlock>(norm, token_weight);
    blocks_.push_back(Block{"head", head, [head](const Activations& x) {
      return x.with_hidden(head->forward(x.hidden()));
    }});
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
    TiedParameter tie{kTokenWeight, {"embed", "head"}, {}};
    if (selection_->holds_first()) {
      tie.held_as = kTokenWeight;
    } else if (selection_->holds_last()) {
      tie.held_as = kHeadCopyOfTokenWeight;
    }
    return {tie};
  }

  // Cross-entropy summed over the scored tokens (targets other than -100), then for kMean
  // divided by their count: the mean over every position when none is ignored. A batch with no
  // scored token has loss 0 rather than PyTorch's NaN, so a micro-batch of ignored tokens weighs
  // nothing when a pipeline recombines the parts (its loss_terms() is 0).
  torch::Tensor loss(const torch::Tensor& logits, const Batch& batch) override {
    selection_->require_last("loss()");
    const torch::Tensor target = batch.at("target").reshape({-1});
    torch::Tensor sum =
        at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), target,
                               /*weight=*/{}, at::Reduction::Sum, kIgnoredTarget);
    if (reduction_ == LossReduction::kSum) return sum;
    // Counted on the device, so the loss costs no host sync.
    return sum / target.ne(kIgnoredTarget).sum().clamp_min(1);
  }
  LossReduction loss_reduction() const override { return reduction_; }
  // The scored tokens. Reading the count on the host costs one device sync per call.
  double loss_terms(const Batch& batch) const override {
    return static_cast<double>(batch.at("target").ne(kIgnoredTarget).sum().item<std::int64_t>());
  }

  // {"accuracy": sum over sequences of the fraction of their scored tokens predicted}: the
  // engine divides by the sequence count, giving the mean next-token accuracy. A sequence with
  // no scored token adds 0 and still counts among the sequences divided by.
  TensorMap eval_sums(const torch::Tensor& logits, const Batch& batch) override {
    selection_->require_last("eval_sums()");
    const torch::Tensor& target = batch.at("target");
    // An ignored target (-100) never equals a predicted class, so it is never counted correct.
    torch::Tensor correct = logits.argmax(-1).eq(target).sum(-1).to(at::kFloat);
    torch::Tensor scored = target.ne(kIgnoredTarget).sum(-1).clamp_min(1).to(at::kFloat);
    return {{"accuracy", (correct / scored).sum()}};
  }

  // Per token, forward plus backward: 6 N for the matrix multiplies (2 FLOPs per multiply-add,
  // backward twice forward), N = 12 d^2 per layer (qkv 3d^2, attention output d^2, MLP 8d^2)
  // + vocab * d (the output head); plus 12 * d * T per layer for attention's scores and
  // weighted sum over the T positions (PaLM, appendix B). Embedding lookups, norms and biases are
  // left out. Per sample: T times that, over the blocks this build holds.
  double flops_per_sample() const override {
    const double d = static_cast<double>(shape_.d_model);
    const double length = static_cast<double>(shape_.seq_len);
    double layers = 0;
    for (std::int64_t i = 0; i < shape_.n_layers; ++i) {
      if (selection_->holds(i + 1)) layers += 1;
    }
    double matmul_params = layers * 12.0 * d * d;
    if (selection_->holds_last()) matmul_params += static_cast<double>(shape_.vocab) * d;
    return length * (6.0 * matmul_params + 12.0 * layers * d * length);
  }

 private:
  GptShape shape_;
  LossReduction reduction_;
  std::vector<std::string> block_names_;
  // Set once the options are checked, before anything is built.
  std::optional<BlockSelection> selection_;
  std::shared_ptr<torch::nn::Module> root_;
  std::vector<Block> blocks_;
};

void register_components(Registry& registry) {
  registry.add<Model>(
      "gpt",
      {option("n_layers", 4, "transformer blocks"),
       option("n_heads", 4, "attention heads (must divide d_model)"),
       option("d_model", 128, "width of the residual stream"),
       option("seq_len", 0, "context length (0: the dataset's; otherwise must equal it)"),
       option("dropout", 0.0, "dropout on embeddings, attention and residual branches"),
       loss_reduction_option("per-token cross-entropy over the scored tokens (targets of -100 "
                             "are not scored, as PyTorch's ignore_index): their mean or their "
                             "sum")},
      "decoder-only transformer language model (pre-norm, causal attention, tied head)",
      [](const Config& options, const BuildContext& context) {
        return std::make_unique<Gpt>(options, context);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("gpt", "1.0.0", trainyard::register_components)
