#pragma once
// The safetensors format's dtype names ("F32", "BF16", ...) and LibTorch's scalar types.

#include <c10/core/ScalarType.h>

#include <string>

namespace trainyard::safetensors {

// The format's name of `type`; throws Error naming `tensor` for a type the format cannot store.
const char* dtype_name(c10::ScalarType type, const std::string& tensor);
// LibTorch's type of the format's dtype `name`; throws Error for a name without one.
c10::ScalarType scalar_type(const std::string& name);

}  // namespace trainyard::safetensors
