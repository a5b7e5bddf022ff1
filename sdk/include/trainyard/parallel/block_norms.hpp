#pragma once
// Gradient norms per block (run.grad_norm_blocks): which block of the whole model each parameter
// belongs to, and the sums of squares of held gradient pieces per block. A strategy reduces the
// per-block sums over the same groups, in the same way, as it reduces the total, so every
// strategy reports the same per-block norms as one process (sharded and tensor-parallel pieces
// counted once).

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "trainyard/api/model.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {

class ParameterBlocks {
 public:
  ParameterBlocks() = default;
  // The parameters of a whole-model build by their whole-model names (as parameter_layout names
  // them), in the blocks of model.block_names().
  explicit ParameterBlocks(Model& model);
  // Adds the parameters of a build (a pipeline stage's) named `whole_names[i]` in the whole
  // model: each belongs to the first block, in forward order, whose module holds its tensor; a
  // tied parameter (and its copies) to the first block that uses it, as one process counts it
  // once. Throws Error for a trainable parameter no block holds.
  void add(Model& model, const std::vector<at::Tensor>& parameters,
           const std::vector<std::string>& whole_names);

  const std::vector<std::string>& names() const { return names_; }
  std::int64_t count() const { return static_cast<std::int64_t>(names_.size()); }
  // The block of a whole-model parameter name; throws Error for a name it does not know.
  std::int64_t index(const std::string& parameter) const;

 private:
  std::int64_t block_index(const std::string& block) const;

  std::vector<std::string> names_;
  std::map<std::string, std::int64_t> block_of_;
};

// Sums of squares per block, float32 [2, blocks] on `device`: row 0 the pieces `is_split(i,
// piece)` holds for (tensor-parallel pieces, to be summed over the tp group), row 1 the others
// (counted once); without `is_split`, all in row 1.
// `gradients[i]` is held as `layouts[i]` says; undefined gradients are skipped, and so are pieces
// `skip` holds for (tied copies), when given.
at::Tensor block_squares(const std::vector<at::Tensor>& gradients,
                         const std::vector<HeldLayout>& layouts, const ParameterBlocks& blocks,
                         const std::function<bool(std::size_t, const ParameterPiece&)>& is_split,
                         const at::Device& device,
                         const std::function<bool(std::size_t)>& skip = {});

// The norms of summed squares [blocks], into `result` with the block names.
void set_block_norms(const at::Tensor& squares, const ParameterBlocks& blocks, StepResult& result);

}  // namespace trainyard
