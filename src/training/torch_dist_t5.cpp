// T5 keys of Megatron-LM's torch_dist checkpoints; see torch_dist_t5.h.
#include "training/torch_dist_t5.h"

#include <algorithm>

#include "core/error.h"
#include "training/torch_checkpoint.h"
#include "training/torch_dist_moe.h"

namespace megatron::training::torch_dist_t5 {

bool is_t5(const std::vector<std::string>& keys) {
  auto any = [&](const char* p) {
    return std::any_of(keys.begin(), keys.end(), [p](const std::string& k) { return k.starts_with(p); });
  };
  return any("encoder.") && any("decoder.");
}

bool is_output_alias(const std::string& key, bool has_lm_head_twin) {
  return (key == "output_layer.weight" || key == "output_layer.bias") && has_lm_head_twin;
}

int64_t block_layers(const std::string& key, const TrainingArgs& a) {
  return key.starts_with("decoder.layers.") ? int64_t(a.model.decoder_layers()) : a.model.num_layers;
}

std::vector<std::string> keys_of(const std::string& ours, const std::string& key, bool optimizer_state) {
  (void)optimizer_state;  // keyed as the weight
  if (ours != "output_layer.weight" && ours != "output_layer.bias") return {key};
  return {"lm_head." + ours};
}

std::vector<std::string> extra_state_keys(const TrainingArgs& a, bool te) {
  std::vector<std::string> out;
  const torch_dist_moe::MoeLayout dense;
  for (const std::string block : {"encoder", "decoder"}) {
    const int L = block == "encoder" ? int(a.model.num_layers) : a.model.decoder_layers();
    for (int layer = 0; layer < L; ++layer)
      for (const std::string& n : torch_names::t5_extra_state_names(layer, te, block))
        out.push_back(torch_dist_moe::sharded_key(n, te, dense).key + "/shard_" + std::to_string(layer) + "_" +
                      std::to_string(L));
  }
  out.push_back("lm_head.output_layer._extra_state/shard_0_1");
  return out;
}

}  // namespace megatron::training::torch_dist_t5
