// The generation state of a model's attention layers (Megatron-Core's InferenceContext): a key /
// value cache per layer, and for the current forward call which cache slot and which position
// each token (row) belongs to. Slots are independent sequences: a forward may append tokens to
// several slots at their own positions (continuous batching), and a slot is reused for another
// sequence by overwriting it from position 0 (stale entries beyond a slot's position are never
// read: attention only looks at positions <= the query's).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace megatron::model {

// The KV cache's dtype for a model whose weights are params_dtype on device: bf16 for bf16
// weights on the CPU, fp32 otherwise.
DType cache_dtype_for(DType params_dtype, Device device);

struct InferenceContext {
  int64_t slots = 0, max_len = 0;
  // Per decoder layer (index = global layer number): [slots, groups, max_len, head_dim] in
  // cache_dtype (this rank's query groups under tensor parallelism; undefined for other stages'
  // layers). bf16 for a model with bf16 weights on the CPU (cache_dtype_for): decoding reads the
  // whole cache at every step, and half the bytes is half that traffic; the attention then runs
  // on bf16 q, k and v (the bf16 kernel, fp32 softmax), as the same model's training forward does.
  DType cache_dtype = DType::F32;
  std::vector<Tensor> key_cache, value_cache;
  // The current forward: int32 [n], slot and position of each of its n tokens.
  Tensor row_slot, row_pos;
  // Encoder-decoder models: the static cross-attention cache, computed once from the encoder's
  // output. Per decoder layer (index = global layer number): linear_kv of the encoder output,
  // [slots * cross_seq, heads * 2 * head_dim] fp32 (this rank's heads; per head its key then its
  // value, the layout cross-attention reads); cross_padding [slots, cross_seq] int32, 0 marking
  // a padding position of the slot's encoder input. Empty for decoder-only models.
  std::vector<Tensor> cross_kv;
  Tensor cross_padding;
  int64_t cross_seq = 0;

  // Sizes the caches for `slots` sequences of up to `max_len` positions (contents undefined).
  // Layers below `first_layer` (held by earlier pipeline stages) get no cache.
  void allocate(int num_layers, int64_t slots, int64_t groups, int64_t max_len, int64_t head_dim,
                Device device = Device::cpu(), int first_layer = 0, DType dtype = DType::F32);
  // Lengthens every slot to `max_len` positions, keeping what is cached.
  void grow(int64_t max_len);
  // Slot i becomes a copy of old slot src[i] (int32 [k]); the cache then has k slots (beam
  // search reorders its beams; generation drops finished rows). The cross-attention cache
  // follows its slots.
  void reorder(const Tensor& src);
};

}  // namespace megatron::model
