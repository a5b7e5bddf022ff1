#pragma once
// Open-addressing hash tables for the encoding hot path: strings to ids (vocabularies, the word
// cache) and id pairs to merges. Keys live in one arena; lookups take a string_view and
// allocate nothing.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard {

inline std::uint64_t hash_bytes(std::string_view key) {
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ULL;
  std::uint64_t h = 0x243F6A8885A308D3ULL ^ (key.size() * kMul);
  const char* p = key.data();
  std::size_t n = key.size();
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    std::uint64_t word = 0;
    std::memcpy(&word, p, n);
    h = (h ^ word) * kMul;
  }
  h ^= h >> 32;
  h *= kMul;
  return h ^ (h >> 29);
}

// String keys to a trivially copyable value; insert keeps the first value unless asked.
template <typename Value>
class StringTable {
 public:
  std::size_t size() const { return count_; }

  const Value* find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    const std::uint64_t h = hash_bytes(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.length == kEmpty) return nullptr;
      if (slot.hash == h && slot.length == key.size() &&
          std::memcmp(arena_.data() + slot.offset, key.data(), key.size()) == 0)
        return &slot.value;
    }
  }

  // Returns false (and leaves the table as it was) when the key is there and !replace.
  bool insert(std::string_view key, const Value& value, bool replace = false) {
    if ((count_ + 1) * 4 >= slots_.size() * 3) grow();
    const std::uint64_t h = hash_bytes(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.length == kEmpty) {
        slot = Slot{h, arena_.size(), static_cast<std::uint32_t>(key.size()), value};
        arena_.append(key);
        ++count_;
        return true;
      }
      if (slot.hash == h && slot.length == key.size() &&
          std::memcmp(arena_.data() + slot.offset, key.data(), key.size()) == 0) {
        if (replace) slot.value = value;
        return replace;
      }
    }
  }

  void clear() {
    slots_.clear();
    arena_.clear();
    count_ = 0;
    mask_ = 0;
  }
  std::size_t arena_bytes() const { return arena_.size(); }

 private:
  static constexpr std::uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    std::uint64_t hash = 0;
    std::size_t offset = 0;
    std::uint32_t length = kEmpty;
    Value value{};
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& slot : old) {
      if (slot.length == kEmpty) continue;
      std::size_t i = slot.hash & mask_;
      while (slots_[i].length != kEmpty) i = (i + 1) & mask_;
      slots_[i] = slot;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  std::size_t count_ = 0;
  std::size_t mask_ = 0;
};

// A merge of two adjacent tokens: its priority (lower first) and the token it makes.
struct MergeRule {
  std::uint32_t rank;
  std::uint32_t new_id;
};

// (left id, right id) -> MergeRule.
class MergeTable {
 public:
  const MergeRule* find(std::uint32_t left, std::uint32_t right) const {
    if (slots_.empty()) return nullptr;
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = spread(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key == key) return &slot.rule;
      if (slot.key == kEmpty) return nullptr;
    }
  }
  // A later rule for the same pair replaces the earlier one (as a Rust HashMap collect does).
  void insert_or_assign(std::uint32_t left, std::uint32_t right, MergeRule rule) {
    if ((count_ + 1) * 2 >= slots_.size()) grow();
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = spread(key) & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.key == key) {
        slot.rule = rule;
        return;
      }
      if (slot.key == kEmpty) {
        slot = Slot{key, rule};
        ++count_;
        return;
      }
    }
  }
  std::size_t size() const { return count_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  static std::uint64_t pack(std::uint32_t a, std::uint32_t b) {
    return (static_cast<std::uint64_t>(a) << 32) | b;
  }
  static std::uint64_t spread(std::uint64_t key) {
    key ^= key >> 31;
    key *= 0x9E3779B97F4A7C15ULL;
    return key ^ (key >> 29);
  }
  struct Slot {
    std::uint64_t key = kEmpty;
    MergeRule rule{};
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& slot : old) {
      if (slot.key == kEmpty) continue;
      std::size_t i = spread(slot.key) & mask_;
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = slot;
    }
  }
  std::vector<Slot> slots_;
  std::size_t count_ = 0;
  std::size_t mask_ = 0;
};

}  // namespace trainyard
