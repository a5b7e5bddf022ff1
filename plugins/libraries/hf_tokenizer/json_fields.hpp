#pragma once
// Typed reads of tokenizer.json fields, each failure one line naming the field:
// `model.vocab must be an object`.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace trainyard::json_fields {

using Json = nlohmann::json;

[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error(message); }

// "where.key", or "key" at the top level (where is empty).
inline std::string at(const std::string& where, const char* key) {
  return where.empty() ? std::string(key) : where + "." + key;
}

inline const Json& required(const Json& object, const std::string& where, const char* key) {
  if (!object.is_object()) fail((where.empty() ? "the file" : where) + " must be an object");
  const auto found = object.find(key);
  if (found == object.end()) fail(at(where, key) + " is missing");
  return *found;
}

inline bool boolean(const Json& object, const std::string& where, const char* key,
                    std::optional<bool> fallback = std::nullopt) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) {
    if (fallback) return *fallback;
    fail(at(where, key) + " is missing");
  }
  if (!found->is_boolean()) fail(at(where, key) + " must be true or false");
  return found->get<bool>();
}

inline std::string string(const Json& object, const std::string& where, const char* key) {
  const Json& value = required(object, where, key);
  if (!value.is_string()) fail(at(where, key) + " must be a string");
  return value.get<std::string>();
}

inline std::optional<std::string> optional_string(const Json& object, const std::string& where,
                                                  const char* key) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return std::nullopt;
  if (!found->is_string()) fail(at(where, key) + " must be a string or null");
  return found->get<std::string>();
}

inline std::uint32_t id(const Json& value, const std::string& where) {
  if (!value.is_number_unsigned() || value.get<std::uint64_t>() > 0xFFFFFFFFull)
    fail(where + " must be a token id (an integer from 0)");
  return static_cast<std::uint32_t>(value.get<std::uint64_t>());
}

inline std::size_t count(const Json& object, const std::string& where, const char* key) {
  const Json& value = required(object, where, key);
  if (!value.is_number_unsigned()) fail(at(where, key) + " must be an integer from 0");
  return value.get<std::size_t>();
}

// The component's "type", for "<where> type \"X\" is not supported (...)" messages.
inline std::string type_of(const Json& object, const std::string& where) {
  return string(object, where, "type");
}

// `text` as a JSON string: quoted, with control characters escaped, so that a message naming
// it stays on one line.
inline std::string quoted(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace trainyard::json_fields
