// A decoder-only transformer language model (GPT-2 shape): token and learned position
// embeddings, pre-norm blocks of causal self-attention and a GELU MLP, a final LayerNorm and an
// output head tied to the token embedding.
//
// Blocks, in forward order, each passing one tensor to the next:
//   "embed"   int64 token ids [B, T] -> activations [B, T, d]
//   "layerI"  [B, T, d] -> [B, T, d], for I in 0 .. n_layers - 1
//   "head"    [B, T, d] -> logits [B, T, vocab] (with tp, this rank's [B, T, vocab / tp])
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
//
// Tensor parallelism (the mesh's tp > 1, Megatron-LM's split): attention by heads (the fused
// q/k/v projection column-parallel, each rank holding its heads' q, k and v rows; the output
// projection row-parallel), the MLP (mlp_in column-parallel, mlp_out row-parallel), and the token
// embedding and tied head by vocabulary: the head gives this rank's share of the logits
// [B, T, vocab / tp], which the loss and the accuracy reduce across the group without gathering.
// Norms, the position embedding and the row-parallel layers' biases are whole on every rank.
// With sequence_parallel the residual stream between the layers is split along the sequence
// ([B, T / tp, d]). Every shard is cut from the whole model's initial weight, so a tp build holds
// exactly the whole model's values, and parameter_layout says which box of which whole parameter
// each shard is.
//
// Dropout with tp: the ranks share the run's seed, so they draw the same masks on the replicated
// stream and their replicas stay equal, but no split build draws the whole model's masks:
// attention dropout draws masks for heads / tp heads, and with sequence_parallel each rank draws
// a mask for its slice of the sequence from the same generator state as the other ranks (alike
// slices, not slices of one whole mask). A tp build therefore equals the whole model only with
// dropout 0, which is how its parity tests run.

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
// TensorParallelGroup holds its backend by value: copying one needs the complete type, which
// tensor_parallel.hpp only declares.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cmath>
#include <map>
#include <optional>

#include "trainyard/parallel/block_selection.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/models/loss_reduction.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/models/parameter_init.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/parallel/tensor_parallel.hpp"

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

// How this build splits the model over the mesh's tp group.
struct TensorSplit {
  TensorParallelGroup group;
  // Only with more than one rank: with one it would be the identity.
  bool sequence_parallel = false;

  bool split() const { return group.size > 1; }
};

// The dimension the sequence runs along in the residual stream [B, T, d].
constexpr std::int64_t kSequenceDim = 1;

// A whole parameter of `shape` drawn from the stream of `name` as GPT-2 initialises weights,
// N(0, std): drawn whole, whatever this rank holds of it, so that every shard is exactly the
// whole model's slice.
torch::Tensor whole_normal(const ParameterInit& init, std::vector<std::int64_t> shape,
                           const std::string& name, double std) {
  torch::Tensor whole = torch::empty(shape);
  init.normal(whole, name, 0.0, std);
  return whole;
}

// The fused q/k/v rows (q of every head, then k, then v) reordered so that rank r's contiguous
// share of them is its heads' q rows, then their k rows, then their v rows: what a
// column-parallel layer loading the reordered tensor holds on each rank.
torch::Tensor qkv_rows_by_rank(const torch::Tensor& whole, std::int64_t ranks) {
  std::vector<std::int64_t> blocks = {3, ranks, whole.size(0) / (3 * ranks)};
  for (std::int64_t dim = 1; dim < whole.dim(); ++dim) blocks.push_back(whole.size(dim));
  return whole.view(blocks).transpose(0, 1).reshape(whole.sizes());
}

// The box of parameter `name` (whole shape `whole`) that rank `group.rank` holds when it is split
// evenly along `dim`.
HeldLayout split_layout(const std::string& name, const std::vector<std::int64_t>& whole,
                        std::int64_t dim, const TensorParallelGroup& group) {
  std::vector<std::int64_t> offsets(whole.size(), 0);
  std::vector<std::int64_t> shape = whole;
  const auto axis = static_cast<std::size_t>(dim);
  shape[axis] = whole[axis] / group.size;
  offsets[axis] = shape[axis] * group.rank;
  return parameter_box_layout(name, whole, offsets, shape);
}

// The fused q/k/v weight or bias (whole rows [3d, ...]) split by heads: three boxes of rows, this
// rank's q, k and v rows, held one after another.
HeldLayout qkv_layout(const std::string& name, const std::vector<std::int64_t>& whole,
                      const TensorParallelGroup& group) {
  const std::int64_t width = whole[0] / 3;
  std::vector<std::int64_t> shape = whole;
  shape[0] = width / group.size;
  HeldLayout layout;
  for (std::int64_t part = 0; part < 3; ++part) {
    std::vector<std::int64_t> offsets(whole.size(), 0);
    offsets[0] = part * width + group.rank * shape[0];
    ParameterPiece piece = parameter_box_layout(name, whole, offsets, shape).front();
    piece.offset = part * piece.length;
    layout.push_back(std::move(piece));
  }
  return layout;
}

// Initialises linear layer `name` (a column- or row-parallel layer holding this rank's part of a
// whole weight of `whole_shape`) as GPT-2 does: weight N(0, std), bias zero. With tp the whole
// weight is drawn and the layer keeps its part (of the fused q/k/v weight, with its rows reordered
// by rank first); without, the weight is drawn in place, so that a build allocates no more than
// its parameters.
template <class Layer>
void init_linear(const ParameterInit& init, Layer& layer, const std::string& name,
                 std::vector<std::int64_t> whole_shape, double std, const TensorSplit& split,
                 bool fused_qkv = false) {
  init.fill(layer->bias, 0.0);
  if (!split.split()) {
    init.normal(layer->weight, name + ".weight", 0.0, std);
    return;
  }
  torch::Tensor whole = whole_normal(init, std::move(whole_shape), name + ".weight", std);
  layer->load_whole(fused_qkv ? qkv_rows_by_rank(whole, split.group.size) : whole);
}

void init_layer_norm(const ParameterInit& init, torch::nn::LayerNorm& norm) {
  init.fill(norm->weight, 1.0);
  init.fill(norm->bias, 0.0);
}

// A LayerNorm. With sequence parallelism each rank normalises only its slice of the sequence, so
// its gradient for the (replicated) weight and bias is partial: they are used through
// copy_to_tensor_parallel_region, whose backward all-reduces it, and every rank ends with the
// whole model's gradient without any strategy knowing these parameters are special.
torch::Tensor normalise(torch::nn::LayerNorm& norm, const torch::Tensor& x,
                        const TensorSplit& split) {
  if (!split.sequence_parallel) return norm(x);
  return at::layer_norm(x, norm->options.normalized_shape(),
                        copy_to_tensor_parallel_region(norm->weight, split.group),
                        copy_to_tensor_parallel_region(norm->bias, split.group),
                        norm->options.eps());
}

// A row-parallel layer's output. With sequence parallelism its (replicated) bias is added to this
// rank's slice of the sequence, so, as for the norms, it is used through
// copy_to_tensor_parallel_region for its whole gradient.
torch::Tensor row_parallel(RowParallelLinear& layer, const torch::Tensor& x,
                           const TensorSplit& split) {
  if (!split.sequence_parallel) return layer(x);
  return reduce_scatter_to_sequence_parallel_region(at::linear(x, layer->weight), kSequenceDim,
                                                    split.group) +
         copy_to_tensor_parallel_region(layer->bias, split.group);
}

class EmbedBlock : public torch::nn::Module {
 public:
  EmbedBlock(const GptShape& shape, const TensorSplit& split, const ParameterInit& init)
      : token(register_module("token",
                              VocabParallelEmbedding(shape.vocab, shape.d_model, split.group))),
        position(register_module("position", torch::nn::Embedding(shape.seq_len, shape.d_model))),
        dropout(register_module("dropout", torch::nn::Dropout(shape.dropout))),
        seq_len_(shape.seq_len),
        split_(split) {
    // Drawn in place without tp, so that a build allocates no more than its parameters.
    if (split.split()) {
      token->load_whole(whole_normal(init, {shape.vocab, shape.d_model}, kTokenWeight, kWeightStd));
    } else {
      init.normal(token->weight, kTokenWeight, 0.0, kWeightStd);
    }
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
    if (split_.sequence_parallel && length % split_.group.size != 0) {
      throw Error("model 'gpt' with sequence_parallel got sequences of " + std::to_string(length) +
                  " tokens, which do not divide by tp (" + std::to_string(split_.group.size) + ")");
    }
    torch::Tensor positions = at::arange(length, ids.options().dtype(at::kLong));
    torch::Tensor x = token(ids) + position(positions);
    if (split_.sequence_parallel) {
      x = scatter_to_sequence_parallel_region(x, kSequenceDim, split_.group);
    }
    return dropout(x);
  }

  VocabParallelEmbedding token;
  torch::nn::Embedding position;
  torch::nn::Dropout dropout;

 private:
  std::int64_t seq_len_;
  TensorSplit split_;
};

class TransformerLayer : public torch::nn::Module {
 public:
  // `name` is the layer's name in the whole model ("layerI").
  TransformerLayer(const GptShape& shape, const TensorSplit& split, const ParameterInit& init,
                   const std::string& name)
      : attention_norm(register_module(
            "attention_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.d_model})))),
        qkv(register_module("qkv", ColumnParallelLinear(shape.d_model, 3 * shape.d_model, true,
                                                        split.group, /*gather_output=*/false,
                                                        split.sequence_parallel, kSequenceDim))),
        attention_out(register_module(
            "attention_out", RowParallelLinear(shape.d_model, shape.d_model, true, split.group,
                                               split.sequence_parallel, kSequenceDim))),
        mlp_norm(register_module(
            "mlp_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({shape.d_model})))),
        mlp_in(register_module(
            "mlp_in",
            ColumnParallelLinear(shape.d_model, 4 * shape.d_model, true, split.group,
                                 /*gather_output=*/false, split.sequence_parallel, kSequenceDim))),
        mlp_out(register_module(
            "mlp_out", RowParallelLinear(4 * shape.d_model, shape.d_model, true, split.group,
                                         split.sequence_parallel, kSequenceDim))),
        dropout(register_module("dropout", torch::nn::Dropout(shape.dropout))),
        local_heads_(shape.n_heads / split.group.size),
        head_width_(shape.d_model / shape.n_heads),
        dropout_p_(shape.dropout),
        split_(split) {
    const std::int64_t d = shape.d_model;
    // Residual projections scaled down with depth, so the residual stream's variance stays
    // bounded (GPT-2).
    const double residual_std = kWeightStd / std::sqrt(2.0 * static_cast<double>(shape.n_layers));
    init_layer_norm(init, attention_norm);
    init_linear(init, qkv, name + ".qkv", {3 * d, d}, kWeightStd, split, /*fused_qkv=*/true);
    init_linear(init, attention_out, name + ".attention_out", {d, d}, residual_std, split);
    init_layer_norm(init, mlp_norm);
    init_linear(init, mlp_in, name + ".mlp_in", {4 * d, d}, kWeightStd, split);
    init_linear(init, mlp_out, name + ".mlp_out", {d, 4 * d}, residual_std, split);
  }

  // `x` is [B, T, d], or with sequence parallelism this rank's [B, T / tp, d].
  torch::Tensor forward(const torch::Tensor& x) {
    // [B, T, 3 d / tp]: every position, this rank's heads' q, k and v.
    torch::Tensor projected = qkv(normalise(attention_norm, x, split_));
    const std::int64_t batch = projected.size(0), length = projected.size(1);
    // -> three [B, heads / tp, T, d / heads]
    auto parts = projected.view({batch, length, 3, local_heads_, head_width_})
                     .permute({2, 0, 3, 1, 4})
                     .unbind(0);
    torch::Tensor attended = at::scaled_dot_product_attention(
        parts[0], parts[1], parts[2], /*attn_mask=*/{}, is_training() ? dropout_p_ : 0.0,
        /*is_causal=*/true);
    attended = attended.transpose(1, 2).reshape({batch, length, local_heads_ * head_width_});
    torch::Tensor h = x + dropout(row_parallel(attention_out, attended, split_));
    return h +
           dropout(row_parallel(mlp_out, at::gelu(mlp_in(normalise(mlp_norm, h, split_))), split_));
  }

  torch::nn::LayerNorm attention_norm;
  ColumnParallelLinear qkv;
  RowParallelLinear attention_out;
  torch::nn::LayerNorm mlp_norm;
  ColumnParallelLinear mlp_in;
  RowParallelLinear mlp_out;
  torch::nn::Dropout dropout;

 private:
  std::int64_t local_heads_;
  std::int64_t head_width_;
  double dropout_p_;
  TensorSplit split_;
};

// The final LayerNorm and the output projection, whose weight is the token embedding's (or, on
// a stage without the embedding, a copy of it): with tp, this rank's rows of the vocabulary, so
// it gives this rank's share of the logits.
class HeadBlock : public torch::nn::Module {
 public:
  HeadBlock(torch::nn::LayerNorm norm, const torch::Tensor& token_weight, TensorSplit split)
      : norm(register_module("norm", std::move(norm))),
        weight(register_parameter("token_weight", token_weight)),
        split_(std::move(split)) {}

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = normalise(norm, x, split_);
    // Every rank multiplies every position by its vocabulary rows: the gather's (or the copy's)
    // backward sums the ranks' partial gradients for the positions.
    if (split_.sequence_parallel) {
      h = gather_from_sequence_parallel_region(h, kSequenceDim, split_.group);
    } else if (split_.split()) {
      h = copy_to_tensor_parallel_region(h, split_.group);
    }
    return at::linear(h, weight);
  }

  torch::nn::LayerNorm norm;
  torch::Tensor weight;

 private:
  TensorSplit split_;
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
    if (shape_.d_model % shape_.n_heads != 0) {
      options.fail("n_heads", "must divide d_model (" + std::to_string(shape_.d_model) + ")");
    }
    split_.group = TensorParallelGroup::of(context.mesh.get());
    const std::int64_t tp = split_.group.size;
    split_.sequence_parallel = options.get_bool("sequence_parallel") && split_.split();
    if (shape_.n_heads % tp != 0) {
      options.fail("n_heads", "(" + std::to_string(shape_.n_heads) + ") does not divide by tp (" +
                                  std::to_string(tp) + "): attention is split by heads");
    }
    if (shape_.vocab % tp != 0) {
      throw Error("model 'gpt': the dataset's vocabulary (" + std::to_string(shape_.vocab) +
                  " tokens) does not divide by tp (" + std::to_string(tp) +
                  "): the token embedding and the output head are split by vocabulary");
    }
    if (split_.sequence_parallel && shape_.seq_len % tp != 0) {
      options.fail("sequence_parallel", "needs seq_len (" + std::to_string(shape_.seq_len) +
                                            ") to divide by tp (" + std::to_string(tp) +
                                            "): the residual stream is split along the sequence");
    }

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
      embed = std::make_shared<EmbedBlock>(shape_, split_, init);
      root_->register_module("embed", embed);
      if (split_.split()) {
        layouts_[kTokenWeight] =
            split_layout(kTokenWeight, {shape_.vocab, shape_.d_model}, 0, split_.group);
      }
      blocks_.push_back(
          Block{"embed", embed,
                [embed](const Activations& x) { return x.with_hidden(embed->forward(x.hidden())); }});
    }
    for (std::int64_t i = 0; i < shape_.n_layers; ++i) {
      if (!selection_->holds(i + 1)) continue;
      const std::string name = "layer" + std::to_string(i);
      auto layer = std::make_shared<TransformerLayer>(shape_, split_, init, name);
      record_layer_layouts(name);
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
      token_weight = whole_normal(init, {shape_.vocab, shape_.d_model}, kTokenWeight, kWeightStd);
      if (split_.split()) token_weight = split_.group.shard_of(token_weight, 0);
      root_->register_parameter(kHeadCopyOfTokenWeight, token_weight);
      // The copy is a piece of the tied parameter, whose whole model name it carries.
      layouts_[kHeadCopyOfTokenWeight] =
          split_.split()
              ? split_layout(kTokenWeight, {shape_.vocab, shape_.d_model}, 0, split_.group)
              : whole_parameter_layout(kTokenWeight, {shape_.vocab, shape_.d_model});
    }
    auto head = std::make_shared<HeadBlock>(norm, token_weight, split_);
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
    const torch::Tensor rows = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
    // With tp each rank holds its share of the vocabulary's logits; the split cross-entropy
    // gives every rank the whole model's per-token losses.
    torch::Tensor sum =
        split_.split()
            ? vocab_parallel_cross_entropy(rows, target, split_.group, kIgnoredTarget).sum()
            : at::cross_entropy_loss(rows, target, /*weight=*/{}, at::Reduction::Sum,
                                     kIgnoredTarget);
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
    const torch::Tensor predicted =
        split_.split() ? vocab_parallel_argmax(logits.reshape({-1, logits.size(-1)}), split_.group)
                             .view(target.sizes())
                       : logits.argmax(-1);
    torch::Tensor correct = predicted.eq(target).sum(-1).to(at::kFloat);
    torch::Tensor scored = target.ne(kIgnoredTarget).sum(-1).clamp_min(1).to(at::kFloat);
    return {{"accuracy", (correct / scored).sum()}};
  }

  // Per token, forward plus backward: 6 N for the matrix multiplies (2 FLOPs per multiply-add,
  // backward twice forward), N = 12 d^2 per layer (qkv 3d^2, attention output d^2, MLP 8d^2)
  // + vocab * d (the output head); plus 12 * d * T per layer for attention's scores and
  // weighted sum over the T positions (PaLM, appendix B). Embedding lookups, norms and biases are
  // left out. Per sample: T times that, over the blocks this build holds. With tp each rank
  // does 1 / tp of every term (its heads, its MLP columns, its vocabulary rows).
  double flops_per_sample() const override {
    const double d = static_cast<double>(shape_.d_model);
    const double length = static_cast<double>(shape_.seq_len);
    double layers = 0;
    for (std::int64_t i = 0; i < shape_.n_layers; ++i) {
      if (selection_->holds(i + 1)) layers += 1;
    }
    double matmul_params = layers * 12.0 * d * d;
    if (selection_->holds_last()) matmul_params += static_cast<double>(shape_.vocab) * d;
    return length * (6.0 * matmul_params + 12.0 * layers * d * length) /
           static_cast<double>(split_.group.size);
  }

  HeldLayout parameter_layout(const std::string& name, const torch::Tensor& held) const override {
    auto it = layouts_.find(name);
    return it != layouts_.end() ? it->second : whole_parameter_layout(name, held.sizes().vec());
  }

 private:
  GptShape shape_;
  LossReduction reduction_;
  std::vector<std::string> block_names_;
  // Set once the options are checked, before anything is built.
  std::optional<BlockSelection> selection_;
  std::shared_ptr<torch::nn::Module> root_;
  std::vector<Block> blocks_;
  TensorSplit split_;
  // The parameters this build holds as anything but themselves whole (tp shards, the head's copy
  // of the tied weight), by their name in module().
  std::map<std::string, HeldLayout> layouts_;

  // The boxes of layer `name`'s split parameters this rank holds.
  void record_layer_layouts(const std::string& name) {
    if (!split_.split()) return;
    const std::int64_t d = shape_.d_model;
    const TensorParallelGroup& group = split_.group;
    layouts_[name + ".qkv.weight"] = qkv_layout(name + ".qkv.weight", {3 * d, d}, group);
    layouts_[name + ".qkv.bias"] = qkv_layout(name + ".qkv.bias", {3 * d}, group);
    layouts_[name + ".attention_out.weight"] =
        split_layout(name + ".attention_out.weight", {d, d}, 1, group);
    layouts_[name + ".mlp_in.weight"] = split_layout(name + ".mlp_in.weight", {4 * d, d}, 0, group);
    layouts_[name + ".mlp_in.bias"] = split_layout(name + ".mlp_in.bias", {4 * d}, 0, group);
    layouts_[name + ".mlp_out.weight"] =
        split_layout(name + ".mlp_out.weight", {d, 4 * d}, 1, group);
  }
};

void register_components(Registry& registry) {
  registry.add<Model>(
      "gpt",
      {option("n_layers", 4, "transformer blocks").at_least(1),
       option("n_heads", 4, "attention heads (must divide d_model)").at_least(1),
       option("d_model", 128, "width of the residual stream").at_least(1),
       option("seq_len", 0, "context length (0: the dataset's; otherwise must equal it)")
           .at_least(0),
       option("dropout", 0.0, "dropout on embeddings, attention and residual branches")
           .at_least(0)
           .less_than(1),
       option("sequence_parallel", false,
              "with tp > 1, split the residual stream between the layers (norms, dropout) along "
              "the sequence; seq_len must divide by tp (no effect with tp = 1)"),
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
