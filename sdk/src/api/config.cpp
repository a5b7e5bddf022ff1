#include "trainyard/api/config.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>

namespace trainyard {

std::string SourceLocation::str() const {
  if (file.empty()) return "<recipe>";
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

const char* to_string(ValueType type) {
  switch (type) {
    case ValueType::kBool: return "boolean";
    case ValueType::kInteger: return "integer";
    case ValueType::kFloat: return "float";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kTable: return "table";
  }
  return "?";
}

const char* to_string(OptionType type) {
  switch (type) {
    case OptionType::kBool: return "boolean";
    case OptionType::kInteger: return "integer";
    case OptionType::kFloat: return "float";
    case OptionType::kString: return "string";
    case OptionType::kIntegerList: return "array of integers";
    case OptionType::kFloatList: return "array of floats";
    case OptionType::kStringList: return "array of strings";
    case OptionType::kTable: return "table";
  }
  return "?";
}

std::string with_article(const char* type_name) {
  const std::string name = type_name;
  const bool vowel = !name.empty() && std::string("aeiou").find(name[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + name;
}

Value::Value(bool v, SourceLocation where) : data_(v), where_(std::move(where)) {}
Value::Value(std::int64_t v, SourceLocation where) : data_(v), where_(std::move(where)) {}
Value::Value(double v, SourceLocation where) : data_(v), where_(std::move(where)) {}
Value::Value(std::string v, SourceLocation where) : data_(std::move(v)), where_(std::move(where)) {}
Value::Value(Array v, SourceLocation where) : data_(std::move(v)), where_(std::move(where)) {}
Value::Value(std::shared_ptr<const Table> v, SourceLocation where)
    : data_(std::move(v)), where_(std::move(where)) {}

ValueType Value::type() const {
  switch (data_.index()) {
    case 1: return ValueType::kBool;
    case 2: return ValueType::kInteger;
    case 3: return ValueType::kFloat;
    case 4: return ValueType::kString;
    case 5: return ValueType::kArray;
    case 6: return ValueType::kTable;
    default: throw Error("use of an empty recipe value");
  }
}

double Value::as_float() const {
  if (auto* i = std::get_if<std::int64_t>(&data_)) return static_cast<double>(*i);
  return std::get<double>(data_);
}

namespace {

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        // TOML forbids raw control characters in strings, DEL included.
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          std::ostringstream hex;
          hex << "\\u" << std::hex << std::setw(4) << std::setfill('0') << int(c);
          out += hex.str();
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

bool is_bare_key(const std::string& key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

std::string key_text(const std::string& key) { return is_bare_key(key) ? key : quote(key); }

std::string format_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream out;
  out << std::setprecision(17) << v;
  std::string text = out.str();
  // Shortest text that reads back to the same double.
  for (int precision = 1; precision <= 17; ++precision) {
    std::ostringstream candidate;
    candidate << std::setprecision(precision) << v;
    if (std::stod(candidate.str()) == v) {
      text = candidate.str();
      break;
    }
  }
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

}  // namespace

std::string Value::to_toml() const {
  switch (type()) {
    case ValueType::kBool: return as_bool() ? "true" : "false";
    case ValueType::kInteger: return std::to_string(as_integer());
    case ValueType::kFloat: return format_float(std::get<double>(data_));
    case ValueType::kString: return quote(as_string());
    case ValueType::kArray: {
      std::string out = "[";
      bool first = true;
      for (const auto& item : as_array()) {
        if (!first) out += ", ";
        out += item.to_toml();
        first = false;
      }
      return out + "]";
    }
    case ValueType::kTable: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : as_table().entries()) {
        if (!first) out += ",";
        out += ' ';
        out += key_text(key);
        out += " = ";
        out += item.to_toml();
        first = false;
      }
      return out + (first ? "}" : " }");
    }
  }
  return {};
}

bool Value::operator==(const Value& other) const {
  if (type() != other.type()) return false;
  switch (type()) {
    case ValueType::kTable: {
      const auto& a = as_table().entries();
      const auto& b = other.as_table().entries();
      if (a.size() != b.size()) return false;
      for (const auto& [key, value] : a) {
        const Value* match = other.as_table().find(key);
        if (!match || !(*match == value)) return false;
      }
      return true;
    }
    case ValueType::kArray: return as_array() == other.as_array();
    default: return data_ == other.data_;
  }
}

const Value* Table::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

const Value& Table::at(const std::string& key) const {
  const Value* value = find(key);
  if (!value) throw Error(where.str() + ": missing key '" + key + "'");
  return *value;
}

void Table::set(const std::string& key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_[key] = entries_.size();
  entries_.emplace_back(key, std::move(value));
}

SourceLocation Table::key_where(const std::string& key) const {
  if (auto it = key_locations_.find(key); it != key_locations_.end()) return it->second;
  const Value* value = find(key);
  return value ? value->where() : where;
}

void Table::set_key_where(const std::string& key, SourceLocation where) {
  key_locations_[key] = std::move(where);
}

bool Table::erase(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  key_locations_.erase(key);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (std::size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].first] = i;
  return true;
}

namespace {
OptionSpec make_option(std::string name, OptionType type, Value value, std::string help) {
  OptionSpec spec;
  spec.name = std::move(name);
  spec.type = type;
  spec.default_value = std::move(value);
  spec.help = std::move(help);
  return spec;
}
Array to_array(const auto& items) {
  Array out;
  for (const auto& item : items) out.emplace_back(item);
  return out;
}
}  // namespace

OptionSpec option(std::string name, bool v, std::string help) {
  return make_option(std::move(name), OptionType::kBool, Value(v), std::move(help));
}
OptionSpec option(std::string name, std::int64_t v, std::string help) {
  return make_option(std::move(name), OptionType::kInteger, Value(v), std::move(help));
}
OptionSpec option(std::string name, int v, std::string help) {
  return option(std::move(name), static_cast<std::int64_t>(v), std::move(help));
}
OptionSpec option(std::string name, double v, std::string help) {
  return make_option(std::move(name), OptionType::kFloat, Value(v), std::move(help));
}
OptionSpec option(std::string name, const char* v, std::string help) {
  return make_option(std::move(name), OptionType::kString, Value(v), std::move(help));
}
OptionSpec option(std::string name, std::vector<std::int64_t> v, std::string help) {
  return make_option(std::move(name), OptionType::kIntegerList, Value(to_array(v)),
                     std::move(help));
}
OptionSpec option(std::string name, std::vector<double> v, std::string help) {
  return make_option(std::move(name), OptionType::kFloatList, Value(to_array(v)),
                     std::move(help));
}
OptionSpec option(std::string name, std::vector<std::string> v, std::string help) {
  return make_option(std::move(name), OptionType::kStringList, Value(to_array(v)),
                     std::move(help));
}

OptionSpec table_option(std::string name, std::string help) {
  OptionSpec spec;
  spec.name = std::move(name);
  spec.type = OptionType::kTable;
  spec.default_value = Value(std::make_shared<const Table>());
  spec.help = std::move(help);
  return spec;
}
OptionSpec required_option(std::string name, OptionType type, std::string help) {
  OptionSpec spec;
  spec.name = std::move(name);
  spec.type = type;
  spec.help = std::move(help);
  return spec;
}

OptionSpec& OptionSpec::at_least(double bound) {
  minimum = bound;
  minimum_exclusive = false;
  return *this;
}

OptionSpec& OptionSpec::at_most(double bound) {
  maximum = bound;
  maximum_exclusive = false;
  return *this;
}

OptionSpec& OptionSpec::greater_than(double bound) {
  minimum = bound;
  minimum_exclusive = true;
  return *this;
}

OptionSpec& OptionSpec::less_than(double bound) {
  maximum = bound;
  maximum_exclusive = true;
  return *this;
}

OptionSpec& OptionSpec::one_of(std::vector<std::string> allowed) {
  choices = std::move(allowed);
  return *this;
}

OptionSpec& OptionSpec::or_exactly(std::int64_t value, std::string meaning) {
  sentinel = value;
  sentinel_meaning = std::move(meaning);
  return *this;
}

namespace {

// Bounds as a reader writes them: 1, not 1.0; 0.5 and 1e-08 as such.
std::string bound_text(double bound) {
  if (std::nearbyint(bound) == bound && std::abs(bound) < 1e15) {
    return std::to_string(static_cast<long long>(bound));
  }
  std::ostringstream out;
  out << bound;
  return out.str();
}

// ">= 0 and < 1, or -1 for automatic"; empty without bounds.
std::string range_text(const OptionSpec& spec) {
  std::string rule;
  if (spec.minimum) rule += (spec.minimum_exclusive ? "> " : ">= ") + bound_text(*spec.minimum);
  if (spec.minimum && spec.maximum) rule += " and ";
  if (spec.maximum) rule += (spec.maximum_exclusive ? "< " : "<= ") + bound_text(*spec.maximum);
  if (spec.sentinel && !rule.empty()) {
    rule += ", or " + std::to_string(*spec.sentinel) + " " + spec.sentinel_meaning;
  }
  return rule;
}

// "auto, bar or lines".
std::string choices_text(const OptionSpec& spec) {
  std::string allowed;
  for (std::size_t i = 0; i < spec.choices.size(); ++i) {
    allowed += (i == 0 ? "" : i + 1 == spec.choices.size() ? " or " : ", ") +
               (spec.choices[i].empty() ? std::string("\"\"") : spec.choices[i]);
  }
  return allowed;
}

std::optional<std::string> number_violation(const OptionSpec& spec, const Value& item) {
  if (spec.sentinel && item.type() == ValueType::kInteger && item.as_integer() == *spec.sentinel) {
    return std::nullopt;
  }
  const double number = item.as_float();
  const bool below = spec.minimum && !(spec.minimum_exclusive ? number > *spec.minimum
                                                              : number >= *spec.minimum);
  const bool above = spec.maximum && !(spec.maximum_exclusive ? number < *spec.maximum
                                                              : number <= *spec.maximum);
  if (!below && !above) return std::nullopt;
  return "must be " + range_text(spec) + ", got " + item.to_toml();
}

std::optional<std::string> choice_violation(const OptionSpec& spec, const Value& item) {
  if (spec.choices.empty() ||
      std::find(spec.choices.begin(), spec.choices.end(), item.as_string()) != spec.choices.end()) {
    return std::nullopt;
  }
  return "must be " + choices_text(spec) + ", got " + item.to_toml();
}

}  // namespace

std::string OptionSpec::rule() const {
  std::string range = range_text(*this);
  std::string allowed = choices_text(*this);
  if (!range.empty() && !allowed.empty()) return range + "; " + allowed;
  return range.empty() ? allowed : range;
}

std::optional<std::string> OptionSpec::violation(const Value& value) const {
  auto check = [&](const Value& item) -> std::optional<std::string> {
    switch (item.type()) {
      case ValueType::kInteger:
      case ValueType::kFloat: return number_violation(*this, item);
      case ValueType::kString: return choice_violation(*this, item);
      default: return std::nullopt;
    }
  };
  if (value.type() != ValueType::kArray) return check(value);
  for (const Value& item : value.as_array()) {
    if (auto broken = check(item)) return broken;
  }
  return std::nullopt;
}

Config::Config() : table_(std::make_shared<Table>()) {}
Config::Config(std::shared_ptr<const Table> table, std::string section_name)
    : table_(table ? std::move(table) : std::make_shared<Table>()),
      name_(std::move(section_name)) {}

std::string Config::qualified(const std::string& key) const {
  return name_.empty() ? key : name_ + "." + key;
}

bool Config::has(const std::string& key) const { return table_->contains(key); }

const Value& Config::value(const std::string& key) const {
  const Value* v = table_->find(key);
  if (!v) throw Error(table_->where.str() + ": missing option '" + qualified(key) + "'");
  return *v;
}

void Config::fail(const std::string& key, const std::string& message) const {
  const Value* v = table_->find(key);
  const SourceLocation& where = v ? v->where() : table_->where;
  throw Error(where.str() + ": " + qualified(key) + " " + message);
}

namespace {
void expect(const Config& config, const std::string& key, OptionType type) {
  if (!value_matches(config.value(key), type)) {
    config.fail(key, "must be " + with_article(to_string(type)) + ", got " +
                         with_article(to_string(config.value(key).type())));
  }
}
}  // namespace

bool Config::get_bool(const std::string& key) const {
  expect(*this, key, OptionType::kBool);
  return value(key).as_bool();
}
std::int64_t Config::get_int(const std::string& key) const {
  expect(*this, key, OptionType::kInteger);
  return value(key).as_integer();
}
double Config::get_float(const std::string& key) const {
  expect(*this, key, OptionType::kFloat);
  return value(key).as_float();
}
std::string Config::get_string(const std::string& key) const {
  expect(*this, key, OptionType::kString);
  return value(key).as_string();
}
std::vector<std::int64_t> Config::get_int_list(const std::string& key) const {
  expect(*this, key, OptionType::kIntegerList);
  std::vector<std::int64_t> out;
  for (const auto& item : value(key).as_array()) out.push_back(item.as_integer());
  return out;
}
std::vector<double> Config::get_float_list(const std::string& key) const {
  expect(*this, key, OptionType::kFloatList);
  std::vector<double> out;
  for (const auto& item : value(key).as_array()) out.push_back(item.as_float());
  return out;
}
std::vector<std::string> Config::get_string_list(const std::string& key) const {
  expect(*this, key, OptionType::kStringList);
  std::vector<std::string> out;
  for (const auto& item : value(key).as_array()) out.push_back(item.as_string());
  return out;
}
Config Config::get_table(const std::string& key) const {
  expect(*this, key, OptionType::kTable);
  return Config(value(key).table_ptr(), qualified(key));
}

std::filesystem::path Config::get_path(const std::string& key) const {
  std::filesystem::path path = get_string(key);
  if (path.empty() || path.is_absolute()) return path;
  const SourceLocation& where = value(key).where();
  // Values from --set (and defaults) are relative to the working directory.
  if (where.line <= 0) return path;
  return std::filesystem::path(where.file).parent_path() / path;
}

bool value_matches(const Value& value, OptionType type) {
  auto all = [&](auto predicate) {
    if (value.type() != ValueType::kArray) return false;
    const auto& items = value.as_array();
    return std::all_of(items.begin(), items.end(), predicate);
  };
  switch (type) {
    case OptionType::kBool: return value.type() == ValueType::kBool;
    case OptionType::kInteger: return value.type() == ValueType::kInteger;
    case OptionType::kFloat:
      return value.type() == ValueType::kFloat || value.type() == ValueType::kInteger;
    case OptionType::kString: return value.type() == ValueType::kString;
    case OptionType::kIntegerList:
      return all([](const Value& v) { return v.type() == ValueType::kInteger; });
    case OptionType::kFloatList:
      return all([](const Value& v) {
        return v.type() == ValueType::kFloat || v.type() == ValueType::kInteger;
      });
    case OptionType::kStringList:
      return all([](const Value& v) { return v.type() == ValueType::kString; });
    case OptionType::kTable: return value.type() == ValueType::kTable;
  }
  return false;
}

Config validate_section(const Config& section, const OptionSpecs& specs,
                        const std::vector<std::string>& reserved) {
  auto resolved = std::make_shared<Table>();
  resolved->where = section.table().where;
  std::set<std::string> declared;
  for (const auto& spec : specs) declared.insert(spec.name);

  for (const auto& [key, value] : section.table().entries()) {
    bool is_reserved = std::find(reserved.begin(), reserved.end(), key) != reserved.end();
    if (is_reserved) {
      resolved->set(key, value);
      continue;
    }
    if (!declared.count(key)) {
      std::string known;
      for (const auto& spec : specs) known += (known.empty() ? "" : ", ") + spec.name;
      throw Error(section.table().key_where(key).str() + ": unknown option '" +
                  section.qualified(key) +
                  "' (known: " + (known.empty() ? "none" : known) + ")");
    }
  }
  for (const auto& spec : specs) {
    if (const Value* value = section.table().find(spec.name)) {
      if (!value_matches(*value, spec.type)) {
        throw Error(value->where().str() + ": " + section.qualified(spec.name) + " must be " +
                    with_article(to_string(spec.type)) + ", got " + value->to_toml() + " (" +
                    with_article(to_string(value->type())) + ")");
      }
      if (auto broken = spec.violation(*value)) {
        throw Error(value->where().str() + ": " + section.qualified(spec.name) + " " + *broken);
      }
      Value copy = *value;
      // Keep floats floats, so that printing and later reads agree on the type.
      if (spec.type == OptionType::kFloat && copy.type() == ValueType::kInteger) {
        copy = Value(copy.as_float(), copy.where());
      }
      resolved->set(spec.name, std::move(copy));
      resolved->set_key_where(spec.name, section.table().key_where(spec.name));
    } else if (spec.default_value) {
      resolved->set(spec.name, *spec.default_value);
    } else {
      throw Error(section.table().where.str() + ": missing required option '" +
                  section.qualified(spec.name) + "' (" + spec.help + ")");
    }
  }
  return Config(resolved, section.name());
}

}  // namespace trainyard
