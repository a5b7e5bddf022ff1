#include "trainyard/support/strict_json.hpp"

#include <cstddef>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

using Json = nlohmann::json;

constexpr std::size_t kShownChars = 160;  // errors quote at most this much of hostile input

std::string shortened(std::string text) {
  if (text.size() > kShownChars) {
    text.resize(kShownChars);
    text += "...";
  }
  return text;
}

// The reason in one of nlohmann's messages, without its "[json.exception...] parse error at
// line L, column C: " preamble (the caller names the byte offset instead).
std::string reason_of(const Json::exception& error) {
  std::string_view message = error.what();
  if (auto end = message.find("] "); end != std::string_view::npos) message.remove_prefix(end + 2);
  if (message.starts_with("parse error")) {
    if (auto colon = message.find(": "); colon != std::string_view::npos) {
      message.remove_prefix(colon + 2);
    }
  }
  return shortened(std::string(message));
}

// A pointer over the text that records how far the parser has read, so that errors the
// handler raises (nlohmann only reports positions of its own) can name a byte.
class CountingIterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator() = default;
  CountingIterator(const char* at, const char** furthest) : at_(at), furthest_(furthest) {}

  reference operator*() const { return *at_; }
  CountingIterator& operator++() {
    ++at_;
    if (furthest_ && at_ > *furthest_) *furthest_ = at_;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator before = *this;
    ++*this;
    return before;
  }
  bool operator==(const CountingIterator& other) const { return at_ == other.at_; }

 private:
  const char* at_ = nullptr;
  const char** furthest_ = nullptr;
};

// Builds the document from nlohmann's SAX events, refusing what its own DOM parser accepts:
// repeated member names (where nlohmann keeps the last) and unbounded nesting.
class StrictDocumentBuilder final : public Json::json_sax_t {
 public:
  explicit StrictDocumentBuilder(int max_depth) : max_depth_(max_depth) {}

  bool null() override { return add(nullptr) != nullptr; }
  bool boolean(bool value) override { return add(value) != nullptr; }
  bool number_integer(number_integer_t value) override { return add(value) != nullptr; }
  bool number_unsigned(number_unsigned_t value) override { return add(value) != nullptr; }
  bool number_float(number_float_t value, const string_t&) override {
    return add(value) != nullptr;
  }
  bool string(string_t& value) override { return add(std::move(value)) != nullptr; }
  bool binary(binary_t&) override { return refuse("binary data"); }

  bool start_object(std::size_t) override { return open(Json::value_t::object); }
  bool key(string_t& name) override {
    if (open_.back()->contains(name)) {
      return refuse("duplicate entry '" + shortened(name) + "' in an object");
    }
    key_ = std::move(name);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::value_t::array); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t position, const std::string&,
                   const Json::exception& error) override {
    // nlohmann counts the bytes read, the offending one included.
    error_offset_ = position > 0 ? position - 1 : 0;
    reason_ = reason_of(error);
    return false;
  }

  Json& document() { return document_; }
  const std::string& reason() const { return reason_; }
  // Where nlohmann failed, or nullopt when this handler refused (the caller knows how far the
  // parser had read).
  std::optional<std::size_t> error_offset() const { return error_offset_; }

 private:
  template <typename Value>
  Json* add(Value&& value) {
    if (open_.empty()) {
      document_ = Json(std::forward<Value>(value));
      return &document_;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(Json(std::forward<Value>(value)));
      return &parent.back();
    }
    Json& member = parent[key_];
    member = Json(std::forward<Value>(value));
    return &member;
  }

  bool open(Json::value_t type) {
    if (static_cast<int>(open_.size()) >= max_depth_) {
      return refuse("nested deeper than " + std::to_string(max_depth_));
    }
    open_.push_back(add(type));
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
  }

  bool refuse(std::string reason) {
    reason_ = std::move(reason);
    return false;
  }

  int max_depth_;
  Json document_;
  std::vector<Json*> open_;  // the arrays and objects being filled, innermost last
  std::string key_;          // the name of the next member of the innermost object
  std::string reason_;
  std::optional<std::size_t> error_offset_;
};

}  // namespace

Json parse_strict_json(std::string_view text, const std::string& source, int max_depth) {
  auto fail = [&](std::size_t offset, const std::string& reason) -> Error {
    return Error(source + ": invalid JSON at byte " + std::to_string(offset) + ": " + reason);
  };
  // nlohmann skips a UTF-8 byte order mark; RFC 8259 forbids one in JSON text.
  if (text.starts_with("\xEF\xBB\xBF")) throw fail(0, "byte order mark");
  StrictDocumentBuilder builder(max_depth);
  const char* furthest = text.data();
  const CountingIterator begin(text.data(), &furthest);
  const CountingIterator end(text.data() + text.size(), &furthest);
  if (!Json::sax_parse(begin, end, &builder)) {
    const auto read = static_cast<std::size_t>(furthest - text.data());
    // A refusal comes right after the byte that caused it: '{', '[' or a name's closing quote.
    throw fail(builder.error_offset().value_or(read > 0 ? read - 1 : 0), builder.reason());
  }
  return std::move(builder.document());
}

}  // namespace trainyard
