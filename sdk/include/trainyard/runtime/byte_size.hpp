#pragma once
// Byte counts as people read them in reports: mebibytes with two decimals.

#include <cstdint>
#include <cstdio>
#include <string>

namespace trainyard {

// "81.94 MiB"; `width` pads the number on the left (for columns).
inline std::string format_mib(std::int64_t bytes, int width = 0) {
  char text[48];
  std::snprintf(text, sizeof text, "%*.2f MiB", width, static_cast<double>(bytes) / (1 << 20));
  return text;
}

}  // namespace trainyard
