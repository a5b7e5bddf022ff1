#pragma once
// One bucket's PowerSGD step (Vogels et al., 2019), as PyTorch's powerSGD_hook computes it:
// error feedback added, the bucket's gradients split into matrices worth compressing and the
// rest, Q (warm-started or drawn afresh) orthogonalised, P = M Q all-reduced and orthogonalised,
// Q = M^T P all-reduced and averaged, M approximated by P Q^T; the rest all-reduced and averaged
// as it is. The same computations and collectives as the hook, so the results agree with it; the
// rest's all-reduce starts before Q and P are computed, so its latency hides behind them.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "trainyard/api/gradient_compression.hpp"

namespace c10d {
class Backend;
class Work;
}  // namespace c10d

namespace trainyard {

class LegacyRandomState;

struct PowerSgdSettings {
  std::int64_t rank = 1;
  double min_compression_rate = 2;
  bool error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0;
};

// The matrix a gradient of `shape` is compressed as, as the hook views it: its first dimension
// by the rest (a scalar as 1 x 1). Rows, then columns.
std::pair<std::int64_t, std::int64_t> matrix_shape(const std::vector<std::int64_t>& shape);

// Whether a rows x columns matrix is worth compressing at `rank` (already clamped to its
// dimensions): its factors must be min_compression_rate times smaller than it.
bool worth_compressing(std::int64_t rows, std::int64_t columns, std::int64_t rank,
                       double min_compression_rate);

// Orthogonalises the columns of each matrix of a (batch, rows, rank) tensor in place:
// Gram-Schmidt for rank <= 2 or a half-precision dtype, QR otherwise (as the hook chooses).
void orthogonalize(const at::Tensor& matrices, double epsilon);

// The state PyTorch's PowerSGDState keeps for one bucket, and the step in flight.
class PowerSgdBucket {
 public:
  // `gradient_shapes` in bucket order, `flat_numel` the bucket's length.
  PowerSgdBucket(const std::vector<std::vector<std::int64_t>>& gradient_shapes,
                 std::int64_t flat_numel, const PowerSgdSettings& settings);

  // Adds the error, draws or warm-starts Q, computes P and launches the all-reduces of the
  // uncompressed gradients and of P.
  void begin(GradientBucket& bucket, const c10::intrusive_ptr<c10d::Backend>& group,
             LegacyRandomState& random);
  // Waits, orthogonalises P, all-reduces Q and leaves P Q^T (and the averaged rest) in the bucket.
  void end(GradientBucket& bucket, const c10::intrusive_ptr<c10d::Backend>& group);

  std::int64_t p_numel() const { return p_numel_; }
  std::int64_t q_numel() const { return q_numel_; }
  std::int64_t flat_numel() const { return flat_numel_; }

  // Checkpointed state: the error (undefined before the first compressed step) and Q (undefined
  // until a warm start has one).
  at::Tensor error;
  at::Tensor q_memory;

 private:
  struct Matrix {
    std::size_t gradient;  // index in the bucket
    std::int64_t rows, columns, rank;
  };

  PowerSgdSettings settings_;
  std::int64_t flat_numel_;
  std::vector<Matrix> compressed_;  // grouped by shape, in the order each shape first appears
  std::vector<std::size_t> uncompressed_;
  std::int64_t p_numel_ = 0;
  std::int64_t q_numel_ = 0;

  // The step in flight.
  at::Tensor rest_;  // the uncompressed gradients, back to back
  at::Tensor p_memory_;
  at::Tensor before_;  // the gradients with the error added, for the next error
  std::vector<at::Tensor> matrices_, ps_, qs_;
  c10::intrusive_ptr<c10d::Work> rest_work_, p_work_;
};

}  // namespace trainyard
