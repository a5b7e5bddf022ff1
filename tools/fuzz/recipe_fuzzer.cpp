// Fuzzes the recipe reader: TOML, `extends` chains across files, and --set overrides, then checks
// that the printed recipe reads back to the same text.
//
// Input: blocks separated by lines "#> NAME". The first block is recipe.toml; a block named `set`
// holds --set assignments, one a line; any other block is a file NAME (folders allowed, no . or
// .. components) beside recipe.toml, for `extends` to name. Every block is valid TOML comment
// syntax at its separator, so a recipe file is a valid input as it is.

#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSeparator = "\n#> ";

struct Input {
  std::vector<std::pair<std::string, std::string>> files;  // relative name, text
  std::vector<std::string> overrides;
};

bool usable_name(const std::string& name) {
  if (name.empty() || name.size() > 64 || name.front() == '/') return false;
  for (const auto& part : fs::path(name)) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
          c == '/')) {
      return false;
    }
  }
  return true;
}

Input split(std::string_view data) {
  Input input;
  std::string name = "recipe.toml";
  while (true) {
    const std::size_t next = data.find(kSeparator);
    const std::string_view body = data.substr(0, next);
    if (name == "set") {
      std::size_t start = 0;
      while (start <= body.size()) {
        std::size_t end = body.find('\n', start);
        if (end == std::string_view::npos) end = body.size();
        if (end > start) input.overrides.emplace_back(body.substr(start, end - start));
        start = end + 1;
      }
    } else if (usable_name(name)) {
      input.files.emplace_back(name, std::string(body));
    }
    if (next == std::string_view::npos) break;
    data.remove_prefix(next + kSeparator.size());
    const std::size_t line_end = data.find('\n');
    name = std::string(data.substr(0, line_end));
    data.remove_prefix(line_end == std::string_view::npos ? data.size() : line_end + 1);
  }
  return input;
}

// One folder per process, emptied before each input.
const fs::path& scratch() {
  static const fs::path folder = [] {
    std::string pattern = (fs::temp_directory_path() / "trainyard-recipe-fuzz-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) std::abort();
    fs::path made = pattern;
    std::atexit([] { fs::remove_all(scratch()); });
    return made;
  }();
  return folder;
}

void write_files(const Input& input) {
  for (const auto& entry : fs::directory_iterator(scratch())) fs::remove_all(entry.path());
  for (const auto& [name, text] : input.files) {
    const fs::path file = scratch() / name;
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    std::ofstream(file, std::ios::binary) << text;  // a name taken by a folder stays unwritten
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Input input = split(std::string_view(reinterpret_cast<const char*>(data), size));
  write_files(input);
  trainyard::Recipe recipe;
  try {
    recipe = trainyard::load_recipe(scratch() / "recipe.toml", input.overrides);
  } catch (const trainyard::Error&) {
    return 0;  // refused with a message: what bad input must get
  }
  // The printed recipe (--print-config) is a recipe too: it must read back to itself.
  const std::string printed = trainyard::to_toml(*recipe.root);
  std::string reprinted;
  try {
    reprinted = trainyard::to_toml(*trainyard::parse_toml(printed, "printed.toml"));
  } catch (const trainyard::Error& error) {
    std::fprintf(stderr, "printed recipe does not read back: %s\n---\n%s---\n", error.what(),
                 printed.c_str());
    std::abort();
  }
  if (reprinted != printed) {
    std::fprintf(stderr, "printed recipe reads back differently:\n%s---\n%s---\n", printed.c_str(),
                 reprinted.c_str());
    std::abort();
  }
  return 0;
}
