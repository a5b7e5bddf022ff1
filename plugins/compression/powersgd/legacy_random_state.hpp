#pragma once
// numpy's legacy RandomState (MT19937 seeded by init_genrand) and its randint(high) for
// 0 < high <= 2^32: the stream PyTorch's PowerSGDState draws each warm start's seed from, so
// that trainyard's PowerSGD starts every Q matrix from the same random values as PyTorch's hook.

#include <array>
#include <cstdint>

namespace trainyard {

class LegacyRandomState {
 public:
  static constexpr int kWords = 624;

  explicit LegacyRandomState(std::uint32_t seed) {
    words_[0] = seed;
    for (int i = 1; i < kWords; ++i) {
      const std::uint32_t previous = words_[static_cast<std::size_t>(i - 1)];
      words_[static_cast<std::size_t>(i)] =
          1812433253U * (previous ^ (previous >> 30)) + static_cast<std::uint32_t>(i);
    }
    position_ = kWords;
  }

  // A value in [0, high), by numpy's masked rejection: draws of the smallest all-ones mask
  // covering high - 1, until one falls in range.
  std::uint32_t randint(std::uint32_t high) {
    const std::uint32_t largest = high - 1;
    std::uint32_t mask = largest;
    for (int shift = 1; shift < 32; shift <<= 1) mask |= mask >> shift;
    std::uint32_t value = 0;
    do {
      value = next() & mask;
    } while (value > largest);
    return value;
  }

  // The generator's state, for checkpoints: the 624 words and the position in them.
  const std::array<std::uint32_t, kWords>& words() const { return words_; }
  int position() const { return position_; }
  void restore(const std::array<std::uint32_t, kWords>& words, int position) {
    words_ = words;
    position_ = position;
  }

 private:
  std::uint32_t next() {
    if (position_ >= kWords) twist();
    std::uint32_t y = words_[static_cast<std::size_t>(position_++)];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= y >> 18;
    return y;
  }

  void twist() {
    constexpr int kShift = 397;
    for (int i = 0; i < kWords; ++i) {
      const auto at = [&](int k) -> std::uint32_t& {
        return words_[static_cast<std::size_t>(k % kWords)];
      };
      const std::uint32_t y = (at(i) & 0x80000000U) | (at(i + 1) & 0x7fffffffU);
      at(i) = at(i + kShift) ^ (y >> 1) ^ ((y & 1U) ? 0x9908b0dfU : 0U);
    }
    position_ = 0;
  }

  std::array<std::uint32_t, kWords> words_{};
  int position_ = kWords;
};

}  // namespace trainyard
