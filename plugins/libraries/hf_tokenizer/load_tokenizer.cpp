#include "load_tokenizer.hpp"

#include <stdexcept>

#include "sentencepiece_module.hpp"
#include "tokenizer_json.hpp"

namespace trainyard {

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path) {
  const std::string extension = path.extension().string();
  if (extension == ".json") return read_tokenizer_json(path);
  if (extension == ".model") return open_sentencepiece_model(path);
  throw std::runtime_error(path.string() +
                           ": not a tokenizer file (expected a tokenizer .json or a "
                           "SentencePiece .model)");
}

}  // namespace trainyard
