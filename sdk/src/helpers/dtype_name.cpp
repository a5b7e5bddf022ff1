#include "trainyard/runtime/dtype_name.hpp"

namespace trainyard {

// "Float" is LibTorch's name for float32; people and the cache files say float32.
std::string dtype_name(c10::ScalarType dtype) {
  if (dtype == c10::kFloat) return "float32";
  if (dtype == c10::kBFloat16) return "bfloat16";
  if (dtype == c10::kHalf) return "float16";
  return c10::toString(dtype);
}

}  // namespace trainyard
