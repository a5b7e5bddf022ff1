#pragma once
// What flows from one block of a model to the next: a small bundle of named tensors.

#include <string>
#include <utility>

#include "trainyard/api/batch.hpp"

namespace trainyard {

// Every model passes its main stream as "hidden"; a block may add others (an attention mask,
// positions, a residual) that later blocks read. A pipeline sends the whole bundle from stage to
// stage, activation checkpointing recomputes it, and a block that does not know a tensor passes
// it on unchanged (with_hidden).
struct Activations {
  static constexpr const char* kHidden = "hidden";

  TensorMap tensors;

  Activations() = default;
  explicit Activations(torch::Tensor hidden) { tensors.emplace(kHidden, std::move(hidden)); }

  // The main stream. Throws Error when the bundle has none.
  const torch::Tensor& hidden() const;
  // This bundle with `hidden` as its main stream, every other tensor passed on.
  Activations with_hidden(torch::Tensor hidden) const;
};

}  // namespace trainyard
