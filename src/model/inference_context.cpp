// KV-cache storage of the inference context (see inference_context.h).
#include "model/inference_context.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace megatron::model {

DType cache_dtype_for(DType params_dtype, Device device) {
  return params_dtype == DType::BF16 && !device.is_cuda() ? DType::BF16 : DType::F32;
}

void InferenceContext::allocate(int num_layers, int64_t s, int64_t groups, int64_t len,
                                int64_t head_dim, Device device, int first_layer, DType dtype) {
  MG_CHECK(num_layers >= 1 && s >= 1 && groups >= 1 && len >= 1 && head_dim >= 1,
           "InferenceContext::allocate: bad sizes");
  MG_CHECK(dtype == DType::F32 || dtype == DType::BF16,
           "InferenceContext::allocate: the KV cache is float32 or bfloat16");
  cache_dtype = dtype;
  slots = s;
  max_len = len;
  key_cache.assign(size_t(num_layers), Tensor());
  value_cache.assign(size_t(num_layers), Tensor());
  // Zero-filled: the pages are touched here, at the start of a request, rather than by the first
  // token written at each position (a page fault inside every decode step).
  for (int l = first_layer; l < num_layers; ++l) {
    key_cache[size_t(l)] = Tensor::zeros({s, groups, len, head_dim}, dtype, device);
    value_cache[size_t(l)] = Tensor::zeros({s, groups, len, head_dim}, dtype, device);
  }
}

void InferenceContext::grow(int64_t len) {
  if (len <= max_len) return;
  for (auto* caches : {&key_cache, &value_cache})
    for (Tensor& c : *caches) {
      if (!c.defined()) continue;  // another pipeline stage's layer
      const int64_t blocks = c.size(0) * c.size(1), d = c.size(3);
      Tensor grown = Tensor::empty({c.size(0), c.size(1), len, d}, c.dtype(), c.device());
      // Each (slot, group) block keeps its positions at the longer stride.
      grown.view({blocks, len * d}).narrow(1, 0, max_len * d).copy_(c.view({blocks, max_len * d}));
      c = grown;
    }
  max_len = len;
}

void InferenceContext::reorder(const Tensor& src) {
  const int64_t k = src.numel();
  MG_CHECK(k >= 1 && src.dtype() == DType::I32, "InferenceContext::reorder: int32 slot list");
  for (auto* caches : {&key_cache, &value_cache})
    for (Tensor& c : *caches) {
      if (!c.defined()) continue;
      const int64_t row = c.numel() / c.size(0);
      Tensor out = Tensor::empty({k, c.size(1), c.size(2), c.size(3)}, c.dtype(), c.device());
      ops::index_select_rows(out.view({k, row}), c.view({slots, row}), src);
      c = out;
    }
  // The cross-attention cache: cross_seq rows per slot.
  for (Tensor& c : cross_kv) {
    if (!c.defined()) continue;
    const int64_t row = c.numel() / slots;
    Tensor out = Tensor::empty({k * cross_seq, c.size(1)}, c.dtype(), c.device());
    ops::index_select_rows(out.view({k, row}), c.view({slots, row}), src);
    c = out;
  }
  if (cross_padding.defined()) {
    Tensor out = Tensor::empty({k, cross_seq}, DType::I32, cross_padding.device());
    ops::index_select_rows(out, cross_padding, src);
    cross_padding = out;
  }
  slots = k;
}

}  // namespace megatron::model
