#pragma once
// Which of a model's blocks one build holds: all of them, or the pipeline stage that
// BuildContext::blocks names. Models that build stages decide with it what to allocate and
// refuse the calls a stage cannot answer.

#include <cstdint>
#include <optional>
#include <string>

#include "trainyard/api/build_context.hpp"

namespace trainyard {

class BlockSelection {
 public:
  // `count` is the whole model's number of blocks; no range selects all of them. A range must
  // satisfy 0 <= begin <= end <= count (end -1: count); an empty one (begin == end) holds no
  // block. Anything else is an Error naming the range, the count and the model.
  BlockSelection(const std::optional<BlockRange>& range, std::int64_t count, std::string model);

  std::int64_t begin() const { return begin_; }
  std::int64_t end() const { return end_; }  // resolved: never -1
  std::int64_t count() const { return count_; }

  bool holds(std::int64_t block) const { return block >= begin_ && block < end_; }
  bool holds_first() const { return holds(0); }
  bool holds_last() const { return holds(count_ - 1); }
  bool whole() const { return begin_ == 0 && end_ == count_; }

  // Throw Error unless the build holds the first (last) block, naming `call` (such as
  // "input()") and the blocks held: a stage's input is its predecessor's output, and only the
  // last stage has the model's output.
  void require_first(const std::string& call) const;
  void require_last(const std::string& call) const;

 private:
  std::string describe_held() const;

  std::string model_;
  std::int64_t count_;
  std::int64_t begin_;
  std::int64_t end_;
};

}  // namespace trainyard
