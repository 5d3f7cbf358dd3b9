// BERT's and T5's parameter registration order for the distributed optimizer's dp_reshardable
// buckets; see torch_dist_buckets_family.h.
#include "training/torch_dist_buckets_family.h"

#include "core/error.h"

namespace megatron::training {

namespace {

constexpr const char* kWordEmbedding = "embedding.word_embeddings.weight";

// One transformer layer's parameters under `prefix` in TransformerLayer's registration order:
// input_layernorm, self_attention (Attention's linear_proj before linear_qkv), with `cross`
// pre_cross_attn_layernorm and cross_attention (linear_proj, linear_q, linear_kv), then
// pre_mlp_layernorm and mlp. With Transformer Engine's spec the input and pre-MLP norms are
// TELayerNormColumnParallelLinear's layer_norm_weight / layer_norm_bias, registered before the
// linear's own weight: input_layernorm after linear_proj, pre_mlp_layernorm where it stands.
void add_layer(std::vector<OrderedParam>& out, const std::string& prefix, bool te, bool cross) {
  auto pair = [&](const char* module) {
    out.push_back({prefix + module + ".weight"});
    out.push_back({prefix + module + ".bias"});
  };
  if (!te) pair("input_layernorm");
  pair("self_attention.linear_proj");
  if (te) pair("input_layernorm");
  pair("self_attention.linear_qkv");
  pair("self_attention.q_layernorm");
  pair("self_attention.k_layernorm");
  if (cross) {
    pair("pre_cross_attn_layernorm");
    pair("cross_attention.linear_proj");
    pair("cross_attention.linear_q");
    pair("cross_attention.linear_kv");
  }
  pair("pre_mlp_layernorm");
  pair("mlp.linear_fc1");
  pair("mlp.linear_fc2");
}

void add_block(std::vector<OrderedParam>& out, const std::string& block, int64_t first, int64_t count, bool te,
               bool cross) {
  for (int64_t l = first; l < first + count; ++l)
    add_layer(out, block + ".layers." + std::to_string(l) + ".", te, cross);
}

}  // namespace

std::vector<OrderedParam> family_parameter_order(const BufferModel& m, int p, int P) {
  std::vector<OrderedParam> out;
  const bool te = m.transformer_engine;
  if (m.family == model::ModelFamilyId::t5) {
    MG_REQUIRE(P == 1, "the distributed optimizer's buckets of a T5 model on ", P, " pipeline stages: "
               "Megatron-LM trains T5 without pipeline parallelism (pretrain_t5.py), and so does this build; "
               "save or convert it with --pipeline-model-parallel-size 1");
    for (const char* n : {kWordEmbedding, "embedding.position_embeddings.weight",
                          "encoder_relative_pos_emb.relative_attention_bias.weight",
                          "decoder_relative_pos_emb.relative_attention_bias.weight"})
      out.push_back({n});
    add_block(out, "encoder", 0, m.layers, te, false);
    out.push_back({"encoder.final_layernorm.weight"});
    out.push_back({"encoder.final_layernorm.bias"});
    add_block(out, "decoder", 0, m.decoder_layers, te, true);
    out.push_back({"decoder.final_layernorm.weight"});
    out.push_back({"decoder.final_layernorm.bias"});
    out.push_back({"output_layer.weight"});  // lm_head.output_layer in Megatron's names
    out.push_back({"output_layer.bias"});
    return out;
  }
  MG_REQUIRE(m.family == model::ModelFamilyId::bert, "family_parameter_order: GPT's order is megatron_buffer_layout's");
  MG_REQUIRE(P >= 1 && m.layers % P == 0, m.layers, " layers do not split over ", P, " pipeline stages");
  if (p == 0)
    for (const char* n : {kWordEmbedding, "embedding.position_embeddings.weight",
                          "embedding.tokentype_embeddings.weight"})
      out.push_back({n});
  add_block(out, "encoder", p * (m.layers / P), m.layers / P, te, false);
  if (p == P - 1) {
    for (const char* n : {"encoder.final_layernorm.weight", "encoder.final_layernorm.bias", "lm_head.dense.weight",
                          "lm_head.dense.bias", "lm_head.layer_norm.weight", "lm_head.layer_norm.bias"})
      out.push_back({n});
    // The output layer's weight: its own when untied; tied, the copy of a stage without the embedding.
    if (!m.tied || P > 1) out.push_back({"output_layer.weight", m.tied});
    for (const char* n : {"output_layer.bias", "binary_head.weight", "binary_head.bias", "pooler.dense.weight",
                          "pooler.dense.bias"})
      out.push_back({n});
  }
  return out;
}

std::vector<BufferBucket> model_buffer_layout(const BufferModel& m,
                                              const std::function<std::optional<Shape>(const std::string&)>& local,
                                              int p, int P, int64_t DP, int64_t bucket_size,
                                              std::set<std::string>* placed, int v, int V) {
  if (m.family == model::ModelFamilyId::gpt)
    return megatron_buffer_layout(local, p, P, m.layers, DP, m.tied, bucket_size, placed, m.transformer_engine,
                                  m.experts, v, V);
  MG_REQUIRE(V == 1, "the distributed optimizer's dp_reshardable buffers of BERT and T5 models with virtual "
             "pipeline stages are not laid out by this build");
  std::vector<BufferSlot> order;
  for (const OrderedParam& o : family_parameter_order(m, p, P)) {
    if (o.tied_copy) {
      const std::optional<Shape> s = local(kWordEmbedding);
      MG_REQUIRE(s.has_value(), "the tied word embedding's shape is unknown");
      order.push_back({o.name, *s, 0, true});
    } else if (std::optional<Shape> s = local(o.name)) {
      order.push_back({o.name, *s});
      if (placed != nullptr) placed->insert(o.name);
    }
  }
  return buckets_in_order(order, p, P, DP, m.tied, bucket_size);
}

}  // namespace megatron::training
