#pragma once
// The reader of Hugging Face tokenizer.json files: byte-level BPE (GPT-2, Llama 3) and
// byte-fallback BPE (Llama 2, Mistral), as tokenizers encodes them. What it does not implement
// (another model type, normalizer, pre-tokenizer, decoder or post-processor, truncation,
// padding, BPE dropout, subword prefixes) is refused with one line naming the file and the
// component: `t.json: model type "WordPiece" is not supported (BPE is: byte-level BPE and
// byte-fallback BPE)`.

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer.hpp"

namespace trainyard {

// Throws std::runtime_error "<path>: <problem>" for a file that cannot be read, is not JSON,
// or holds what is not supported.
std::unique_ptr<Tokenizer> read_tokenizer_json(const std::filesystem::path& path);

// The same for JSON text; `name` stands for the file in messages.
std::unique_ptr<Tokenizer> parse_tokenizer_json(std::string_view text, const std::string& name);

}  // namespace trainyard
