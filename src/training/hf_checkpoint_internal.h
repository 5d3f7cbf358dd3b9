// Internal to the Hugging Face export and import (hf_checkpoint*.cpp): the fused-QKV layout
// conversions and small helpers both directions use.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace megatron::training::hf_detail {

// Our fused QKV rows (weight or bias) for `groups` query groups of heads/groups query heads of
// head_dim rows each: per group [its query heads; its key; its value]. q holds the query heads in
// order (heads * head_dim rows), k and v one head per group (groups * head_dim rows).
struct QkvParts {
  Tensor q, k, v;
};
QkvParts split_qkv(const Tensor& fused, int heads, int groups, int head_dim);
Tensor fuse_qkv(const QkvParts& parts, int heads, int groups, int head_dim);

Tensor transposed(const Tensor& t);                // 2-D, contiguous copy
Tensor cat_rows(const std::vector<Tensor>& parts);  // along dim 0

// A float setting as the double of its shortest decimal text (1e-05, not 9.99999974737875e-06),
// so config.json reads as a person wrote it and reads back to the same float.
double short_float(float v);
// config.json's torch_dtype: "float32", "bfloat16", "float16".
const char* torch_dtype_name(DType t);

}  // namespace megatron::training::hf_detail
