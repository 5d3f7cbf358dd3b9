// PENDING: placeholders until the kernels land.
#include "kernels/ops.h"
namespace megatron::ops {
#define PENDING(name) MG_THROW(#name " is not implemented yet")
void rmsnorm_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) { PENDING(rmsnorm_fwd); }
void rmsnorm_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) { PENDING(rmsnorm_bwd); }
void swiglu_fwd(const Tensor&, const Tensor&) { PENDING(swiglu); }
void swiglu_bwd(const Tensor&, const Tensor&, const Tensor&) { PENDING(swiglu); }
void squared_relu_fwd(const Tensor&, const Tensor&) { PENDING(squared_relu); }
void squared_relu_bwd(const Tensor&, const Tensor&, const Tensor&) { PENDING(squared_relu); }
void rope_fwd(const Tensor&, const Tensor&, const AttentionShape&, const RotaryConfig&) { PENDING(rope); }
void rope_bwd(const Tensor&, const Tensor&, const AttentionShape&, const RotaryConfig&) { PENDING(rope); }
void kv_cache_append(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionShape&) { PENDING(kv); }
void attention_kv_cache_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionShape&) { PENDING(kv); }
void index_select_rows(const Tensor&, const Tensor&, const Tensor&) { PENDING(index_select_rows); }
void index_copy_rows(const Tensor&, const Tensor&, const Tensor&, bool) { PENDING(index_copy_rows); }
double sum(const Tensor&) { PENDING(sum); }
double dot(const Tensor&, const Tensor&) { PENDING(dot); }
}  // namespace megatron::ops
