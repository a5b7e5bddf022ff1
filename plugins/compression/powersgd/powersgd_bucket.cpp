#include "powersgd_bucket.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <map>

#include "legacy_random_state.hpp"

namespace trainyard {

namespace {

// The hook's seeds are drawn below 10^9.
constexpr std::uint32_t kSeedBound = 1000000000U;

c10::intrusive_ptr<c10d::Work> all_reduce(const c10::intrusive_ptr<c10d::Backend>& group,
                                          const at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  return group->allreduce(tensors);
}

void gram_schmidt(const at::Tensor& matrices, double epsilon) {
  const std::int64_t columns = matrices.size(2);
  for (std::int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrices.narrow(2, i, 1);
    at::Tensor norm = at::linalg_vector_norm(column, 2, at::IntArrayRef{1}, /*keepdim=*/true);
    if (epsilon != 0) norm = norm + epsilon;
    column.div_(norm);
    if (i + 1 < columns) {
      at::Tensor rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(at::sum(column * rest, {1}, /*keepdim=*/true) * column);
    }
  }
}

}  // namespace

std::pair<std::int64_t, std::int64_t> matrix_shape(const std::vector<std::int64_t>& shape) {
  const std::int64_t rows = shape.empty() ? 1 : shape[0];
  return {rows, rows == 0 ? 0 : c10::multiply_integers(shape) / rows};
}

bool worth_compressing(std::int64_t rows, std::int64_t columns, std::int64_t rank,
                       double min_compression_rate) {
  const double compressed = static_cast<double>((rows + columns) * rank);
  return compressed * min_compression_rate < static_cast<double>(rows * columns);
}

void orthogonalize(const at::Tensor& matrices, double epsilon) {
  const at::ScalarType dtype = matrices.scalar_type();
  if (matrices.size(2) <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    gram_schmidt(matrices, epsilon);
    return;
  }
  at::Tensor r =
      at::empty({matrices.size(0), matrices.size(2), matrices.size(2)}, matrices.options());
  at::Tensor q = matrices;  // Q overwrites the matrices, as the hook's out=(matrices, R)
  at::linalg_qr_out(q, r, matrices);
}

PowerSgdBucket::PowerSgdBucket(const std::vector<std::vector<std::int64_t>>& gradient_shapes,
                               std::int64_t flat_numel, const PowerSgdSettings& settings)
    : settings_(settings), flat_numel_(flat_numel) {
  // Matrices of one shape are taken together, shapes in the order they first appear.
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes;
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::size_t>> of_shape;
  for (std::size_t i = 0; i < gradient_shapes.size(); ++i) {
    const auto [rows, columns] = matrix_shape(gradient_shapes[i]);
    const std::int64_t rank = std::min({rows, columns, settings.rank});
    if (!worth_compressing(rows, columns, rank, settings.min_compression_rate)) {
      uncompressed_.push_back(i);
      continue;
    }
    const auto key = std::make_pair(rows, columns);
    if (!of_shape.count(key)) shapes.push_back(key);
    of_shape[key].push_back(i);
  }
  for (const auto& key : shapes) {
    for (std::size_t gradient : of_shape[key]) {
      const std::int64_t rank = std::min({key.first, key.second, settings.rank});
      compressed_.push_back({gradient, key.first, key.second, rank});
      p_numel_ += key.first * rank;
      q_numel_ += key.second * rank;
    }
  }
}

void PowerSgdBucket::begin(GradientBucket& bucket, const c10::intrusive_ptr<c10d::Backend>& group,
                           LegacyRandomState& random) {
  at::Tensor& flat = bucket.flat;
  // State read from a checkpoint arrives on the CPU.
  if (error.defined()) error = error.to(flat.device());
  if (q_memory.defined()) q_memory = q_memory.to(flat.device());
  if (settings_.error_feedback) {
    if (error.defined()) {
      flat.add_(error);
    } else {
      error = at::zeros({flat_numel_}, flat.options());
    }
    before_ = flat.clone();
  }
  // The uncompressed gradients travel first, while Q and P are computed; P in an all-reduce of
  // its own, as the hook's (one buffer for both would sum in another order on more than two
  // ranks).
  std::vector<at::Tensor> rest;
  for (std::size_t i : uncompressed_) rest.push_back(bucket.gradients[i].reshape({-1}));
  rest_ = rest.empty() ? at::empty({0}, flat.options()) : at::cat(rest);
  rest_work_ = all_reduce(group, rest_);
  p_memory_ = at::empty({p_numel_}, flat.options());

  const bool draw = !settings_.warm_start || !q_memory.defined();
  if (draw) q_memory = at::empty({q_numel_}, flat.options());
  matrices_.clear();
  ps_.clear();
  qs_.clear();
  std::int64_t p_offset = 0;
  std::int64_t q_offset = 0;
  for (const Matrix& matrix : compressed_) {
    matrices_.push_back(bucket.gradients[matrix.gradient].view({1, matrix.rows, matrix.columns}));
    ps_.push_back(p_memory_.narrow(0, p_offset, matrix.rows * matrix.rank)
                      .view({1, matrix.rows, matrix.rank}));
    qs_.push_back(q_memory.narrow(0, q_offset, matrix.columns * matrix.rank)
                      .view({1, matrix.columns, matrix.rank}));
    p_offset += matrix.rows * matrix.rank;
    q_offset += matrix.columns * matrix.rank;
  }
  if (draw) {
    // One seed per bucket drawn afresh, the same on every rank; values drawn on the CPU.
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(random.randint(kSeedBound));
    for (auto& q : qs_) {
      q.copy_(at::randn(q.sizes(), generator, at::TensorOptions().dtype(q.scalar_type())));
      orthogonalize(q, settings_.orthogonalization_epsilon);
    }
  } else {
    for (auto& q : qs_) orthogonalize(q, settings_.orthogonalization_epsilon);
  }
  for (std::size_t i = 0; i < matrices_.size(); ++i) at::bmm_out(ps_[i], matrices_[i], qs_[i]);
  p_work_ = all_reduce(group, p_memory_);
}

void PowerSgdBucket::end(GradientBucket& bucket, const c10::intrusive_ptr<c10d::Backend>& group) {
  const auto ranks = group->getSize();
  rest_work_->wait();
  rest_.div_(ranks);
  std::int64_t offset = 0;
  for (std::size_t i : uncompressed_) {
    at::Tensor& gradient = bucket.gradients[i];
    gradient.copy_(rest_.narrow(0, offset, gradient.numel()).view_as(gradient));
    offset += gradient.numel();
  }
  p_work_->wait();
  // P is orthogonalised, not averaged: only its span matters.
  for (auto& p : ps_) orthogonalize(p, settings_.orthogonalization_epsilon);
  for (std::size_t i = 0; i < matrices_.size(); ++i) {
    at::bmm_out(qs_[i], matrices_[i].transpose(1, 2), ps_[i]);
  }
  all_reduce(group, q_memory)->wait();
  q_memory.div_(ranks);
  for (std::size_t i = 0; i < matrices_.size(); ++i) {
    at::bmm_out(matrices_[i], ps_[i], qs_[i].transpose(1, 2));
  }
  if (settings_.error_feedback) error = before_.sub_(bucket.flat);
  if (!settings_.warm_start) q_memory = at::Tensor();
  rest_work_.reset();
  p_work_.reset();
  before_ = at::Tensor();
  rest_ = at::Tensor();
  p_memory_ = at::Tensor();
}

}  // namespace trainyard
