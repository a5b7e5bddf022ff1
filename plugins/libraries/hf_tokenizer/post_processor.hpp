#pragma once
// tokenizer.json's post_processor for one sequence: TemplateProcessing's `single` template
// (special tokens around $A, as Llama 3's "<|begin_of_text|> $A"), alone or in a Sequence
// with ByteLevel (which changes offsets only, never ids).

#include <cstdint>
#include <optional>
#include <vector>

namespace trainyard {

class TemplateProcessing {
 public:
  struct Item {
    bool sequence = false;           // $A
    std::vector<std::uint32_t> ids;  // a special token's ids otherwise
  };
  TemplateProcessing() : items_{Item{true, {}}} {}  // "$A": nothing added
  explicit TemplateProcessing(std::vector<Item> items) : items_(std::move(items)) {}

  // Appends the template to `out`, with `sequence` for each $A and the special tokens only
  // when `add_special`.
  void apply(const std::vector<std::uint32_t>& sequence, bool add_special,
             std::vector<std::uint32_t>& out) const;
  // Whether the template is "$A" alone (or no special token is to be added): the sequence as
  // it is.
  bool passes_through(bool add_special) const;

  // The special token right before the first $A and right after the last, if single ids.
  std::optional<std::uint32_t> leading() const;
  std::optional<std::uint32_t> trailing() const;

 private:
  std::vector<Item> items_;
};

}  // namespace trainyard
