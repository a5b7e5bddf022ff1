#pragma once
// The side-by-side table's cells, shared by the terminal table (format_table, declared in
// compare_report.hpp) and the HTML page's table.

#include <string>
#include <vector>

#include "compare_report.hpp"

namespace trainyard {

// Whether some variant recorded its peak memory (the table and the page then show it).
bool any_memory(const std::vector<VariantResult>& variants);

// The table's cells, headings first; a failed variant's row ends with its error in one cell.
std::vector<std::vector<std::string>> table_cells(const std::vector<VariantResult>& variants);

}  // namespace trainyard
