#include "trainyard/parallel/block_selection.hpp"

#include <utility>

#include "trainyard/api/error.hpp"

namespace trainyard {

BlockSelection::BlockSelection(const std::optional<BlockRange>& range, std::int64_t count,
                               std::string model)
    : model_(std::move(model)), count_(count), begin_(0), end_(count) {
  if (!range) return;
  begin_ = range->begin;
  end_ = range->end == -1 ? count_ : range->end;
  if (begin_ < 0 || end_ < begin_ || end_ > count_) {
    throw Error("model '" + model_ + "' has " + std::to_string(count_) +
                " blocks; the block range [" + std::to_string(range->begin) + ", " +
                std::to_string(range->end) + ") does not fit (0 <= begin <= end <= " +
                std::to_string(count_) + ", end -1: to the last)");
  }
}

std::string BlockSelection::describe_held() const {
  return "this build holds blocks [" + std::to_string(begin_) + ", " + std::to_string(end_) +
         ") of " + std::to_string(count_);
}

void BlockSelection::require_first(const std::string& call) const {
  if (holds_first()) return;
  throw Error("model '" + model_ + "': " + call + " needs the first block, but " + describe_held() +
              " (a stage's input is the previous stage's output)");
}

void BlockSelection::require_last(const std::string& call) const {
  if (holds_last()) return;
  throw Error("model '" + model_ + "': " + call + " needs the last block, but " + describe_held() +
              " (only the last stage has the model's output)");
}

}  // namespace trainyard
