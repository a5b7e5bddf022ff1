#include "tokenizer_json.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "byte_fallback_bpe.hpp"
#include "byte_level_bpe.hpp"
#include "json_tokenizer.hpp"
#include "tokenizer_json_components.hpp"

namespace trainyard {
namespace {

using json_fields::fail;
using json_fields::Json;
using json_fields::quoted;

std::vector<std::pair<std::string, std::string>> read_merges(const Json& merges) {
  if (!merges.is_array()) fail("model.merges must be a list");
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const Json& merge = merges[i];
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    if (merge.is_string()) {  // the legacy "a b" form
      const std::string text = merge.get<std::string>();
      const std::size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        fail(where + " " + quoted(text) + " is not two tokens separated by a space");
      out.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      out.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      fail(where + " must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  return out;
}

BpeOptions read_bpe_options(const Json& model) {
  const std::string type = json_fields::type_of(model, "model");
  if (type != "BPE")
    fail("model type " + quoted(type) +
         " is not supported (BPE is: byte-level BPE and byte-fallback BPE)");
  const auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0))
    fail("model.dropout is not supported (BPE dropout is random; set it to null)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto affix = json_fields::optional_string(model, "model", key);
    if (affix && !affix->empty())
      fail(std::string("model.") + key + " " + quoted(*affix) + " is not supported");
  }
  BpeOptions options;
  const Json& vocab = json_fields::required(model, "model", "vocab");
  if (!vocab.is_object()) fail("model.vocab must be an object of token: id");
  options.vocab.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items())
    options.vocab.emplace_back(token, json_fields::id(id, "model.vocab[" + quoted(token) + "]"));
  options.merges = read_merges(json_fields::required(model, "model", "merges"));
  options.unk_token = json_fields::optional_string(model, "model", "unk_token");
  options.fuse_unk = json_fields::boolean(model, "model", "fuse_unk", false);
  options.byte_fallback = json_fields::boolean(model, "model", "byte_fallback", false);
  options.ignore_merges = json_fields::boolean(model, "model", "ignore_merges", false);
  return options;
}

// tokenizers' add_tokens when it loads the file: a token the model knows keeps the model's id,
// others take ids from the model's vocab size up; a normalized token is matched (and decoded)
// as the normalizer writes it.
AddedVocabulary read_added_tokens(const Json& list, const BpeModel& model,
                                  const Normalizer* normalizer) {
  if (list.is_null()) return {};
  if (!list.is_array()) fail("added_tokens must be a list");
  std::vector<AddedToken> tokens;
  std::uint32_t next_id = static_cast<std::uint32_t>(model.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    const Json& entry = list[i];
    AddedToken token;
    token.content = json_fields::string(entry, where, "content");
    token.single_word = json_fields::boolean(entry, where, "single_word", false);
    token.lstrip = json_fields::boolean(entry, where, "lstrip", false);
    token.rstrip = json_fields::boolean(entry, where, "rstrip", false);
    token.special = json_fields::boolean(entry, where, "special", false);
    token.normalized = json_fields::boolean(entry, where, "normalized", !token.special);
    json_fields::id(json_fields::required(entry, where, "id"), where + ".id");
    if (token.content.empty()) continue;
    token.pattern = token.content;
    if (token.normalized && normalizer) normalizer->normalize(token.content, token.pattern);
    auto same = std::find_if(tokens.begin(), tokens.end(),
                             [&](const AddedToken& t) { return t.content == token.content; });
    if (same != tokens.end()) {
      token.id = same->id;
      *same = token;
      continue;
    }
    const auto known = model.token_to_id(token.content);
    token.id = known ? *known : next_id++;
    tokens.push_back(std::move(token));
  }
  return AddedVocabulary(std::move(tokens));
}

std::unique_ptr<Tokenizer> build(const Json& root, const std::string& name) {
  if (!root.is_object()) fail("the file must hold a JSON object");
  if (const auto version = json_fields::optional_string(root, "", "version");
      version && *version != "1.0")
    fail("version " + quoted(*version) + " is not supported (1.0 is)");
  for (const char* key : {"truncation", "padding"}) {
    if (root.contains(key) && !root[key].is_null())
      fail(std::string(key) + " is not supported (set it to null)");
  }
  JsonTokenizerParts parts;
  parts.path = name;
  const auto component = [&](const char* key) -> const Json& {
    static const Json null_value;
    return root.contains(key) ? root[key] : null_value;
  };
  parts.normalizer = tokenizer_json::read_normalizer(component("normalizer"), "normalizer");
  bool byte_level = false;
  parts.pre_tokenizer =
      tokenizer_json::read_pre_tokenizer(component("pre_tokenizer"), "pre_tokenizer", byte_level);
  const BpeOptions options = read_bpe_options(json_fields::required(root, "", "model"));
  if (byte_level) {
    parts.model = std::make_unique<ByteLevelBpe>(options);
  } else {
    parts.model = std::make_unique<ByteFallbackBpe>(options);
  }
  parts.added = read_added_tokens(component("added_tokens"), *parts.model, parts.normalizer.get());
  parts.post_processor =
      tokenizer_json::read_post_processor(component("post_processor"), "post_processor");
  parts.decoder = tokenizer_json::read_decoder(component("decoder"), "decoder");
  return std::make_unique<JsonTokenizer>(std::move(parts));
}

// "line:column" of the 1-based byte offset `byte` in `text`.
std::string line_and_column(std::string_view text, std::size_t byte) {
  const std::string_view before = text.substr(0, byte > 0 ? byte - 1 : 0);
  const auto newlines = std::count(before.begin(), before.end(), '\n');
  const std::size_t line_start = before.rfind('\n');
  const std::size_t column =
      before.size() - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
  return std::to_string(newlines + 1) + ":" + std::to_string(column);
}

// What is wrong with text that does not parse: empty, cut short (a partial download or copy
// ends before the JSON does), or malformed at a place, with nlohmann's reason without its
// "[json.exception...] parse error at line L, column C: " preamble.
std::string parse_problem(std::string_view text, const std::string& name,
                          const Json::parse_error& error) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return name + ": the file is empty (a tokenizer.json holds one JSON object)";
  if (error.byte > text.size()) {
    return name + ": the JSON ends before it is complete, at byte " + std::to_string(text.size()) +
           " (a truncated file?)";
  }
  std::string reason = error.what();
  if (const std::size_t column = reason.find("column "); column != std::string::npos) {
    if (const std::size_t colon = reason.find(": ", column); colon != std::string::npos)
      reason.erase(0, colon + 2);
  }
  return name + ":" + line_and_column(text, error.byte) + ": not valid JSON: " + reason;
}

// `message` with control characters escaped: an error is one line, whatever text it quotes.
std::string one_line(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02X", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> parse_tokenizer_json(std::string_view text, const std::string& name) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::parse_error& error) {
    throw std::runtime_error(one_line(parse_problem(text, name, error)));
  }
  try {
    return build(root, name);
  } catch (const std::runtime_error& error) {
    throw std::runtime_error(one_line(name + ": " + error.what()));
  } catch (const Json::exception& error) {
    throw std::runtime_error(one_line(name + ": " + error.what()));
  }
}

std::unique_ptr<Tokenizer> read_tokenizer_json(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error(path.string() + ": cannot read: " + std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  return parse_tokenizer_json(text.str(), path.string());
}

}  // namespace trainyard
