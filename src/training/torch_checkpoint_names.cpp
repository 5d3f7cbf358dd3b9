// Megatron-LM's parameter names (legacy and Megatron-Core, local and Transformer Engine layer
// specs) and ours, and the QKV orderings of old checkpoint versions; see torch_checkpoint.h.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "training/torch_checkpoint.h"

namespace megatron::training::torch_names {

namespace {

// "layers.<n>.<rest>" -> n and rest; false when `s` is not of that form.
bool split_layer(const std::string& s, const std::string& prefix, int* n, std::string* rest) {
  if (!s.starts_with(prefix)) return false;
  size_t i = prefix.size(), end = i;
  while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end])) && end - i < 6) ++end;
  if (end == i || end >= s.size() || s[end] != '.') return false;
  *n = std::stoi(s.substr(i, end - i));
  *rest = s.substr(end + 1);
  return true;
}

bool replace_prefix(std::string& s, const std::string& from, const std::string& to) {
  if (!s.starts_with(from)) return false;
  s = to + s.substr(from.size());
  return true;
}

[[noreturn]] void no_place(const std::string& name, const std::string& block) {
  if (block == "encoder" && (name.starts_with("lm_head.") || name.starts_with("output_layer.")))
    MG_THROW("tensor '", name, "' has no place in a BERT model's masked-LM head: read are "
             "Megatron-Core's lm_head.dense, lm_head.layer_norm (or lm_head.layernorm), "
             "output_layer.{weight,bias}, the earlier lm_head.output_layer.{weight,bias} and "
             "lm_head.bias, and the legacy model's names");
  MG_THROW("tensor '", name, "' has no place in a ", block == "encoder" ? "BERT" : "GPT",
           " model (another family's checkpoint? GPT, BERT and T5 checkpoints are read)");
}

// A layer's module names in Megatron-Core's form: Transformer Engine's fused norms unfused.
std::string core_layer_rest(std::string m) {
  if (m == "self_attention.linear_qkv.layer_norm_weight") return "input_layernorm.weight";
  if (m == "self_attention.linear_qkv.layer_norm_bias") return "input_layernorm.bias";
  if (m == "mlp.linear_fc1.layer_norm_weight") return "pre_mlp_layernorm.weight";
  if (m == "mlp.linear_fc1.layer_norm_bias") return "pre_mlp_layernorm.bias";
  return m;
}

}  // namespace

std::string family_of(const std::vector<std::string>& names) {
  bool encoder = false, decoder = false, bert_heads = false;
  for (const std::string& n : names) {
    const std::string s = n.starts_with("language_model.") ? n.substr(15) : n;
    encoder = encoder || s.starts_with("encoder.");
    decoder = decoder || s.starts_with("decoder.");
    bert_heads = bert_heads || s.starts_with("lm_head.") || s.starts_with("binary_head.") ||
                 s.starts_with("pooler.") || s.starts_with("embedding.tokentype_embeddings.");
  }
  if (encoder && decoder) return "t5";  // T5Model: an encoder and a decoder block
  // Megatron-Core's BERT has "encoder." layers; the legacy one shares GPT's "language_model.encoder."
  // and is told apart by its heads.
  const bool core_encoder = std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.starts_with("encoder.");
  });
  return core_encoder || bert_heads ? "bert" : "gpt";
}

std::string to_ours(const std::string& name, int layer_offset, bool tied, bool* tied_copy,
                    bool* legacy_qkv, const std::string& block) {
  *tied_copy = false;
  *legacy_qkv = false;
  const std::string b = block + ".";
  if (name.ends_with("_extra_state") || name.ends_with("inv_freq")) return "";
  if (name == "word_embeddings_for_head.weight") {
    *tied_copy = true;
    return "output_layer.weight";
  }
  int n = 0;
  std::string rest;
  if (name.starts_with("language_model.")) {  // legacy (megatron/model)
    const std::string r = name.substr(15);
    if (r == "embedding.word_embeddings.weight" || r == "embedding.position_embeddings.weight" ||
        r == "output_layer.weight" ||
        (block == "encoder" && (r == "embedding.tokentype_embeddings.weight" ||
                                r.starts_with("pooler.dense."))))
      return r;
    for (const char* stack : {"encoder.", "transformer."}) {
      if (!r.starts_with(stack)) continue;
      const std::string t = r.substr(std::string(stack).size());
      if (t.starts_with("final_layernorm.") || t.starts_with("final_norm."))
        return b + "final_layernorm." + t.substr(t.find('.') + 1);
      if (!split_layer(t, "layers.", &n, &rest)) no_place(name, block);
      std::string m = rest;
      if (replace_prefix(m, "self_attention.query_key_value.", "self_attention.linear_qkv.") ||
          replace_prefix(m, "attention.query_key_value.", "self_attention.linear_qkv.")) {
        *legacy_qkv = true;
      } else if (!(replace_prefix(m, "self_attention.dense.", "self_attention.linear_proj.") ||
                   replace_prefix(m, "attention.dense.", "self_attention.linear_proj.") ||
                   replace_prefix(m, "post_attention_layernorm.", "pre_mlp_layernorm.") ||
                   replace_prefix(m, "mlp.dense_h_to_4h.", "mlp.linear_fc1.") ||
                   replace_prefix(m, "mlp.dense_4h_to_h.", "mlp.linear_fc2.") ||
                   m.starts_with("input_layernorm."))) {
        no_place(name, block);
      }
      return b + "layers." + std::to_string(n + layer_offset) + "." + m;
    }
    no_place(name, block);
  }
  if (block == "encoder") {  // BERT's heads: Megatron-Core's names, and the legacy model's
    // lm_head.bias: the legacy model's and an earlier Megatron-Core head's own bias;
    // lm_head.output_layer: earlier Megatron-Core heads kept the output layer inside them.
    if (name == "lm_head.bias" || name == "lm_head.output_layer.bias") return "output_layer.bias";
    if (name == "lm_head.output_layer.weight") {
      *tied_copy = tied;
      return "output_layer.weight";
    }
    std::string m = name;
    if (replace_prefix(m, "lm_head.layernorm.", "lm_head.layer_norm.")) return m;
    if (name.starts_with("lm_head.dense.") || name.starts_with("lm_head.layer_norm.") ||
        name.starts_with("pooler.dense.") || name.starts_with("binary_head.") ||
        name == "output_layer.bias")
      return name;
  }
  if (name.ends_with(".mlp.experts.weight1") || name.ends_with(".mlp.experts.weight2"))
    MG_THROW("tensor '", name, "' is the legacy GroupedMLP's (--moe-use-legacy-grouped-gemm, or "
             "--moe-grouped-gemm with the local layer spec), which is not read: save the "
             "checkpoint from Megatron-LM with Transformer Engine's TEGroupedMLP "
             "(mlp.experts.linear_fc1.weightN) or SequentialMLP (mlp.experts.local_experts.N)");
  if (name.starts_with("embedding.")) return name;  // Megatron-Core
  if (split_layer(name, b + "layers.", &n, &rest))
    return b + "layers." + std::to_string(n + layer_offset) + "." + core_layer_rest(rest);
  if (name.starts_with(b + "final_layernorm.") || name.starts_with(b + "final_norm."))
    return b + "final_layernorm." + name.substr(name.find('.', b.size()) + 1);
  if (name == "output_layer.weight") {
    *tied_copy = tied;
    return name;
  }
  no_place(name, block);
}

std::string to_megatron(const std::string& ours, int layer_offset, bool transformer_engine) {
  int n = 0;
  std::string rest;
  for (const std::string b : {"decoder.", "encoder."}) {
    if (!split_layer(ours, b + "layers.", &n, &rest)) continue;
    if (transformer_engine) {
      if (rest == "input_layernorm.weight") rest = "self_attention.linear_qkv.layer_norm_weight";
      else if (rest == "input_layernorm.bias") rest = "self_attention.linear_qkv.layer_norm_bias";
      else if (rest == "pre_mlp_layernorm.weight") rest = "mlp.linear_fc1.layer_norm_weight";
      else if (rest == "pre_mlp_layernorm.bias") rest = "mlp.linear_fc1.layer_norm_bias";
    }
    return b + "layers." + std::to_string(n - layer_offset) + "." + rest;
  }
  return ours;
}

std::vector<std::string> extra_state_names(int local_layer, bool transformer_engine,
                                           const std::string& block) {
  const std::string p = block + ".layers." + std::to_string(local_layer) + ".";
  std::vector<std::string> names;
  if (transformer_engine) names.push_back(p + "self_attention.core_attention._extra_state");
  for (const char* m : {"self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1",
                        "mlp.linear_fc2"})
    names.push_back(p + m + "._extra_state");
  return names;
}

namespace {

// Where the expert number of an expert weight's name is: [at, at + len), or {npos, 0}.
std::pair<size_t, size_t> expert_digits(const std::string& name) {
  static const std::string seq = ".mlp.experts.local_experts.";
  if (const size_t at = name.find(seq); at != std::string::npos) {
    const size_t b = at + seq.size();
    size_t e = b;
    while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
    if (e > b && e < name.size() && name[e] == '.') return {b, e - b};
    return {std::string::npos, 0};
  }
  // TEGroupedMLP: mlp.experts.linear_fc{1,2}.{weight,bias}J
  for (const char* g : {".mlp.experts.linear_fc1.", ".mlp.experts.linear_fc2."}) {
    const size_t at = name.find(g);
    if (at == std::string::npos) continue;
    size_t b = at + std::string(g).size();
    const std::string rest = name.substr(b);
    const size_t stem = rest.starts_with("weight") ? 6 : rest.starts_with("bias") ? 4 : 0;
    if (stem == 0) continue;
    b += stem;
    size_t e = b;
    while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
    if (e > b && e == name.size()) return {b, e - b};
  }
  return {std::string::npos, 0};
}

}  // namespace

int expert_number(const std::string& name) {
  const auto [at, len] = expert_digits(name);
  if (at == std::string::npos || len > 6) return -1;
  return std::stoi(name.substr(at, len));
}

std::string shift_expert(const std::string& name, int delta) {
  const auto [at, len] = expert_digits(name);
  if (at == std::string::npos || delta == 0) return name;
  const int n = std::stoi(name.substr(at, len)) + delta;
  MG_CHECK(n >= 0, "shift_expert: '", name, "' by ", delta);
  return name.substr(0, at) + std::to_string(n) + name.substr(at + len);
}

std::vector<std::string> moe_extra_state_names(int local_layer, bool transformer_engine,
                                               int local_experts, bool grouped, bool shared,
                                               const std::string& block) {
  const std::string p = block + ".layers." + std::to_string(local_layer) + ".";
  std::vector<std::string> names;
  if (transformer_engine) names.push_back(p + "self_attention.core_attention._extra_state");
  for (const char* m : {"self_attention.linear_proj", "self_attention.linear_qkv"})
    names.push_back(p + m + "._extra_state");
  // TEGroupedMLP's two GroupedLinear modules; the legacy GroupedMLP (local spec) has none.
  if (grouped && transformer_engine)
    for (const char* m : {"mlp.experts.linear_fc1", "mlp.experts.linear_fc2"})
      names.push_back(p + m + "._extra_state");
  if (!grouped)
    for (int j = 0; j < local_experts; ++j)
      for (const char* m : {".linear_fc1", ".linear_fc2"})
        names.push_back(p + "mlp.experts.local_experts." + std::to_string(j) + m + "._extra_state");
  if (shared)
    for (const char* m : {"mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"})
      names.push_back(p + m + "._extra_state");
  return names;
}

// ---- T5 (Megatron-Core's T5Model, t5_spec.py's local and Transformer Engine layer specs) ----
//   embedding.word_embeddings.weight, embedding.position_embeddings.weight (learned_absolute)
//   {encoder,decoder}_relative_pos_emb.relative_attention_bias.weight  [buckets, heads], whole on
//                                                    every tensor-parallel rank (relative)
//   encoder.layers.N.{input_layernorm, self_attention.{linear_qkv, linear_proj}, pre_mlp_layernorm,
//                     mlp.{linear_fc1, linear_fc2}}.*           (TE: the norms fused as GPT's)
//   decoder.layers.N.{... self-attention ..., pre_cross_attn_layernorm (a TENorm of its own),
//                     cross_attention.{linear_q, linear_kv, linear_proj}, ... MLP ...}.*
//   {encoder,decoder}.final_layernorm.*
//   lm_head.output_layer.bias (tied) or lm_head.output_layer.weight (untied): T5LMHead's, and
//   output_layer.* again: T5Model registers the same module a second time as self.output_layer,
//   so its state dict holds both names (named_parameters, hence the optimizer, only the first).

std::string t5_to_ours(const std::string& name, bool* alias) {
  *alias = false;
  if (name.ends_with("_extra_state")) return "";
  auto refuse = [&] {
    MG_THROW("tensor '", name, "' has no place in Megatron-Core's T5Model (read are embedding.*, "
             "encoder_relative_pos_emb.*, decoder_relative_pos_emb.*, encoder.layers.*, "
             "decoder.layers.*, the final norms and lm_head.output_layer.*; the legacy "
             "megatron/model T5 (language_model.*) is not read)");
  };
  if (name == "embedding.word_embeddings.weight" || name == "embedding.position_embeddings.weight" ||
      name == "encoder_relative_pos_emb.relative_attention_bias.weight" ||
      name == "decoder_relative_pos_emb.relative_attention_bias.weight")
    return name;
  if (name == "lm_head.output_layer.weight" || name == "lm_head.output_layer.bias")
    return name.substr(8);
  if (name == "output_layer.weight" || name == "output_layer.bias") {
    *alias = true;
    return name;
  }
  int n = 0;
  std::string rest;
  for (const std::string b : {"encoder.", "decoder."}) {
    if (split_layer(name, b + "layers.", &n, &rest)) return b + "layers." + std::to_string(n) + "." + core_layer_rest(rest);
    if (name.starts_with(b + "final_layernorm.") || name.starts_with(b + "final_norm."))
      return b + "final_layernorm." + name.substr(name.find('.', b.size()) + 1);
  }
  refuse();
  return "";
}

std::string t5_to_megatron(const std::string& ours, bool transformer_engine) {
  if (ours == "output_layer.weight" || ours == "output_layer.bias") return "lm_head." + ours;
  return to_megatron(ours, 0, transformer_engine);
}

std::vector<std::string> t5_extra_state_names(int layer, bool transformer_engine,
                                              const std::string& block) {
  std::vector<std::string> names = extra_state_names(layer, transformer_engine, block);
  if (block != "decoder") return names;
  const std::string p = block + ".layers." + std::to_string(layer) + ".cross_attention.";
  if (transformer_engine) names.push_back(p + "core_attention._extra_state");
  for (const char* m : {"linear_proj", "linear_q", "linear_kv"}) names.push_back(p + m + "._extra_state");
  return names;
}

Tensor fix_qkv_ordering(const Tensor& t, double version, int heads, int head_dim,
                        const std::string& label) {
  if (version >= 2.0) return t;
  MG_REQUIRE(version == 0.0 || version == 1.0, label, ": checkpoint_version ", version,
             " is not one Megatron-LM wrote (0, 1.0, 2.0 or 3.0)");
  const int64_t rows = int64_t(3) * heads * head_dim;
  MG_REQUIRE(t.dim() >= 1 && t.dim() <= 2 && t.size(0) == rows, label, ": query_key_value of shape ",
             shape_str(t.shape()), " is not [3 x ", heads, " heads x ", head_dim,
             " channels, ...] (check --num-attention-heads and --kv-channels)");
  Shape tail;
  if (t.dim() == 2) tail.push_back(t.size(1));
  const Tensor c = t.contiguous();
  Tensor fixed;
  if (version == 0.0) {  // [3, n, d, ...] -> [n, 3, d, ...]
    Shape s = {3, heads, head_dim};
    s.insert(s.end(), tail.begin(), tail.end());
    fixed = c.view(s).transpose(0, 1).contiguous();
  } else {  // [n, d, 3, ...] -> [n, 3, d, ...]
    Shape s = {heads, head_dim, 3};
    s.insert(s.end(), tail.begin(), tail.end());
    fixed = c.view(s).transpose(1, 2).contiguous();
  }
  return fixed.view(t.shape());
}

}  // namespace megatron::training::torch_names
