#include "trainyard/support/json_quote.hpp"

#include <nlohmann/json.hpp>

#include "trainyard/api/error.hpp"

namespace trainyard {

std::string json_quote(std::string_view value) {
  using Json = nlohmann::json;
  try {
    return Json(std::string(value)).dump();
  } catch (const Json::type_error&) {
    // Shown with U+FFFD for the bad bytes, and shortened: the text may be long.
    std::string shown =
        Json(std::string(value)).dump(-1, ' ', false, Json::error_handler_t::replace);
    if (shown.size() > 160) shown = shown.substr(0, 160) + "...";
    throw Error("cannot write " + shown + " as JSON: it is not valid UTF-8");
  }
}

}  // namespace trainyard
