#include "compare_variants.hpp"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

// A layout's "key=value" pairs as assignments: keys without a section are [parallel] keys.
std::vector<std::string> layout_assignments(const std::string& layout, const std::string& origin) {
  std::vector<std::string> assignments;
  std::stringstream pairs(layout);
  for (std::string pair; std::getline(pairs, pair, ',');) {
    const auto begin = pair.find_first_not_of(' ');
    const auto end = pair.find_last_not_of(' ');
    pair = begin == std::string::npos ? "" : pair.substr(begin, end - begin + 1);
    const auto equals = pair.find('=');
    if (equals == std::string::npos || equals == 0 || equals + 1 == pair.size()) {
      throw Error(origin + ": layout '" + layout + "': expected key=value pairs separated by ','");
    }
    const std::string key = pair.substr(0, equals);
    assignments.push_back(
        (key.find('.') == std::string::npos ? std::string(kLayoutKey) + "." : "") + pair);
  }
  return assignments;
}

// --vary parallel=LAYOUT | LAYOUT ...: whole layouts, each "key=value,key=value".
VaryAxis parse_layouts(const std::string& text, const std::string& origin) {
  VaryAxis axis;
  axis.key = kLayoutKey;
  std::stringstream list(text.substr(text.find('=') + 1));
  for (std::string layout; std::getline(list, layout, '|');) {
    const auto begin = layout.find_first_not_of(' ');
    const auto end = layout.find_last_not_of(' ');
    if (begin == std::string::npos) throw Error(origin + ": empty layout in the list");
    layout = layout.substr(begin, end - begin + 1);
    layout_assignments(layout, origin);  // checked here, expanded when variants are made
    axis.values.push_back(layout);
  }
  return axis;
}

}  // namespace

// "key=v1,v2": the values split at commas outside brackets and quotes, so that lists and
// quoted strings ("model.channels=[16,32],[32,64]") stay whole.
VaryAxis parse_vary(const std::string& text) {
  const std::string origin = "compare: --vary '" + text + "'";
  const auto equals = text.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw Error(origin + ": expected section.key=value1,value2,...");
  }
  if (text.substr(0, equals) == kLayoutKey) return parse_layouts(text, origin);
  VaryAxis axis;
  axis.key = text.substr(0, equals);
  std::stringstream keys(axis.key);
  std::size_t parts = 0;
  for (std::string part; std::getline(keys, part, '.'); ++parts) {
    const bool word = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (!word) throw Error(origin + ": bad key '" + axis.key + "' (expected section.key)");
  }
  if (parts == 0 || axis.key.back() == '.') {
    throw Error(origin + ": bad key '" + axis.key + "' (expected section.key)");
  }
  const std::string list = text.substr(equals + 1);
  std::string current;
  int depth = 0;
  char quote = 0;
  auto finish = [&] {
    if (current.empty()) {
      throw Error(origin + ": empty value in the list (expected value1,value2,...)");
    }
    axis.values.push_back(current);
    current.clear();
  };
  for (char c : list) {
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (--depth < 0) throw Error(origin + ": unbalanced '" + std::string(1, c) + "'");
    } else if (c == ',' && depth == 0) {
      finish();
      continue;
    }
    current += c;
  }
  if (quote) throw Error(origin + ": unterminated quote");
  if (depth != 0) throw Error(origin + ": unbalanced brackets");
  finish();
  return axis;
}

namespace {

// A folder name from a label: letters, digits, '.', '_' and '-' only, bounded in length.
std::string folder_name(std::size_t index, const std::string& text) {
  std::string out = std::to_string(index + 1);
  if (!text.empty()) out += "-";
  for (char c : text) {
    const bool keep =
        std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    if (out.size() >= 80) break;
    out += keep ? c : '_';
  }
  return out;
}

}  // namespace

std::vector<Variant> make_variants(const std::vector<fs::path>& recipes,
                                   const std::vector<VaryAxis>& axes) {
  std::vector<std::vector<std::string>> combinations = {{}};
  for (const auto& axis : axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& prefix : combinations) {
      for (const auto& value : axis.values) {
        auto choice = prefix;
        choice.push_back(axis.key + "=" + value);
        next.push_back(std::move(choice));
      }
    }
    combinations = std::move(next);
  }
  std::vector<Variant> variants;
  for (const auto& recipe : recipes) {
    for (const auto& assignments : combinations) {
      Variant v;
      v.recipe = recipe;
      std::string values;
      for (const auto& a : assignments) {
        v.label += (v.label.empty() ? "" : " ") + a;
        values += (values.empty() ? "" : "-") + a.substr(a.find('=') + 1);
        if (a.starts_with(std::string(kLayoutKey) + "=")) {
          v.layout = true;
          for (auto& pair : layout_assignments(a.substr(a.find('=') + 1), "compare: --vary")) {
            v.assignments.push_back(std::move(pair));
          }
        } else {
          v.assignments.push_back(a);
        }
      }
      if (recipes.size() > 1 || v.label.empty()) {
        v.label = recipe.filename().string() + (v.label.empty() ? "" : " " + v.label);
        values = recipe.stem().string() + (values.empty() ? "" : "-" + values);
      }
      v.folder = folder_name(variants.size(), values);
      variants.push_back(std::move(v));
    }
  }
  return variants;
}

namespace {

// The [parallel] size `key` of the variant's recipe with every choice applied; `fallback` when
// the recipe does not say.
std::int64_t parallel_size(const Recipe& recipe, const char* key, std::int64_t fallback) {
  const Value* parallel = recipe.root->find(kLayoutKey);
  if (!parallel || parallel->type() != ValueType::kTable) return fallback;
  const Value* size = parallel->as_table().find(key);
  if (!size || size->type() != ValueType::kInteger) return fallback;
  return size->as_integer();
}

// A layout variant's process count: the product of its [parallel] sizes, or --nproc when
// dp_shard is left to fill (-1), which must then be a multiple of the others' product. Throws
// Error (one line) when the layout does not fit --nproc.
int layout_processes(const Variant& variant, const std::vector<std::string>& overrides,
                     const ProcessCount& count) {
  std::vector<std::string> sets = overrides;
  sets.insert(sets.end(), variant.assignments.begin(), variant.assignments.end());
  const Recipe recipe = load_recipe(variant.recipe, sets);
  const std::int64_t others = parallel_size(recipe, "pp", 1) *
                              parallel_size(recipe, "dp_replicate", 1) *
                              parallel_size(recipe, "tp", 1);
  const std::int64_t shard = parallel_size(recipe, "dp_shard", -1);
  const std::string origin = "compare: layout '" + variant.label + "'";
  if (others < 1) throw Error(origin + ": its [parallel] sizes must be >= 1");
  if (shard > 0) {
    const std::int64_t needed = others * shard;
    if (count.given && needed != count.nproc) {
      throw Error(origin + " runs " + std::to_string(needed) + " processes, but --nproc is " +
                  std::to_string(count.nproc));
    }
    return static_cast<int>(needed);
  }
  if (count.nproc % others != 0) {
    throw Error(origin + " needs a multiple of " + std::to_string(others) +
                " processes (pp x dp_replicate x tp), but --nproc is " +
                std::to_string(count.nproc) + (count.given ? "" : " (the default)"));
  }
  return count.nproc;
}

}  // namespace

void assign_process_counts(std::vector<Variant>& variants,
                           const std::vector<std::string>& overrides, const ProcessCount& count) {
  for (auto& variant : variants) {
    variant.nproc = variant.layout ? layout_processes(variant, overrides, count) : count.nproc;
  }
}

}  // namespace trainyard
