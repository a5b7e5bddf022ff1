// A decoder-only transformer language model (GPT-2 shape): token and learned position
// embeddings, pre-norm blocks of causal self-attention and a GELU MLP, a final LayerNorm and an
// output head tied to the token embedding.
//
// Blocks, in forward order, each passing one tensor to the next:
//   "embed"   int64 token ids [B, T] -> activations [B, T, d]
//   "layerI"  [B, T, d] -> [B, T, d], for I in 0 .. n_layers - 1
//   "head"    [B, T, d] -> logits [B, T, vocab]
// The token embedding's weight is the output head's weight too, so it appears in both the first
// and the last block (the tie the Model contract allows); module() holds it once.

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>

#include "trainyard/error.hpp"
#include "trainyard/plugin.hpp"
#include "trainyard/model.hpp"

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

// Weights as GPT-2 initialises them: N(0, 0.02), biases zero.
void init_linear(torch::nn::Linear& linear, double std) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(linear->weight, 0.0, std);
  if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
}

class EmbedBlock : public torch::nn::Module {
 public:
  explicit EmbedBlock(const GptShape& shape)
      : token(register_module("token", torch::nn::Embedding(shape.vocab, shape.d_model))),
        position(register_module("position", torch::nn::Embedding(shape.seq_len, shape.d_model))),
        dropout(register_module("dropout", torch::nn::Dropout(shape.dropout))),
        seq_len_(shape.seq_len) {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(token->weight, 0.0, 0.02);
    torch::nn::init::normal_(position->weight, 0.0, 0.02);
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
  explicit TransformerLayer(const GptShape& shape)
      : attention_norm(register_module("attention_norm",
                                       torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.d_model})))),
        qkv(register_module("qkv", torch::nn::Linear(shape.d_model, 3 * shape.d_model))),
        attention_out(register_module("attention_out", torch::nn::Linear(shape.d_model, shape.d_model))),
        mlp_norm(register_module("mlp_norm",
                                 torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.d_model})))),
        mlp_in(register_module("mlp_in", torch::nn::Linear(shape.d_model, 4 * shape.d_model))),
        mlp_out(register_module("mlp_out", torch::nn::Linear(4 * shape.d_model, shape.d_model))),
        dropout(register_module("dropout", torch::nn::Dropout(shape.dropout))),
        heads_(shape.n_heads),
        dropout_p_(shape.dropout) {
    // Residual projections scaled down with depth, so the residual stream's variance stays
    // bounded (GPT-2).
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(shape.n_layers));
    init_linear(qkv, 0.02);
    init_linear(attention_out, residual_std);
    init_linear(mlp_in, 0.02);
    init_linear(mlp_out, residual_std);
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

// The final LayerNorm and the output projection, whose weight is the token embedding's.
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
      : root_(std::make_shared<torch::nn::Module>("Gpt")) {
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

    auto embed = std::make_shared<EmbedBlock>(shape_);
    root_->register_module("embed", embed);
    blocks_.push_back(Block{"embed", embed, [embed](const torch::Tensor& x) { return embed->forward(x); }});
    for (std::int64_t i = 0; i < shape_.n_layers; ++i) {
      const std::string name = "layer" + std::to_string(i);
      auto layer = std::make_shared<TransformerLayer>(shape_);
      root_->register_module(name, layer);
      blocks_.push_back(Block{name, layer, [layer](const torch::Tensor& x) { return layer->forward(x); }});
    }
    // The head module is not registered under root_: root_ already holds the final norm (below)
    // and the tied weight (in "embed"), and listing them twice would make optimizers step them
    // twice.
    auto norm = torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape_.d_model}));
    root_->register_module("final_norm", norm);
    auto head = std::make_shared<HeadBlock>(norm, embed->token->weight);
    blocks_.push_back(Block{"head", head, [head](const torch::Tensor& x) { return head->forward(x); }});
  }

  torch::nn::Module& module() override { return *root_; }
  std::vector<Block> blocks() override { return blocks_; }
  torch::Tensor input(const Batch& batch) override { return batch.at("input"); }

  // Mean cross-entropy over every position of every sequence (all sequences have the same
  // length, so this is also the mean over the batch of per-sequence means).
  torch::Tensor loss(const torch::Tensor& logits, const Batch& batch) override {
    const torch::Tensor& target = batch.at("target");
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                  target.reshape({-1}));
  }

  // {"accuracy": sum over sequences of the fraction of next tokens predicted}: the engine divides
  // by the sequence count, giving the mean next-token accuracy.
  TensorMap eval_sums(const torch::Tensor& logits, const Batch& batch) override {
    torch::Tensor correct = logits.argmax(-1).eq(batch.at("target")).to(at::kFloat);
    return {{"accuracy", correct.mean(-1).sum()}};
  }

  // Per token, forward plus backward: 6 N for the matrix multiplies (2 FLOPs per multiply-add,
  // backward twice forward), N = n_layers * 12 d^2 (qkv 3d^2, attention output d^2, MLP 8d^2)
  // + vocab * d (the output head); plus 12 * n_layers * d * T for attention's scores and
  // weighted sum over the T positions (PaLM, appendix B). Embedding lookups, norms and biases are
  // left out. Per sample: T times that.
  double flops_per_sample() const override {
    const double d = static_cast<double>(shape_.d_model);
    const double layers = static_cast<double>(shape_.n_layers);
    const double length = static_cast<double>(shape_.seq_len);
    const double matmul_params = layers * 12.0 * d * d + static_cast<double>(shape_.vocab) * d;
    return length * (6.0 * matmul_params + 12.0 * layers * d * length);
  }

 private:
  GptShape shape_;
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
       option("dropout", 0.0, "dropout on embeddings, attention and residual branches")},
      "decoder-only transformer language model (pre-norm, causal attention, tied head)",
      [](const Config& options, const BuildContext& context) {
        return std::make_unique<Gpt>(options, context);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("gpt", "1.0.0", trainyard::register_components)
