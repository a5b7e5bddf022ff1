#pragma once
// A SentencePiece .model file through libsentencepiece: ids equal to Python sentencepiece's
// `encode(text)` (no BOS or EOS added: a .model has no post-processor; bos_id() says which
// id a caller may prepend) and its `decode(ids)`. Compiled into its own module, which
// sentencepiece_module.hpp loads when a .model file is opened (the reason is there).

#include <filesystem>
#include <memory>

#include "../tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace trainyard {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Throws std::runtime_error "<path>: <sentencepiece's message>" when the model does not load.
  explicit SentencePieceTokenizer(const std::filesystem::path& path);
  ~SentencePieceTokenizer() override;

  void encode_into(std::string_view text, SpecialTokens special,
                   std::vector<std::uint32_t>& ids) const override;
  // Control tokens (<s>, </s>) decode to nothing, whatever `skip` says, as in sentencepiece.
  std::string decode(std::span<const std::uint32_t> ids, SkipSpecial skip) const override;
  std::size_t vocab_size() const override;
  std::optional<std::uint32_t> bos_id() const override;
  std::optional<std::uint32_t> eos_id() const override;

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace trainyard
