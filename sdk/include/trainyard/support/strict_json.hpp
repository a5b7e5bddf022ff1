#pragma once
// Reading JSON that arrives from files (metric lines, pipeline timelines, safetensors headers)
// with nlohmann::json, strictly: RFC 8259 text only, nesting bounded, a member name at most once
// per object, and every error one line naming the source and the byte offset. Writers quote
// strings with json_quote (json_quote.hpp).

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace trainyard {

constexpr int kDefaultJsonDepth = 64;

// Parses exactly one JSON value spanning `text` (surrounding whitespace allowed). Non-negative
// integers up to 2^64 - 1 read exactly as unsigned 64-bit numbers, negative ones as signed
// 64-bit, anything else as a double. Throws Error
// "<source>: invalid JSON at byte N: <reason>" (N counted from 0) for bad syntax, a byte order
// mark, invalid UTF-8, a number beyond a double's range, arrays and objects nested more than
// `max_depth` deep, or a name repeated within one object.
nlohmann::json parse_strict_json(std::string_view text, const std::string& source,
                                 int max_depth = kDefaultJsonDepth);

}  // namespace trainyard
