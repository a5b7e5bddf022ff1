#pragma once

#include <string>

namespace trainyard {

// The file name of the shared library whose malloc serves this process ("libc.so.6",
// "libtcmalloc_minimal.so.4", or a preloaded allocator's), or "unknown" when it cannot be told.
std::string malloc_provider();

}  // namespace trainyard
