#include "core/dtype.h"

#include "core/error.h"

namespace megatron {

namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  const char* name;
  bool floating;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F32, 4, "float32", true}, {DType::F64, 8, "float64", true},
    {DType::F16, 2, "float16", true}, {DType::BF16, 2, "bfloat16", true},
    {DType::I8, 1, "int8", false},    {DType::U8, 1, "uint8", false},
    {DType::I16, 2, "int16", false},  {DType::U16, 2, "uint16", false},
    {DType::I32, 4, "int32", false},  {DType::I64, 8, "int64", false},
};
const DTypeInfo& info(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i;
  MG_CHECK(false, "unknown dtype code ", int(t));
  __builtin_unreachable();
}
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
const char* dtype_name(DType t) { return info(t).name; }
bool dtype_is_floating(DType t) { return info(t).floating; }

DType dtype_from_name(const std::string& name) {
  for (const auto& i : kInfo)
    if (name == i.name) return i.type;
  if (name == "fp32") return DType::F32;
  if (name == "fp16") return DType::F16;
  if (name == "bf16") return DType::BF16;
  MG_THROW("unknown dtype '", name, "' (expected one of float32, float16, bfloat16, int32, ...)");
}

}  // namespace megatron
