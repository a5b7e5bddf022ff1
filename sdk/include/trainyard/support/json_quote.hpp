#pragma once
// Quoting strings for the JSON the runtime writes (metric lines, traces, safetensors headers),
// apart from the reader so that writers do not compile nlohmann::json's parser.

#include <string>
#include <string_view>

namespace trainyard {

// `value` as a JSON string literal, quotes included, control characters escaped. Throws Error
// when `value` is not valid UTF-8 (no strict reader would take the text back).
std::string json_quote(std::string_view value);

}  // namespace trainyard
