#pragma once
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; sequence parallelism, Korthikanti et al.
// 2022): layers whose weights are split across the ranks of the mesh's tp group, and the
// differentiable operators that move activations into and out of the split region. Any model
// plugin builds its tensor-parallel layers from these; with tp = 1 every operator is the identity
// and every layer its whole counterpart.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace c10d {
class Backend;
}

namespace trainyard {

class ProcessMesh;

// The tp group a layer communicates over.
struct TensorParallelGroup {
  c10::intrusive_ptr<c10d::Backend> backend;  // null when size is 1
  int rank = 0;
  int size = 1;

  // This rank's place in the mesh's tp dimension (size 1 without a mesh).
  static TensorParallelGroup of(const ProcessMesh* mesh);
  // `size` / tp. Throws Error "<what> (<size>) does not divide by tp (<tp>)" otherwise.
  std::int64_t split(std::int64_t size, const std::string& what) const;
  // This rank's slice of `whole` along `dim` (a copy, contiguous): how a layer's shard is cut
  // from the whole model's initial weight so that it holds exactly that slice.
  at::Tensor shard_of(const at::Tensor& whole, std::int64_t dim) const;
};

// The region operators, each differentiable, named as in Megatron-LM:
// forward identity, backward all-reduce of the gradient (f, entering a column-parallel layer).
at::Tensor copy_to_tensor_parallel_region(const at::Tensor& input, const TensorParallelGroup& group);
// forward all-reduce (sum), backward identity (g, leaving a row-parallel layer).
at::Tensor reduce_from_tensor_parallel_region(const at::Tensor& input,
                                              const TensorParallelGroup& group);
// forward all-gather of the ranks' slices along the last dimension, backward this rank's slice
// of the gradient (a column-parallel layer that gathers its output).
at::Tensor gather_from_tensor_parallel_region(const at::Tensor& input,
                                              const TensorParallelGroup& group);
// Sequence parallelism along `dim`: forward all-gather, backward reduce-scatter.
at::Tensor gather_from_sequence_parallel_region(const at::Tensor& input, std::int64_t dim,
                                                const TensorParallelGroup& group);
// forward reduce-scatter (sum) along `dim`, backward all-gather.
at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& input, std::int64_t dim,
                                                      const TensorParallelGroup& group);
// forward this rank's slice along `dim`, backward all-gather (entering the sequence-parallel
// region from a replicated tensor).
at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& input, std::int64_t dim,
                                               const TensorParallelGroup& group);

// With sequence parallelism a replicated parameter used inside the sequence-parallel region (a
// sequence-parallel RowParallelLinear's bias, a layer norm's weight) gets from each rank the
// gradient of that rank's slice of the sequence only. Sums those gradients over the group, in
// place, one all-reduce per dtype (Megatron-LM's finalize step): once per optimizer step, after
// the last backward.
void all_reduce_sequence_parallel_gradients(const std::vector<at::Tensor>& parameters,
                                            const TensorParallelGroup& group);

// y = x A^T + b with A split by rows (output features): this rank computes its out/tp features.
// The input enters through copy_to_tensor_parallel_region, or, with sequence_parallel, through
// gather_from_sequence_parallel_region along `sequence_dim` (the input is this rank's slice of
// the sequence). With gather_output the full output is gathered; else it stays split.
// With sequence_parallel only this rank's slice of the input is kept for backward, which
// gathers it again for the weight's gradient (as Megatron-LM): one more all-gather per backward
// instead of holding tp times the input.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(std::int64_t in_features, std::int64_t out_features, bool bias,
                           TensorParallelGroup group, bool gather_output = false,
                           bool sequence_parallel = false, std::int64_t sequence_dim = 1);
  at::Tensor forward(const at::Tensor& input);
  // Copies this rank's rows of the whole weight [out, in] (and bias [out]) in.
  void load_whole(const at::Tensor& weight, const at::Tensor& bias = {});

  at::Tensor weight;  // [out / tp, in]
  at::Tensor bias;    // [out / tp], or undefined
  const TensorParallelGroup& group() const { return group_; }

 private:
  TensorParallelGroup group_;
  bool gather_output_;
  bool sequence_parallel_;
  std::int64_t sequence_dim_;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x A^T + b with A split by columns (input features): the input is already split (the output
// of a column-parallel layer); partial products are all-reduced (with sequence_parallel,
// reduce-scattered along `sequence_dim`), then the whole bias is added once.
// With sequence_parallel the bias's gradient covers this rank's slice of the sequence only:
// see all_reduce_sequence_parallel_gradients.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(std::int64_t in_features, std::int64_t out_features, bool bias,
                        TensorParallelGroup group, bool sequence_parallel = false,
                        std::int64_t sequence_dim = 1);
  at::Tensor forward(const at::Tensor& input);
  // Copies this rank's columns of the whole weight [out, in] (and the whole bias [out]) in.
  void load_whole(const at::Tensor& weight, const at::Tensor& bias = {});

  at::Tensor weight;  // [out, in / tp]
  at::Tensor bias;    // [out], replicated, or undefined
  const TensorParallelGroup& group() const { return group_; }

 private:
  TensorParallelGroup group_;
  bool sequence_parallel_;
  std::int64_t sequence_dim_;
};
TORCH_MODULE(RowParallelLinear);

// An embedding whose rows (the vocabulary) are split: rank r holds ids [r V/tp, (r+1) V/tp),
// looks up the ids in its range (zeros for the others) and the partial results are all-reduced.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(std::int64_t vocab, std::int64_t dim, TensorParallelGroup group);
  at::Tensor forward(const at::Tensor& ids);
  void load_whole(const at::Tensor& weight);
  std::int64_t vocab_begin() const { return vocab_begin_; }

  at::Tensor weight;  // [vocab / tp, dim]
  const TensorParallelGroup& group() const { return group_; }

 private:
  TensorParallelGroup group_;
  std::int64_t vocab_begin_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Per-row cross-entropy of logits split by vocabulary ([N, V/tp] on each rank, rank r holding
// classes [r V/tp, ...)) against `target` [N] (whole class indices), without gathering the
// logits: the row maximum (all-reduce max), the target's logit and the sum of exponentials
// (all-reduce sums) are reduced across the group. Rows whose target is `ignore_index` give 0.
// Differentiable (the gradient is softmax minus one-hot, computed locally). Returns [N], equal
// on every rank.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& target,
                                        const TensorParallelGroup& group,
                                        std::int64_t ignore_index = -100);

// The argmax over the whole vocabulary of logits split by vocabulary ([N, V/tp] -> [N] whole
// class indices, the lowest index on ties, as at::argmax), equal on every rank. Not
// differentiable.
at::Tensor vocab_parallel_argmax(const at::Tensor& local_logits, const TensorParallelGroup& group);

}  // namespace trainyard
