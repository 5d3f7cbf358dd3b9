// Element types of tensors and of files. fp32 is the compute type; bf16/fp16 are storage types
// (see half.h); integer types carry token ids, indices and masks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/half.h"

namespace megatron {

enum class DType : uint8_t { F32, F64, F16, BF16, I8, U8, I16, U16, I32, I64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);          // "float32", "bfloat16", ...
DType dtype_from_name(const std::string& name);  // throws Error on an unknown name
bool dtype_is_floating(DType t);

template <typename T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<fp16> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::I8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct dtype_of<int16_t> { static constexpr DType value = DType::I16; };
template <> struct dtype_of<uint16_t> { static constexpr DType value = DType::U16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <typename T>
inline constexpr DType dtype_v = dtype_of<T>::value;

}  // namespace megatron
