#pragma once
// Opens a tokenizer by its file: `*.json` as a Hugging Face tokenizer.json
// (tokenizer_json.hpp), `*.model` as SentencePiece (sentencepiece_module.hpp).

#include <filesystem>
#include <memory>

#include "tokenizer.hpp"

namespace trainyard {

// Throws std::runtime_error naming the file for another extension or a file that does not load.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

}  // namespace trainyard
