#include "trainyard/json.hpp"

#include <cstdlib>

#include "trainyard/error.hpp"

namespace trainyard {

JsonValue JsonValue::boolean(bool value) {
  JsonValue out;
  out.type_ = Type::kBool;
  out.bool_ = value;
  return out;
}

JsonValue JsonValue::number(double value, std::string text) {
  JsonValue out;
  out.type_ = Type::kNumber;
  out.number_ = value;
  out.text_ = std::move(text);
  return out;
}

JsonValue JsonValue::string(std::string value) {
  JsonValue out;
  out.type_ = Type::kString;
  out.text_ = std::move(value);
  return out;
}

JsonValue JsonValue::array(Array items) {
  JsonValue out;
  out.type_ = Type::kArray;
  out.array_ = std::make_shared<const Array>(std::move(items));
  return out;
}

JsonValue JsonValue::object(Object members) {
  JsonValue out;
  out.type_ = Type::kObject;
  out.object_ = std::make_shared<const Object>(std::move(members));
  return out;
}

namespace {

const char* type_name(JsonValue::Type type) {
  switch (type) {
    case JsonValue::Type::kNull: return "null";
    case JsonValue::Type::kBool: return "a boolean";
    case JsonValue::Type::kNumber: return "a number";
    case JsonValue::Type::kString: return "a string";
    case JsonValue::Type::kArray: return "an array";
    case JsonValue::Type::kObject: return "an object";
  }
  return "?";
}

void expect_type(const JsonValue& value, JsonValue::Type type) {
  if (value.type() != type) {
    throw Error(std::string("JSON value is ") + type_name(value.type()) + ", expected " +
                type_name(type));
  }
}

class Parser {
 public:
  Parser(std::string_view text, const std::string& source, int max_depth)
      : text_(text), source_(source), max_depth_(max_depth) {}

  JsonValue parse_document() {
    skip_space();
    JsonValue value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const {
    throw Error(source_ + ": invalid JSON at byte " + std::to_string(pos_) + ": " + reason);
  }

  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void expect_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail("unexpected character");
    pos_ += word.size();
  }

  JsonValue parse_value(int depth) {
    if (depth > max_depth_) fail("nested deeper than " + std::to_string(max_depth_));
    if (pos_ >= text_.size()) fail("unexpected end");
    switch (text_[pos_]) {
      case '{': return parse_object(depth);
      case '[': return parse_array(depth);
      case '"': return JsonValue::string(parse_string());
      case 't': expect_literal("true"); return JsonValue::boolean(true);
      case 'f': expect_literal("false"); return JsonValue::boolean(false);
      case 'n': expect_literal("null"); return JsonValue();
      default: return parse_number();
    }
  }

  JsonValue parse_object(int depth) {
    ++pos_;
    JsonValue::Object members;
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return JsonValue::object(std::move(members));
    }
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a member name");
      std::string name = parse_string();
      skip_space();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      skip_space();
      members.emplace_back(std::move(name), parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return JsonValue::object(std::move(members));
      }
      fail("expected ',' or '}'");
    }
  }

  JsonValue parse_array(int depth) {
    ++pos_;
    JsonValue::Array items;
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return JsonValue::array(std::move(items));
    }
    while (true) {
      skip_space();
      items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return JsonValue::array(std::move(items));
      }
      fail("expected ',' or ']'");
    }
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') value |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') value |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') value |= static_cast<unsigned>(c - 'A' + 10);
      else fail("bad \\u escape");
    }
    return value;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = parse_hex4();
          if (code >= 0xD800 && code < 0xDC00) {
            if (text_.substr(pos_, 2) != "\\u") fail("unpaired surrogate");
            pos_ += 2;
            unsigned low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("unpaired surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code <= 0xDFFF) {
            fail("unpaired surrogate");
          }
          append_utf8(out, code);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  JsonValue parse_number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      std::size_t first = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ > first;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (!digits()) {
      fail("unexpected character");
    }
    if (peek() == '.') {
      ++pos_;
      if (!digits()) fail("bad number");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digits()) fail("bad number");
    }
    std::string spelling(text_.substr(start, pos_ - start));
    double value = std::strtod(spelling.c_str(), nullptr);
    return JsonValue::number(value, std::move(spelling));
  }

  std::string_view text_;
  const std::string& source_;
  int max_depth_;
  std::size_t pos_ = 0;
};

}  // namespace

bool JsonValue::as_bool() const {
  expect_type(*this, Type::kBool);
  return bool_;
}

double JsonValue::as_number() const {
  expect_type(*this, Type::kNumber);
  return number_;
}

const std::string& JsonValue::number_text() const {
  expect_type(*this, Type::kNumber);
  return text_;
}

const std::string& JsonValue::as_string() const {
  expect_type(*this, Type::kString);
  return text_;
}

const JsonValue::Array& JsonValue::as_array() const {
  expect_type(*this, Type::kArray);
  return *array_;
}

const JsonValue::Object& JsonValue::as_object() const {
  expect_type(*this, Type::kObject);
  return *object_;
}

const JsonValue* JsonValue::find(std::string_view name) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [key, value] : *object_) {
    if (key == name) return &value;
  }
  return nullptr;
}

JsonValue parse_json(std::string_view text, const std::string& source, int max_depth) {
  return Parser(text, source, max_depth).parse_document();
}

std::string json_quote(std::string_view value) {
  static const char* hex = "0123456789abcdef";
  std::string out = "\"";
  for (char c : value) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += hex[(c >> 4) & 0xF];
          out += hex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace trainyard
