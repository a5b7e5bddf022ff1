#pragma once
// The tokenizer.json normalizers this library implements: Prepend, Replace and Sequence of
// them (Llama 2's `Sequence[Prepend("▁"), Replace(" ", "▁")]`). The reader refuses the others.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "regex.hpp"

namespace trainyard {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` normalized into `out` (which the call overwrites).
  virtual void normalize(std::string_view text, std::string& out) const = 0;
};

// Prepends `prefix` to non-empty text.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string_view text, std::string& out) const override;

 private:
  std::string prefix_;
};

// Replaces every match of a literal or an (Oniguruma) regex with `content`.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::string content);
  ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string content);
  void normalize(std::string_view text, std::string& out) const override;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string_view text, std::string& out) const override;

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Replaces every occurrence of non-empty `from` in `text` with `to`, left to right.
void replace_all(std::string_view text, std::string_view from, std::string_view to,
                 std::string& out);

}  // namespace trainyard
