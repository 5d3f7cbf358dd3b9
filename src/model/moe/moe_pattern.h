// Which layers of a model have a mixture-of-experts FFN: Megatron's --moe-layer-freq, an integer
// k (layer i is MoE iff i % k == 0) or a Python list pattern of 0/1 ("[1,0,1,0]",
// "([1]*3+[0]*1)*2", read as Megatron's eval would) with one entry per layer.
#pragma once

#include <string>
#include <vector>

namespace megatron::model {

// 1 for an MoE layer, 0 for a dense one; a malformed pattern or one of the wrong length is a
// megatron::Error naming --moe-layer-freq.
std::vector<int> moe_layer_pattern(const std::string& freq, int num_layers);

}  // namespace megatron::model
