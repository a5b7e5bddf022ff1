#pragma once
// The tokenizer.json decoders this library implements, turning tokens back into text as
// tokenizers' decode_chain does: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and
// Sequence. The reader refuses the others.

#include <memory>
#include <string>
#include <vector>

#include "pre_tokenizer.hpp"
#include "regex.hpp"

namespace trainyard {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// The byte alphabet back to bytes, then UTF-8 with U+FFFD for what is ill-formed (one token).
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string literal, std::string content)
      : literal_(std::move(literal)), content_(std::move(content)) {}
  ReplaceDecoder(std::unique_ptr<Regex> regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

// Runs of <0xNN> tokens become their bytes when those are UTF-8, else one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};

// Removes up to `start` leading and `stop` trailing `content` characters from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, std::size_t start, std::size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override;

 private:
  char32_t content_;
  std::size_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, PrependScheme prepend)
      : replacement_(replacement), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>& tokens) const override;

 private:
  char32_t replacement_;
  PrependScheme prepend_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override;

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace trainyard
