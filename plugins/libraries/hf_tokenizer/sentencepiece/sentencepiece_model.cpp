#include "sentencepiece_model.hpp"

#include <sentencepiece_processor.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <type_traits>

#include "../sentencepiece_module.hpp"
#include "../utf8.hpp"

namespace trainyard {

SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& path)
    : path_(path.string()), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  if (!std::ifstream(path, std::ios::binary))
    throw std::runtime_error(path_ + ": cannot read: " + std::strerror(errno));
  const auto status = processor_->Load(path_);
  if (status.code() == sentencepiece::util::StatusCode::kInternal) {
    // sentencepiece's message for bytes that do not parse names its own source line only.
    throw std::runtime_error(path_ +
                             ": not a SentencePiece model (a truncated file, or another kind)");
  }
  if (!status.ok()) throw std::runtime_error(path_ + ": " + status.ToString());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_into(std::string_view text, SpecialTokens,
                                         std::vector<std::uint32_t>& ids) const {
  utf8::require_valid(text, path_ + ": encode: the text");
  std::vector<int> pieces;
  const auto status = processor_->Encode(text, &pieces);
  if (!status.ok()) throw std::runtime_error(path_ + ": encode: " + status.ToString());
  ids.insert(ids.end(), pieces.begin(), pieces.end());
}

std::string SentencePieceTokenizer::decode(std::span<const std::uint32_t> ids, SkipSpecial) const {
  std::vector<int> pieces;
  const int size = processor_->GetPieceSize();
  for (const std::uint32_t id : ids)
    if (id < static_cast<std::uint32_t>(size)) pieces.push_back(static_cast<int>(id));
  std::string text;
  const auto status = processor_->Decode(pieces, &text);
  if (!status.ok()) throw std::runtime_error(path_ + ": decode: " + status.ToString());
  return text;
}

std::size_t SentencePieceTokenizer::vocab_size() const {
  return static_cast<std::size_t>(processor_->GetPieceSize());
}

std::optional<std::uint32_t> SentencePieceTokenizer::bos_id() const {
  const int id = processor_->bos_id();
  return id >= 0 ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(id)) : std::nullopt;
}

std::optional<std::uint32_t> SentencePieceTokenizer::eos_id() const {
  const int id = processor_->eos_id();
  return id >= 0 ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(id)) : std::nullopt;
}

}  // namespace trainyard

// The module's one entry point, found by name with dlsym; exceptions stay on this side.
extern "C" __attribute__((visibility("default"))) trainyard::Tokenizer*
trainyard_open_sentencepiece_model(const char* path, std::string* error) {
  try {
    return new trainyard::SentencePieceTokenizer(path);
  } catch (const std::exception& failure) {
    *error = failure.what();
    return nullptr;
  }
}

static_assert(std::is_same_v<decltype(&trainyard_open_sentencepiece_model),
                             trainyard::OpenSentencePieceModel>,
              "the entry point and its loader agree on the signature");
