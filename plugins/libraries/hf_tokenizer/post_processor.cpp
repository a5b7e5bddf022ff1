#include "post_processor.hpp"

namespace trainyard {

bool TemplateProcessing::passes_through(bool add_special) const {
  std::size_t sequences = 0;
  for (const Item& item : items_) sequences += item.sequence ? 1 : 0;
  return sequences == 1 && (!add_special || items_.size() == 1);
}

void TemplateProcessing::apply(const std::vector<std::uint32_t>& sequence, bool add_special,
                               std::vector<std::uint32_t>& out) const {
  for (const Item& item : items_) {
    if (item.sequence) {
      out.insert(out.end(), sequence.begin(), sequence.end());
    } else if (add_special) {
      out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
  }
}

std::optional<std::uint32_t> TemplateProcessing::leading() const {
  if (items_.size() < 2 || items_[0].sequence || items_[0].ids.size() != 1) return std::nullopt;
  return items_[0].ids[0];
}

std::optional<std::uint32_t> TemplateProcessing::trailing() const {
  if (items_.size() < 2 || items_.back().sequence || items_.back().ids.size() != 1)
    return std::nullopt;
  return items_.back().ids[0];
}

}  // namespace trainyard
