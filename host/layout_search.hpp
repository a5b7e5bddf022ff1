#pragma once
// `trainyard plan --fit`: the layouts a recipe could run with on a process count (each strategy
// the loaded plugins offer, as their options say how it holds the model; recomputing blocks or
// not; the micro-batch split and accumulated to keep the global batch), each planned
// (layout_plan.hpp), and ranked: those whose peak fits the cap by predicted step time, then the
// rest by peak. The step time does not count communication yet, so among the layouts within 5% of
// the fastest, the one that moves the fewest bytes comes first.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "layout_plan.hpp"

namespace trainyard {

class Registry;

struct LayoutCandidate {
  std::vector<std::string> sets;  // section.key=value, added to the recipe's
  std::string described;          // the plan's description of the layout
  double step_seconds = 0;
  std::int64_t communication_bytes = 0;
  std::int64_t peak_bytes = 0;
  bool fits = false;
};

// Every candidate the planner could plan, ranked as above. Its plugins must be loaded in
// `registry`.
std::vector<LayoutCandidate> search_layouts(const std::filesystem::path& recipe,
                                            const std::vector<std::string>& overrides, int nproc,
                                            std::int64_t cap_bytes, const Registry& registry);

// The chosen layout as --set arguments with its predicted step time and peak, the runners-up and
// why each lost, or (exit 1) that nothing fits and the smallest peak found.
int report_search(const std::vector<LayoutCandidate>& ranked, std::int64_t cap_bytes);

}  // namespace trainyard
