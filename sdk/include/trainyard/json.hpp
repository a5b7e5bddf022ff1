#pragma once
// A small JSON reader and string quoting, for the formats the runtime reads and writes (metric
// lines, safetensors headers, reports). Strict (RFC 8259), bounded in depth, and every error
// names the source and the byte offset.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainyard {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<JsonValue>;
  // Members in written order; duplicate names are kept so readers that must refuse them can.
  using Object = std::vector<std::pair<std::string, JsonValue>>;

  JsonValue() = default;
  static JsonValue boolean(bool value);
  static JsonValue number(double value, std::string text);
  static JsonValue string(std::string value);
  static JsonValue array(Array items);
  static JsonValue object(Object members);

  Type type() const { return type_; }
  bool is(Type type) const { return type_ == type; }
  bool as_bool() const;
  double as_number() const;
  // The number exactly as written (integers beyond 2^53 survive here, not in as_number()).
  const std::string& number_text() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;
  // The first member called `name`, or null when absent (or when this is not an object).
  const JsonValue* find(std::string_view name) const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0;
  std::string text_;  // string value, or the number's spelling
  std::shared_ptr<const Array> array_;
  std::shared_ptr<const Object> object_;
};

// Parses exactly one JSON value spanning `text` (surrounding whitespace allowed). Throws Error
// "<source>: invalid JSON at byte N: <reason>".
JsonValue parse_json(std::string_view text, const std::string& source, int max_depth = 64);

// `value` as a JSON string literal, quotes included, control characters escaped.
std::string json_quote(std::string_view value);

}  // namespace trainyard
