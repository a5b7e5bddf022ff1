#pragma once
// The one exception type the host reports as a clean one-line error.

#include <stdexcept>
#include <string>

namespace trainyard {

// Errors a user can act on: bad recipes, missing files, plugins that do not load. The host prints
// what() on one line and exits non-zero; anything else escaping is a bug.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace trainyard
