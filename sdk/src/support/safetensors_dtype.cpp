#include "trainyard/support/safetensors_dtype.hpp"

#include "trainyard/api/error.hpp"

namespace trainyard::safetensors {
namespace {

struct DtypeName {
  c10::ScalarType type;
  const char* name;
};

constexpr DtypeName kDtypes[] = {
    {c10::kFloat, "F32"},
    {c10::kDouble, "F64"},
    {c10::kHalf, "F16"},
    {c10::kBFloat16, "BF16"},
    {c10::kLong, "I64"},
    {c10::kInt, "I32"},
    {c10::kShort, "I16"},
    {c10::kChar, "I8"},
    {c10::kByte, "U8"},
    {c10::kBool, "BOOL"},
    {c10::kUInt16, "U16"},
    {c10::kUInt32, "U32"},
    {c10::kUInt64, "U64"},
    {c10::kFloat8_e4m3fn, "F8_E4M3"},
    {c10::kFloat8_e5m2, "F8_E5M2"},
};

}  // namespace

const char* dtype_name(c10::ScalarType type, const std::string& tensor) {
  for (const auto& entry : kDtypes) {
    if (entry.type == type) return entry.name;
  }
  throw Error("tensor '" + tensor + "' has dtype " + std::string(c10::toString(type)) +
              ", which safetensors cannot store");
}

c10::ScalarType scalar_type(const std::string& name) {
  for (const auto& entry : kDtypes) {
    if (name == entry.name) return entry.type;
  }
  throw Error("dtype '" + name + "' has no LibTorch type");
}

}  // namespace trainyard::safetensors
