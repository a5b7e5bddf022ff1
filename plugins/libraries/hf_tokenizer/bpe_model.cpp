#include "bpe_model.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace trainyard {
namespace {

constexpr std::uint32_t kNoMerge = std::numeric_limits<std::uint32_t>::max();
constexpr std::size_t kCachedWordBytes = 256;  // longer words are not cached (as HF)
constexpr std::size_t kCacheWords = 1 << 16;   // a full cache starts over
constexpr std::size_t kShortWord = 48;         // symbols merged by scanning, not a heap
constexpr std::uint32_t kMaxId = (1u << 26) - 1;

std::string quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

}  // namespace

const std::uint32_t* BpeScratch::find(std::string_view word, std::size_t& count) const {
  const Span* span = cache_.find(word);
  if (!span) return nullptr;
  count = span->count;
  return cached_ids_.data() + span->offset;
}

void BpeScratch::remember(std::string_view word, const std::uint32_t* ids, std::size_t count) {
  if (word.size() >= kCachedWordBytes) return;
  if (cache_.size() >= kCacheWords) {
    cache_.clear();
    cached_ids_.clear();
  }
  const Span span{static_cast<std::uint32_t>(cached_ids_.size()),
                  static_cast<std::uint32_t>(count)};
  if (cache_.insert(word, span)) cached_ids_.insert(cached_ids_.end(), ids, ids + count);
}

BpeModel::BpeModel(const BpeOptions& options)
    : fuse_unk_(options.fuse_unk),
      byte_fallback_(options.byte_fallback),
      ignore_merges_(options.ignore_merges) {
  std::uint32_t max_id = 0;
  for (const auto& [token, id] : options.vocab) {
    if (id > kMaxId) throw std::runtime_error("vocab id " + std::to_string(id) + " is too large");
    vocab_.insert(token, id, true);
    max_id = std::max(max_id, id);
  }
  tokens_.resize(options.vocab.empty() ? 0 : max_id + 1);
  present_.resize(tokens_.size(), false);
  for (const auto& [token, id] : options.vocab) {
    if (*vocab_.find(token) != id) continue;  // a repeated key: the last one counts
    tokens_[id] = token;
    present_[id] = true;
  }
  std::string joined;
  for (std::size_t rank = 0; rank < options.merges.size(); ++rank) {
    const auto& [left, right] = options.merges[rank];
    const auto missing = [&](std::string_view token) {
      return std::runtime_error("merge " + std::to_string(rank) + " " + quoted(left + " " + right) +
                                ": token " + quoted(token) + " is not in the vocab");
    };
    const std::uint32_t* left_id = vocab_.find(left);
    if (!left_id) throw missing(left);
    const std::uint32_t* right_id = vocab_.find(right);
    if (!right_id) throw missing(right);
    joined.assign(left).append(right);
    const std::uint32_t* new_id = vocab_.find(joined);
    if (!new_id) throw missing(joined);
    merges_.insert_or_assign(*left_id, *right_id,
                             MergeRule{static_cast<std::uint32_t>(rank), *new_id});
  }
  if (options.unk_token) {
    const std::uint32_t* unk = vocab_.find(*options.unk_token);
    if (!unk)
      throw std::runtime_error("unk_token " + quoted(*options.unk_token) + " is not in the vocab");
    unk_id_ = *unk;
  }
}

const std::string* BpeModel::token(std::uint32_t id) const {
  return id < tokens_.size() && present_[id] ? &tokens_[id] : nullptr;
}

std::optional<std::uint32_t> BpeModel::token_to_id(std::string_view token) const {
  const std::uint32_t* id = vocab_.find(token);
  return id ? std::optional<std::uint32_t>(*id) : std::nullopt;
}

void BpeModel::unknown(std::vector<std::uint32_t>& symbols, bool& pending) const {
  if (!unk_id_) return;
  if (!pending) {
    pending = true;
  } else if (!fuse_unk_) {
    symbols.push_back(*unk_id_);
  }
}

void BpeModel::flush_unknown(std::vector<std::uint32_t>& symbols, bool& pending) const {
  if (pending) symbols.push_back(*unk_id_);
  pending = false;
}

void BpeModel::encode_word(std::string_view word, BpeScratch& scratch,
                           std::vector<std::uint32_t>& out) const {
  if (ignore_merges_) {
    if (const auto id = whole_word(word)) {
      out.push_back(*id);
      return;
    }
  }
  std::size_t count = 0;
  if (const std::uint32_t* cached = scratch.find(word, count)) {
    out.insert(out.end(), cached, cached + count);
    return;
  }
  scratch.symbols.clear();
  initial_symbols(word, scratch.symbols);
  merge(scratch);
  scratch.remember(word, scratch.symbols.data(), scratch.symbols.size());
  out.insert(out.end(), scratch.symbols.begin(), scratch.symbols.end());
}

void BpeModel::merge(BpeScratch& scratch) const {
  if (scratch.symbols.size() < 2 || merges_.size() == 0) return;
  if (scratch.symbols.size() <= kShortWord) {
    merge_short(scratch);
  } else {
    merge_long(scratch);
  }
}

// Rank of every adjacent pair kept beside the symbols; each step merges the first lowest.
void BpeModel::merge_short(BpeScratch& scratch) const {
  auto& symbols = scratch.symbols;
  auto& ranks = scratch.ranks;
  auto& made = scratch.made;
  const auto rate = [&](std::size_t i) {
    const MergeRule* rule = merges_.find(symbols[i], symbols[i + 1]);
    ranks[i] = rule ? rule->rank : kNoMerge;
    made[i] = rule ? rule->new_id : 0;
  };
  ranks.resize(symbols.size() - 1);
  made.resize(symbols.size() - 1);
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) rate(i);
  while (!ranks.empty()) {
    const auto lowest = std::min_element(ranks.begin(), ranks.end());
    if (*lowest == kNoMerge) break;
    const std::size_t i = static_cast<std::size_t>(lowest - ranks.begin());
    symbols[i] = made[i];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(i));
    made.erase(made.begin() + static_cast<std::ptrdiff_t>(i));
    if (i < ranks.size()) rate(i);
    if (i > 0) rate(i - 1);
  }
}

// HF's Word::merge_all: a min-heap of (rank, position) over a linked list of symbols, stale
// entries skipped when popped.
void BpeModel::merge_long(BpeScratch& scratch) const {
  auto& symbols = scratch.symbols;
  auto& prev = scratch.prev;
  auto& next = scratch.next;
  auto& heap = scratch.heap;
  const std::uint32_t n = static_cast<std::uint32_t>(symbols.size());
  constexpr std::uint32_t kNone = kNoMerge;
  prev.resize(n);
  next.resize(n);
  heap.clear();
  const auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  const auto push = [&](std::uint32_t pos, std::uint32_t right) {
    if (const MergeRule* rule = merges_.find(symbols[pos], symbols[right])) {
      heap.push_back({rule->rank, pos, rule->new_id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (std::uint32_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }
  for (std::uint32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  auto& removed = scratch.removed;
  removed.assign(n, 0);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    if (removed[top.pos] || next[top.pos] == kNone) continue;
    const std::uint32_t right = next[top.pos];
    const MergeRule* rule = merges_.find(symbols[top.pos], symbols[right]);
    if (!rule || rule->new_id != top.new_id) continue;  // stale
    symbols[top.pos] = top.new_id;
    removed[right] = 1;
    next[top.pos] = next[right];
    if (next[right] != kNone) prev[next[right]] = top.pos;
    if (prev[top.pos] != kNone) push(prev[top.pos], top.pos);
    if (next[top.pos] != kNone) push(top.pos, next[top.pos]);
  }
  std::uint32_t kept = 0;
  for (std::uint32_t i = 0; i < n; ++i)
    if (!removed[i]) symbols[kept++] = symbols[i];
  symbols.resize(kept);
}

}  // namespace trainyard
