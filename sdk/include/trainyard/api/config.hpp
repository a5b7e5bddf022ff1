#pragma once
// A recipe's values as the SDK sees them: typed, located in their source file, with no TOML
// library type in sight, so plugins depend on the SDK alone.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "trainyard/api/error.hpp"

namespace trainyard {

// Where a value was written: a recipe file and position, or a --set on the command line.
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;

  // "recipes/x.toml:12:7", or just the file when the position is unknown.
  std::string str() const;
};

class Table;
class Value;
using Array = std::vector<Value>;

enum class ValueType { kBool, kInteger, kFloat, kString, kArray, kTable };
const char* to_string(ValueType type);

// One recipe value. Tables are shared immutably, so copying a Value is cheap.
class Value {
 public:
  Value() = default;
  Value(bool v, SourceLocation where = {});
  Value(std::int64_t v, SourceLocation where = {});
  Value(int v, SourceLocation where = {}) : Value(static_cast<std::int64_t>(v), std::move(where)) {}
  Value(double v, SourceLocation where = {});
  Value(std::string v, SourceLocation where = {});
  Value(const char* v, SourceLocation where = {}) : Value(std::string(v), std::move(where)) {}
  Value(Array v, SourceLocation where = {});
  Value(std::shared_ptr<const Table> v, SourceLocation where = {});

  ValueType type() const;
  const SourceLocation& where() const { return where_; }
  void set_where(SourceLocation where) { where_ = std::move(where); }

  bool as_bool() const { return std::get<bool>(data_); }
  std::int64_t as_integer() const { return std::get<std::int64_t>(data_); }
  // Integers are accepted where floats are expected (lr = 1 means 1.0).
  double as_float() const;
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const Array& as_array() const { return std::get<Array>(data_); }
  const Table& as_table() const { return *std::get<std::shared_ptr<const Table>>(data_); }
  std::shared_ptr<const Table> table_ptr() const {
    return std::get<std::shared_ptr<const Table>>(data_);
  }

  // TOML text of the value (inline form for tables).
  std::string to_toml() const;
  bool operator==(const Value& other) const;

 private:
  std::variant<std::monostate, bool, std::int64_t, double, std::string, Array,
               std::shared_ptr<const Table>>
      data_;
  SourceLocation where_;
};

// Keys in the order they were written.
class Table {
 public:
  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  const Value* find(const std::string& key) const;
  const Value& at(const std::string& key) const;
  void set(const std::string& key, Value value);
  bool erase(const std::string& key);
  // Where `key` itself was written (errors about the key point there); the value's location
  // when the key's is unknown (a --set, a table built in code).
  SourceLocation key_where(const std::string& key) const;
  void set_key_where(const std::string& key, SourceLocation where);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }

  // Where the table itself was opened (its [header]), for errors about missing keys.
  SourceLocation where;

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, SourceLocation> key_locations_;
};

// The type an option declares. Arrays are homogeneous.
enum class OptionType {
  kBool,
  kInteger,
  kFloat,
  kString,
  kIntegerList,
  kFloatList,
  kStringList,
  kTable,  // a free-form sub-table, checked by the plugin itself
};
const char* to_string(OptionType type);
// The type name with its indefinite article, for messages: "an integer", "a float".
std::string with_article(const char* type_name);

// One option a plugin accepts: its name, type, default (none means required) and help text,
// and the values it allows, declared once and checked where the value enters (validate_section,
// so `trainyard validate` refuses them too): numbers, and each item of a number list, within
// [minimum, maximum] (either end open when declared with greater_than / less_than) unless equal
// to `sentinel`; strings, and each item of a string list, among `choices` when there are any.
// The registry checks them before a plugin's factory runs, so a factory reads values that keep
// the declared rules without checking them again.
struct OptionSpec {
  std::string name;
  OptionType type = OptionType::kString;
  std::optional<Value> default_value;
  std::string help;
  std::optional<double> minimum;
  std::optional<double> maximum;
  bool minimum_exclusive = false;
  bool maximum_exclusive = false;
  std::vector<std::string> choices;
  // One number allowed outside the range, and what it means ("for automatic").
  std::optional<std::int64_t> sentinel;
  std::string sentinel_meaning;

  OptionSpec& at_least(double bound);
  OptionSpec& at_most(double bound);
  OptionSpec& greater_than(double bound);
  OptionSpec& less_than(double bound);
  OptionSpec& one_of(std::vector<std::string> allowed);
  OptionSpec& or_exactly(std::int64_t value, std::string meaning);

  // The declared rules as `trainyard plugins` shows them (">= 1", "> 0 and < 1",
  // "auto, bar or lines"); empty when there are none.
  std::string rule() const;
  // The first rule `value` breaks ("must be >= 1, got 0"), or nullopt when it keeps them all.
  // `value` must have the declared type.
  std::optional<std::string> violation(const Value& value) const;
};
using OptionSpecs = std::vector<OptionSpec>;

// Shorthands that keep plugin option lists readable.
OptionSpec option(std::string name, bool default_value, std::string help);
OptionSpec option(std::string name, std::int64_t default_value, std::string help);
OptionSpec option(std::string name, int default_value, std::string help);
OptionSpec option(std::string name, double default_value, std::string help);
OptionSpec option(std::string name, const char* default_value, std::string help);
OptionSpec option(std::string name, std::vector<std::int64_t> default_value, std::string help);
OptionSpec option(std::string name, std::vector<double> default_value, std::string help);
OptionSpec option(std::string name, std::vector<std::string> default_value, std::string help);
// An option holding a TOML table, empty unless the recipe gives one; its keys are checked by
// whoever reads it.
OptionSpec table_option(std::string name, std::string help);
OptionSpec required_option(std::string name, OptionType type, std::string help);

// A section of a recipe after validation: every declared option present (defaults filled in),
// nothing undeclared. Getters throw Error with the value's location on a type mismatch.
class Config {
 public:
  Config();
  explicit Config(std::shared_ptr<const Table> table, std::string section_name = {});

  bool has(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<std::int64_t> get_int_list(const std::string& key) const;
  std::vector<double> get_float_list(const std::string& key) const;
  std::vector<std::string> get_string_list(const std::string& key) const;
  Config get_table(const std::string& key) const;
  // A string option naming a file: relative paths resolve against the folder of the recipe that
  // wrote the value (the working directory for --set values and defaults).
  std::filesystem::path get_path(const std::string& key) const;

  // Typed getters for values that must be positive, in range, etc., with the location in the
  // message: "recipes/x.toml:9:14: optimizer.lr must be >= 0, got -1".
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

  const Value& value(const std::string& key) const;
  const Table& table() const { return *table_; }
  std::shared_ptr<const Table> table_ptr() const { return table_; }
  // The dotted path of this section in the recipe ("optimizer", "sinks.jsonl").
  const std::string& name() const { return name_; }
  std::string qualified(const std::string& key) const;

 private:
  std::shared_ptr<const Table> table_;
  std::string name_;
};

// Checks a section against the declared options and returns a copy with defaults filled in.
// Keys in `reserved` (such as "plugin") are owned by the runtime and skipped.
// Throws Error naming file:line:column for unknown keys, wrong types, values outside their
// declared range or choices, and missing required keys.
Config validate_section(const Config& section, const OptionSpecs& specs,
                        const std::vector<std::string>& reserved = {"plugin"});

// True when `value` has the declared type (integers count as floats).
bool value_matches(const Value& value, OptionType type);

}  // namespace trainyard
