#pragma once
// What people, logs and cache files call a dtype.

#include <c10/core/ScalarType.h>

#include <string>

namespace trainyard {

// "float32", "bfloat16", "float16"; LibTorch's own name for any other dtype.
std::string dtype_name(c10::ScalarType dtype);

}  // namespace trainyard
