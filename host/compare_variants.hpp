#pragma once
// The variants `trainyard compare` runs: --vary axes (section.key=v1,v2,... or whole layouts,
// parallel=LAYOUT | LAYOUT), their cartesian product per recipe, and each variant's process count.

#include <filesystem>
#include <string>
#include <vector>

namespace trainyard {

// The --vary key whose values are whole layouts.
constexpr const char* kLayoutKey = "parallel";

struct VaryAxis {
  std::string key;
  std::vector<std::string> values;
};

struct Variant {
  std::filesystem::path recipe;
  std::vector<std::string> assignments;  // the --vary choices, "key=value"
  std::string label;
  std::string folder;
  bool layout = false;  // a --vary parallel= layout: it runs on the processes it needs
  int nproc = 0;        // its process count, once known
};

// "key=v1,v2": the values split at commas outside brackets and quotes, so that lists and quoted
// strings ("model.channels=[16,32],[32,64]") stay whole; "parallel=L1 | L2": whole layouts.
// Throws Error (one line) for a malformed axis.
VaryAxis parse_vary(const std::string& text);

// Every recipe times the cartesian product of the axes (the first outermost), labelled and given
// a folder name.
std::vector<Variant> make_variants(const std::vector<std::filesystem::path>& recipes,
                                   const std::vector<VaryAxis>& axes);

struct ProcessCount {
  int nproc = 1;       // --nproc
  bool given = false;  // whether the command line said it
};

// Each variant's process count: --nproc, or for a layout the product of its [parallel] sizes (or
// --nproc when dp_shard is left to fill, a multiple of the others). Throws Error (one line) when
// a layout does not fit --nproc.
void assign_process_counts(std::vector<Variant>& variants,
                           const std::vector<std::string>& overrides, const ProcessCount& count);

}  // namespace trainyard
