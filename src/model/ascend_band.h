// The Ascend scripts' --pre-tockens P --next-tockens N (Megatron-NPU's fused attention) as the
// window of a TransformerConfig: the mask (causal or bidirectional) still applies, and query i sees
// only keys in [i - P, i + N]. A bound that reaches past the longest sequence
// (max(seq_length, max_position_embeddings) - 1) is no bound, and a causal model ignores N (no key
// after the query is visible anyway). Throws megatron::Error naming the flags for negative values
// or when the longest sequence is unknown.
#pragma once

#include <cstdint>

#include "model/transformer_config.h"

namespace megatron::model {

void apply_ascend_band(TransformerConfig& c, int64_t pre_tockens, int64_t next_tockens);

}  // namespace megatron::model
