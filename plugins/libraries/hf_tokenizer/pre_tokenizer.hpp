#pragma once
// The tokenizer.json pre-tokenizers this library implements, which cut a piece of normalized
// text into words for the model: ByteLevel (GPT-2's regex, add_prefix_space), Split (a literal
// or regex, every delimiter behavior, invert), Metaspace and Sequence. The reader refuses the
// others.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "encode_scratch.hpp"
#include "function_ref.hpp"
#include "regex.hpp"

namespace trainyard {

// Receives each word; `at_start` when it begins at offset 0 of the original text (Metaspace's
// prepend_scheme "first" asks).
using PieceSink = FunctionRef<void(std::string_view piece, bool at_start)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Emits the non-empty words of `piece` in order.
  virtual void pre_tokenize(std::string_view piece, bool at_start, EncodeScratch& scratch,
                            PieceSink sink) const = 0;
};

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// GPT-2's pattern, as tokenizers' ByteLevel has it.
extern const char* const kGpt2Pattern;

// The byte alphabet itself is not applied: a ByteLevel model reads the raw bytes (see
// byte_level_bpe.hpp), so this only adds the prefix space and splits.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
  void pre_tokenize(std::string_view piece, bool at_start, EncodeScratch& scratch,
                    PieceSink sink) const override;

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null without use_regex
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, SplitBehavior behavior, bool invert);
  void pre_tokenize(std::string_view piece, bool at_start, EncodeScratch& scratch,
                    PieceSink sink) const override;

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

enum class PrependScheme { always, first, never };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme prepend, bool split);
  void pre_tokenize(std::string_view piece, bool at_start, EncodeScratch& scratch,
                    PieceSink sink) const override;

 private:
  std::string replacement_;
  PrependScheme prepend_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::string_view piece, bool at_start, EncodeScratch& scratch,
                    PieceSink sink) const override;

 private:
  void run(std::size_t step, std::string_view piece, bool at_start, EncodeScratch& scratch,
           PieceSink sink) const;
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// A literal as an Oniguruma pattern matching exactly it.
std::string escape_regex(std::string_view literal);

}  // namespace trainyard
