#pragma once
// Readers of tokenizer.json's normalizer, pre_tokenizer, decoder and post_processor objects
// (tokenizer_json.cpp reads the rest). Each refuses what it does not implement with one line
// naming the component and what is supported.

#include <memory>

#include "decoder.hpp"
#include "json_fields.hpp"
#include "normalizer.hpp"
#include "post_processor.hpp"
#include "pre_tokenizer.hpp"

namespace trainyard::tokenizer_json {

std::unique_ptr<Normalizer> read_normalizer(const json_fields::Json& value,
                                            const std::string& where);
// `byte_level` is set when the pre-tokenizer ends with ByteLevel (the model then reads bytes).
std::unique_ptr<PreTokenizer> read_pre_tokenizer(const json_fields::Json& value,
                                                 const std::string& where, bool& byte_level);
std::unique_ptr<Decoder> read_decoder(const json_fields::Json& value, const std::string& where);
TemplateProcessing read_post_processor(const json_fields::Json& value, const std::string& where);

}  // namespace trainyard::tokenizer_json
