#pragma once
// Small text helpers the compare report's parts share: numbers as text, byte sizes with a unit,
// shares as percentages and HTML escaping.

#include <string>

namespace trainyard {

// `value` with `decimals` digits after the point; "nan" when it is not finite.
std::string fixed(double value, int decimals);
// `value` with `digits` significant digits; "nan" when it is not finite.
std::string significant(double value, int digits);
// A byte count in the largest unit (B to TiB) that keeps it at least 1: "1.5 GiB".
std::string bytes_text(double bytes);
// A share in [0, 1] as a percentage with one decimal: "12.5%".
std::string percent(double share);
// `text` safe inside HTML element content and attribute values.
std::string html_escape(const std::string& text);

}  // namespace trainyard
