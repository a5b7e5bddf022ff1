#include "tokenizer_json_components.hpp"

#include "utf8.hpp"

namespace trainyard::tokenizer_json {

using json_fields::fail;
using json_fields::Json;
using json_fields::quoted;

namespace {

[[noreturn]] void unsupported(const std::string& where, const std::string& type,
                              const char* supported) {
  fail(where + " type " + quoted(type) + " is not supported (" + supported + " are)");
}

std::unique_ptr<Regex> compile(const std::string& pattern, const std::string& where) {
  try {
    return std::make_unique<Regex>(pattern);
  } catch (const std::runtime_error& error) {
    fail(where + ": " + error.what());
  }
}

// {"String": "..."} or {"Regex": "..."}: a literal or an Oniguruma regex.
std::unique_ptr<Regex> read_pattern(const Json& object, const std::string& where,
                                    std::string* literal = nullptr) {
  const Json& pattern = json_fields::required(object, where, "pattern");
  const std::string at = where + ".pattern";
  if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String")) {
    const std::string text = json_fields::string(pattern, at, "String");
    if (text.empty()) fail(at + ".String is empty");
    if (literal) {
      *literal = text;
      return nullptr;
    }
    return compile(escape_regex(text), at);
  }
  if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex"))
    return compile(json_fields::string(pattern, at, "Regex"), at + ".Regex");
  fail(at + " must be {\"String\": ...} or {\"Regex\": ...}");
}

char32_t one_char(const Json& object, const std::string& where, const char* key) {
  const std::string text = json_fields::string(object, where, key);
  if (text.empty() || utf8::first_invalid(text) ||
      utf8::char_length(static_cast<unsigned char>(text[0])) != text.size())
    fail(where + "." + key + " must be one character");
  return utf8::decode_at(text, 0);
}

PrependScheme read_prepend_scheme(const Json& object, const std::string& where) {
  PrependScheme scheme = PrependScheme::always;
  if (const auto name = json_fields::optional_string(object, where, "prepend_scheme")) {
    if (*name == "always") {
      scheme = PrependScheme::always;
    } else if (*name == "first") {
      scheme = PrependScheme::first;
    } else if (*name == "never") {
      scheme = PrependScheme::never;
    } else {
      fail(where + ".prepend_scheme " + quoted(*name) + " is not one of always, first, never");
    }
  }
  if (!json_fields::boolean(object, where, "add_prefix_space", true)) {
    if (scheme != PrependScheme::never && object.contains("prepend_scheme"))
      fail(where + ": add_prefix_space false does not match prepend_scheme");
    scheme = PrependScheme::never;
  }
  return scheme;
}

SplitBehavior read_behavior(const Json& object, const std::string& where) {
  const std::string name = json_fields::string(object, where, "behavior");
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  fail(where + ".behavior " + quoted(name) + " is not a SplitDelimiterBehavior");
}

const Json& list(const Json& object, const std::string& where, const char* key) {
  const Json& items = json_fields::required(object, where, key);
  if (!items.is_array()) fail(where + "." + key + " must be a list");
  return items;
}

std::unique_ptr<PreTokenizer> read_one_pre_tokenizer(const Json& value, const std::string& where,
                                                     bool last, bool& byte_level) {
  const std::string type = json_fields::type_of(value, where);
  if (type == "ByteLevel") {
    if (!last) fail(where + ": ByteLevel must be the last pre-tokenizer");
    byte_level = true;
    return std::make_unique<ByteLevelPreTokenizer>(
        json_fields::boolean(value, where, "add_prefix_space", true),
        json_fields::boolean(value, where, "use_regex", true));
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(read_pattern(value, where),
                                               read_behavior(value, where),
                                               json_fields::boolean(value, where, "invert", false));
  }
  if (type == "Metaspace") {
    std::string replacement;
    utf8::append(replacement, one_char(value, where, "replacement"));
    return std::make_unique<MetaspacePreTokenizer>(
        replacement, read_prepend_scheme(value, where),
        json_fields::boolean(value, where, "split", true));
  }
  if (type == "Sequence") {
    const Json& items = list(value, where, "pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (std::size_t i = 0; i < items.size(); ++i) {
      steps.push_back(read_one_pre_tokenizer(items[i],
                                             where + ".pretokenizers[" + std::to_string(i) + "]",
                                             last && i + 1 == items.size(), byte_level));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  unsupported(where, type, "ByteLevel, Split, Metaspace and Sequence");
}

}  // namespace

std::unique_ptr<Normalizer> read_normalizer(const Json& value, const std::string& where) {
  if (value.is_null()) return nullptr;
  const std::string type = json_fields::type_of(value, where);
  if (type == "Prepend")
    return std::make_unique<PrependNormalizer>(json_fields::string(value, where, "prepend"));
  if (type == "Replace") {
    std::string literal;
    auto regex = read_pattern(value, where, &literal);
    std::string content = json_fields::string(value, where, "content");
    if (regex) return std::make_unique<ReplaceNormalizer>(std::move(regex), std::move(content));
    return std::make_unique<ReplaceNormalizer>(std::move(literal), std::move(content));
  }
  if (type == "Sequence") {
    const Json& items = list(value, where, "normalizers");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto step = read_normalizer(items[i], where + ".normalizers[" + std::to_string(i) + "]");
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  unsupported(where, type, "Prepend, Replace and Sequence");
}

std::unique_ptr<PreTokenizer> read_pre_tokenizer(const Json& value, const std::string& where,
                                                 bool& byte_level) {
  byte_level = false;
  if (value.is_null()) return nullptr;
  return read_one_pre_tokenizer(value, where, true, byte_level);
}

std::unique_ptr<Decoder> read_decoder(const Json& value, const std::string& where) {
  if (value.is_null()) return nullptr;
  const std::string type = json_fields::type_of(value, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") {
    std::string literal;
    auto regex = read_pattern(value, where, &literal);
    std::string content = json_fields::string(value, where, "content");
    if (regex) return std::make_unique<ReplaceDecoder>(std::move(regex), std::move(content));
    return std::make_unique<ReplaceDecoder>(std::move(literal), std::move(content));
  }
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(one_char(value, where, "content"),
                                          json_fields::count(value, where, "start"),
                                          json_fields::count(value, where, "stop"));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(one_char(value, where, "replacement"),
                                              read_prepend_scheme(value, where));
  }
  if (type == "Sequence") {
    const Json& items = list(value, where, "decoders");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (std::size_t i = 0; i < items.size(); ++i)
      steps.push_back(read_decoder(items[i], where + ".decoders[" + std::to_string(i) + "]"));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  unsupported(where, type, "ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace and Sequence");
}

namespace {

TemplateProcessing read_template(const Json& value, const std::string& where) {
  const Json& specials = json_fields::required(value, where, "special_tokens");
  const Json& single = list(value, where, "single");
  std::vector<TemplateProcessing::Item> items;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string at = where + ".single[" + std::to_string(i) + "]";
    const Json& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      const std::string name = json_fields::string(piece["Sequence"], at + ".Sequence", "id");
      if (name != "A") fail(at + ": the single template names $" + name + " (only $A is there)");
      items.push_back({true, {}});
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken"))
      fail(at + " must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    const std::string name = json_fields::string(piece["SpecialToken"], at + ".SpecialToken", "id");
    const std::string token_at = where + ".special_tokens[" + quoted(name) + "]";
    if (!specials.is_object() || !specials.contains(name))
      fail(at + ": special token " + quoted(name) + " is not in " + where + ".special_tokens");
    const Json& ids = list(specials[name], token_at, "ids");
    TemplateProcessing::Item item;
    for (std::size_t k = 0; k < ids.size(); ++k)
      item.ids.push_back(json_fields::id(ids[k], token_at + ".ids[" + std::to_string(k) + "]"));
    items.push_back(std::move(item));
  }
  return TemplateProcessing(std::move(items));
}

}  // namespace

TemplateProcessing read_post_processor(const Json& value, const std::string& where) {
  if (value.is_null()) return TemplateProcessing();
  const std::string type = json_fields::type_of(value, where);
  if (type == "ByteLevel") return TemplateProcessing();  // offsets only
  if (type == "TemplateProcessing") return read_template(value, where);
  if (type == "Sequence") {
    const Json& items = list(value, where, "processors");
    std::optional<TemplateProcessing> found;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::string at = where + ".processors[" + std::to_string(i) + "]";
      const std::string step = json_fields::type_of(items[i], at);
      if (step == "ByteLevel") continue;
      if (step != "TemplateProcessing") unsupported(at, step, "ByteLevel and TemplateProcessing");
      if (found) fail(at + ": a second TemplateProcessing is not supported");
      found = read_template(items[i], at);
    }
    return found ? *found : TemplateProcessing();
  }
  unsupported(where, type, "TemplateProcessing, ByteLevel and Sequence");
}

}  // namespace trainyard::tokenizer_json
