// Reading recipes: TOML text into located values, `extends` chains, --set overrides, and the
// printed form. Validation against the declared options lives in recipe.cpp.

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

namespace fs = std::filesystem;

namespace {

SourceLocation location_of(const toml::node& node, const std::string& file) {
  const auto& source = node.source();
  return SourceLocation{file, static_cast<int>(source.begin.line),
                        static_cast<int>(source.begin.column)};
}

Value convert(const toml::node& node, const std::string& file);

std::shared_ptr<Table> convert_table(const toml::table& table, const std::string& file) {
  auto out = std::make_shared<Table>();
  out->where = location_of(table, file);
  // toml++ keeps keys sorted; a Table keeps them in the order they were written.
  struct Item {
    std::string key;
    SourceLocation key_where;
    const toml::node* node;
  };
  std::vector<Item> items;
  for (const auto& [key, node] : table) {
    SourceLocation key_where = location_of(node, file);
    if (key.source().begin.line > 0) {
      key_where = SourceLocation{file, static_cast<int>(key.source().begin.line),
                                 static_cast<int>(key.source().begin.column)};
    }
    items.push_back({std::string(key.str()), std::move(key_where), &node});
  }
  auto position = [](const toml::node* node) {
    return std::make_pair(node->source().begin.line, node->source().begin.column);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    return position(a.node) < position(b.node);
  });
  for (const auto& item : items) {
    out->set(item.key, convert(*item.node, file));
    out->set_key_where(item.key, item.key_where);
  }
  return out;
}

Value convert(const toml::node& node, const std::string& file) {
  SourceLocation where = location_of(node, file);
  if (auto* v = node.as_boolean()) return Value(v->get(), where);
  if (auto* v = node.as_integer()) return Value(static_cast<std::int64_t>(v->get()), where);
  if (auto* v = node.as_floating_point()) return Value(v->get(), where);
  if (auto* v = node.as_string()) return Value(v->get(), where);
  if (auto* v = node.as_array()) {
    Array items;
    for (const auto& item : *v) items.push_back(convert(item, file));
    return Value(std::move(items), where);
  }
  if (auto* v = node.as_table()) {
    return Value(std::shared_ptr<const Table>(convert_table(*v, file)), where);
  }
  throw Error(where.str() + ": dates and times are not recipe values");
}

std::shared_ptr<const Table> parse_with_toml(const std::string& text, const std::string& name) {
  try {
    toml::table table = toml::parse(text, name);
    return convert_table(table, name);
  } catch (const toml::parse_error& error) {
    const auto& begin = error.source().begin;
    SourceLocation where{name, static_cast<int>(begin.line), static_cast<int>(begin.column)};
    throw Error(where.str() + ": " + std::string(error.description()));
  }
}

// `overlay`'s values win; tables present in both are merged key by key.
std::shared_ptr<Table> merge(const Table& base, const Table& overlay) {
  auto out = std::make_shared<Table>(base);
  out->where = overlay.where;
  for (const auto& [key, value] : overlay.entries()) {
    const Value* existing = base.find(key);
    if (existing && existing->type() == ValueType::kTable && value.type() == ValueType::kTable) {
      out->set(key,
               Value(std::shared_ptr<const Table>(merge(existing->as_table(), value.as_table())),
                     value.where()));
    } else {
      out->set(key, value);
    }
    out->set_key_where(key, overlay.key_where(key));
  }
  return out;
}

std::string display(const fs::path& path) {
  std::error_code ec;
  fs::path relative = fs::relative(path, fs::current_path(), ec);
  if (!ec && !relative.empty() && relative.native().rfind("..", 0) != 0) return relative.string();
  return path.string();
}

// A recipe is a small text file. Anything else named as one (a device such as /dev/zero, a FIFO,
// a folder, a multi-megabyte file) is refused before reading, so a wrong path cannot make the
// reader consume memory without bound.
constexpr std::uintmax_t kMaxRecipeBytes = 1 << 20;

std::string read_recipe_text(const fs::path& file) {
  std::error_code ec;
  fs::file_status status = fs::status(file, ec);
  if (ec || !fs::exists(status)) throw Error("cannot read recipe " + display(file));
  if (!fs::is_regular_file(status)) {
    throw Error("recipe " + display(file) + " is not a regular file");
  }
  std::uintmax_t size = fs::file_size(file, ec);
  if (ec) throw Error("cannot read recipe " + display(file) + ": " + ec.message());
  if (size > kMaxRecipeBytes) {
    throw Error("recipe " + display(file) + " is " + std::to_string(size) +
                " bytes; a recipe is at most " + std::to_string(kMaxRecipeBytes) + " bytes");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read recipe " + display(file));
  std::string text(kMaxRecipeBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  // The size can change between the check and the read (a file being written).
  if (text.size() > kMaxRecipeBytes) {
    throw Error("recipe " + display(file) + " grew beyond " + std::to_string(kMaxRecipeBytes) +
                " bytes while being read");
  }
  return text;
}

std::shared_ptr<const Table> load_chain(const fs::path& file, std::vector<fs::path>& chain) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(file, ec);
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) {
    std::string cycle;
    for (const auto& item : chain) cycle += display(item) + " -> ";
    throw Error("extends cycle: " + cycle + display(canonical));
  }
  std::string name = display(file);
  std::shared_ptr<const Table> table = parse_with_toml(read_recipe_text(file), name);

  const Value* extends = table->find("extends");
  if (!extends) return table;
  if (extends->type() != ValueType::kString) {
    throw Error(extends->where().str() + ": extends must be a string (a recipe path)");
  }
  fs::path base_path = file.parent_path() / extends->as_string();
  if (!fs::exists(base_path)) {
    throw Error(extends->where().str() + ": extends names a missing recipe: " + display(base_path));
  }
  chain.push_back(canonical);
  std::shared_ptr<const Table> base = load_chain(base_path, chain);
  chain.pop_back();
  auto own = std::make_shared<Table>(*table);
  own->erase("extends");
  return merge(*base, *own);
}

// Sets a.b.c = value, creating tables on the way; without a value, removes a.b.c (a missing key
// is already removed).
std::shared_ptr<Table> set_path(const Table& table, const std::vector<std::string>& keys,
                                std::size_t index, const std::optional<Value>& value,
                                const SourceLocation& origin) {
  auto out = std::make_shared<Table>(table);
  const std::string& key = keys[index];
  if (index + 1 == keys.size()) {
    if (value) {
      out->set(key, *value);
      out->set_key_where(key, origin);
    } else {
      out->erase(key);
    }
    return out;
  }
  const Value* existing = table.find(key);
  if (!existing && !value) return out;
  Table inner;
  if (existing) {
    if (existing->type() != ValueType::kTable) {
      throw Error(origin.file + ": '" + key + "' is not a table (set at " +
                  existing->where().str() + ")");
    }
    inner = existing->as_table();
  } else {
    inner.where = origin;
  }
  out->set(key, Value(std::shared_ptr<const Table>(set_path(inner, keys, index + 1, value, origin)),
                      existing ? existing->where() : origin));
  return out;
}

// `--set section.key=!` removes the key; the string "!" itself is written quoted ("\"!\"").
constexpr const char* kRemoveValue = "!";

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points beyond
// U+10FFFF), as TOML requires of a recipe.
bool valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t length = lead < 0x80           ? 1
                         : (lead >> 5) == 0x6  ? 2
                         : (lead >> 4) == 0xE  ? 3
                         : (lead >> 3) == 0x1E ? 4
                                               : 0;
    if (length == 0 || i + length > text.size()) return false;
    std::uint32_t code = length == 1 ? lead : lead & (0x7F >> length);
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3F);
    }
    constexpr std::uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    i += length;
  }
  return true;
}

std::shared_ptr<const Table> apply_override(const std::shared_ptr<const Table>& root,
                                            const std::string& assignment) {
  // A value that is not UTF-8 would be printed (--print-config, the checkpoint's recipe) as TOML
  // that cannot be read back.
  if (!valid_utf8(assignment)) {
    std::string shown;
    for (char c : assignment) {
      const auto byte = static_cast<unsigned char>(c);
      if (byte >= 0x20 && byte < 0x7F) {
        shown += c;
      } else {
        constexpr char kHex[] = "0123456789ABCDEF";
        shown += std::string("\\x") + kHex[byte >> 4] + kHex[byte & 0xF];
      }
    }
    throw Error("--set " + shown + ": not valid UTF-8");
  }
  std::string origin = "--set " + assignment;
  auto equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw Error(origin + ": expected section.key=value");
  }
  std::string path = assignment.substr(0, equals);
  std::string text = assignment.substr(equals + 1);
  std::vector<std::string> keys;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) throw Error(origin + ": empty key in '" + path + "'");
    keys.push_back(std::move(key));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  SourceLocation where{origin, 0, 0};
  if (text == kRemoveValue) return set_path(*root, keys, 0, std::nullopt, where);
  Value value(text, where);
  std::optional<toml::table> parsed;
  try {
    parsed = toml::parse("value = " + text);
  } catch (const toml::parse_error&) {
    // Not TOML: a bare word such as cpu or adamw is taken as a string.
  }
  if (parsed) {
    // More than the one key: the text went on past the value ("1\nx = 2").
    if (parsed->size() != 1) throw Error(origin + ": expected one value after '='");
    value = convert(*parsed->get("value"), origin);
    value.set_where(where);
  }
  return set_path(*root, keys, 0, value, where);
}

// A key as TOML writes it: bare when it can be, quoted otherwise ("my sink", "a.b").
std::string key_text(const std::string& key) {
  bool bare = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  return bare ? key : Value(key).to_toml();
}

void print_table(std::ostringstream& out, const Table& table, const std::string& prefix) {
  std::vector<std::pair<std::string, const Table*>> children;
  for (const auto& [key, value] : table.entries()) {
    if (value.type() == ValueType::kTable) {
      children.emplace_back(key, &value.as_table());
    } else {
      out << key_text(key) << " = " << value.to_toml() << "\n";
    }
  }
  for (const auto& [key, child] : children) {
    std::string name = prefix.empty() ? key_text(key) : prefix + "." + key_text(key);
    bool has_scalars =
        std::any_of(child->entries().begin(), child->entries().end(),
                    [](const auto& e) { return e.second.type() != ValueType::kTable; });
    if (has_scalars || child->empty()) out << "\n[" << name << "]\n";
    print_table(out, *child, name);
  }
}
}  // namespace

std::shared_ptr<const Table> parse_toml(const std::string& text, const std::string& name) {
  return parse_with_toml(text, name);
}

Recipe load_recipe(const fs::path& file, const std::vector<std::string>& overrides) {
  if (!fs::exists(file)) throw Error("recipe not found: " + file.string());
  std::vector<fs::path> chain;
  std::shared_ptr<const Table> root = load_chain(file, chain);
  for (const auto& assignment : overrides) root = apply_override(root, assignment);
  return Recipe{root, file, {}};
}

std::string to_toml(const Table& root) {
  std::ostringstream out;
  print_table(out, root, "");
  return out.str();
}

}  // namespace trainyard
