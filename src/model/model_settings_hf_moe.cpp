// The mixture-of-experts columns of the model-settings table's Hugging Face mappings
// (model_settings_hf.cpp, hf_config.h): transformers' MixtralForCausalLM ("mixtral") and
// Qwen2MoeForCausalLM ("qwen2_moe"). Both are Llama's decoder (rotary, RMSNorm, SwiGLU,
// grouped-query attention) with sparse MoE blocks, so their columns are the Llama column with
// these rows replaced.
// Both:
//   - the router: softmax over all experts, the top k, then (Mixtral always, Qwen2-MoE with
//     norm_topk_prob) the k weights renormalised to sum 1, which is a softmax over the top-k
//     logits: Megatron-Core's router with softmax scores and no --moe-router-pre-softmax; without
//     the renormalisation, --moe-router-pre-softmax. No top-k scaling (or 1), no group-limited
//     routing, no expert bias, no Sinkhorn routing (it weighs the experts by their scores without
//     renormalising), no forced balancing: each is refused by its name;
//   - num_experts_per_tok; router_aux_loss_coef is --moe-aux-loss-coeff, as Megatron's bridges map
//     it (transformers adds it only with output_router_logits and normalises it otherwise: a
//     training loss, not part of the function); the z-loss, the capacity and token dropping are
//     training-time (generation and evaluation here route every token, as transformers does);
//   - no biases on the linear layers (Qwen2-MoE: on q, k and v only, below).
// Mixtral: num_local_experts; intermediate_size is each expert's width (every layer is an MoE
//   layer, so the dense width is unused and an import sets --ffn-hidden-size to it);
//   sliding_window W: a query sees itself and the W - 1 keys before it (transformers'
//   sliding_window_overlay, kv > q - W), our --window-size W-1 0; MixtralConfig's defaults for
//   absent keys (rms_norm_eps 1e-5, rope_theta 1e6, max_position_embeddings 131072).
// Qwen2-MoE: num_experts, moe_intermediate_size (the experts), intermediate_size (the dense
//   layers), shared_expert_intermediate_size with its sigmoid gate (shared_expert_gate: our
//   --moe-shared-expert-gate, required), norm_topk_prob; the MoE layers are those not in
//   mlp_only_layers with (i + 1) % decoder_sparse_step == 0 (an export writes step 1 and lists the
//   dense layers); biases on q, k and v (qkv_bias, required); heads of hidden / heads channels;
//   no sliding window (use_sliding_window false); Qwen2MoeConfig's defaults for absent keys.
#include <string>

#include "core/error.h"
#include "model/model_settings_hf_internal.h"

namespace megatron::model::hf_table {

namespace {

constexpr size_t kLlamaCol = size_t(HfArch::llama);
constexpr const char* kLlamaIntro = "a rotary model exports as LlamaForCausalLM, which has ";
constexpr const char* kMixtral =
    "a mixture-of-experts model without shared experts exports as MixtralForCausalLM, which has ";
constexpr const char* kQwen =
    "a mixture-of-experts model with shared experts exports as Qwen2MoeForCausalLM, which has ";

// The Llama column's mapping with its refusals speaking of `intro`'s class.
HfMapping from_llama(HfMapping m, const char* intro) {
  if (m.refuse)
    m.refuse = [llama = m.refuse, intro](const TC& c) {
      std::string why = llama(c);
      const std::string from = kLlamaIntro;
      if (const size_t at = why.find(from); at != std::string::npos) why.replace(at, from.size(), intro);
      return why;
    };
  return m;
}

// A setting the class fixes at `ok`'s values: `why` names it otherwise; an import sets `set`.
HfMapping only(std::function<bool(const TC&)> ok, std::function<std::string(const TC&)> why,
               std::function<void(TC&)> set) {
  return fixed([ok, why](const TC& c) { return ok(c) ? std::string() : why(c); },
               [set](const HfConfigFile&, TC& c) { set(c); });
}

// The MoE layer pattern as a list of 0/1 per layer (model/moe).
std::vector<int> pattern(const TC& c) {
  std::vector<int> v;
  for (int i = 0; i < c.num_layers; ++i) v.push_back(c.is_moe_layer(i) ? 1 : 0);
  return v;
}

// A flag-and-value refusal: "FLAG (row): <intro>WHAT".
std::string says(const char* intro, const std::string& flag, const char* row, const char* what) {
  return str(flag, " (", row, "): ", intro, what);
}

// A class's column, filled from the Llama column.
class Column {
 public:
  Column(std::map<std::string, Columns>& t, HfArch arch, const char* intro)
      : t_(t), col_(size_t(arch)), intro_(intro) {
    for (auto& [row, cols] : t_) cols[col_] = from_llama(cols[kLlamaCol], intro_);
  }
  void set(const char* row, HfMapping m) {
    MG_CHECK(t_.count(row), "moe_columns: no row ", row);
    t_[row][col_] = std::move(m);
  }
  const char* intro() const { return intro_; }

 private:
  std::map<std::string, Columns>& t_;
  size_t col_;
  const char* intro_;
};

// The rows both classes share (the router, the training-time settings, no linear biases).
void common_rows(Column& x, const char* experts_key, int64_t experts_fallback, int64_t topk_fallback) {
  const char* in = x.intro();
  x.set("num_moe_experts",
        key({experts_key}, [experts_key](const TC& c, ojson& j) { j[experts_key] = c.num_moe_experts; },
            [experts_key, experts_fallback](const HfConfigFile& h, TC& c) {
              c.num_moe_experts = int(h.integer(experts_key, experts_fallback));
            }));
  x.set("moe_router_topk",
        key({"num_experts_per_tok"},
            [](const TC& c, ojson& j) { j["num_experts_per_tok"] = c.moe_router_topk; },
            [experts_key, topk_fallback](const HfConfigFile& h, TC& c) {
              c.moe_router_topk = int(h.integer("num_experts_per_tok", topk_fallback));
              MG_REQUIRE(c.moe_router_topk <= c.num_moe_experts, h.label, ": num_experts_per_tok ",
                         c.moe_router_topk, " exceeds ", experts_key, " ", c.num_moe_experts);
            }));
  x.set("add_bias_linear",
        only([](const TC& c) { return !c.add_bias_linear; },
             [in](const TC&) {
               return says(in, "--disable-bias-linear missing: biases on the linear layers", "add_bias_linear",
                             "no biases on them");
             },
             [](TC& c) { c.add_bias_linear = false; }));
  x.set("moe_router_score_function",
        only([](const TC& c) { return c.moe_router_score_function == "softmax"; },
             [in](const TC& c) {
               return says(in, "--moe-router-score-function " + c.moe_router_score_function,
                             "moe_router_score_function", "a softmax router");
             },
             [](TC& c) { c.moe_router_score_function = "softmax"; }));
  x.set("moe_router_topk_scaling_factor",
        only([](const TC& c) {
               return c.moe_router_topk_scaling_factor == 0 || c.moe_router_topk_scaling_factor == 1;
             },
             [in](const TC& c) {
               return says(in, str("--moe-router-topk-scaling-factor ", c.moe_router_topk_scaling_factor),
                             "moe_router_topk_scaling_factor", "unscaled routing weights");
             },
             [](TC& c) { c.moe_router_topk_scaling_factor = 0; }));
  for (const char* row : {"moe_router_num_groups", "moe_router_group_topk"})
    x.set(row, only([](const TC& c) { return c.moe_router_num_groups == 0 && c.moe_router_group_topk == 0; },
                    [in](const TC& c) {
                      return says(in, str("--moe-router-num-groups ", c.moe_router_num_groups,
                                        " --moe-router-group-topk ", c.moe_router_group_topk),
                                    "moe_router_num_groups, moe_router_group_topk", "no group-limited routing");
                    },
                    [](TC& c) { c.moe_router_num_groups = c.moe_router_group_topk = 0; }));
  x.set("moe_router_enable_expert_bias",
        only([](const TC& c) { return !c.moe_router_enable_expert_bias; },
             [in](const TC&) {
               return says(in, "--moe-router-enable-expert-bias", "moe_router_enable_expert_bias",
                             "no expert bias in the choice of experts");
             },
             [](TC& c) { c.moe_router_enable_expert_bias = false; }));
  x.set("moe_router_force_load_balancing",
        only([](const TC& c) { return !c.moe_router_force_load_balancing; },
             [in](const TC&) {
               return says(in, "--moe-router-force-load-balancing (a benchmark's random routing)",
                             "moe_router_force_load_balancing", "the gate's routing");
             },
             [](TC& c) { c.moe_router_force_load_balancing = false; }));
  HfMapping balancing = dropped(
      "the training loss only: transformers' load-balancing loss is the batch's (aux_loss, "
      "router_aux_loss_coef); an import takes aux_loss",
      [](const HfConfigFile&, TC& c) { c.moe_router_load_balancing_type = "aux_loss"; });
  balancing.refuse = [in](const TC& c) {
    return c.moe_router_load_balancing_type != "sinkhorn"
               ? std::string()
               : says(in, "--moe-router-load-balancing-type sinkhorn (routing weighed by the scores "
                        "without renormalising)", "moe_router_load_balancing_type", "a softmax router");
  };
  x.set("moe_router_load_balancing_type", balancing);
  x.set("moe_aux_loss_coeff", float_key({"router_aux_loss_coef"}, &TC::moe_aux_loss_coeff, 0.001, 'n'));
  x.set("moe_z_loss_coeff", dropped("a training loss transformers' MoE classes do not have: no effect "
                                    "on the exported function; an import takes 0"));
  const HfMapping capacity = dropped(
      "training-time capacity and token dropping: generation and evaluation route every token, as "
      "transformers does; an import takes none");
  for (const char* row : {"moe_expert_capacity_factor", "moe_token_drop_policy", "moe_pad_expert_input_to_capacity"})
    x.set(row, capacity);
  x.set("moe_router_bias_update_rate", dropped("no effect without the expert bias (refused)"));
  x.set("moe_grouped_gemm", weights("the experts' tensor names: the export reads the sequential "
                                    "(local_experts) and the grouped (linear_fc1.weight<e>) layouts; "
                                    "an import writes the sequential one"));
  x.set("moe_token_dispatcher_type", dropped("a run setting: how tokens reach other ranks' experts"));
}

void mixtral_column(std::map<std::string, Columns>& t) {
  Column x(t, HfArch::mixtral, kMixtral);
  const char* in = kMixtral;
  common_rows(x, "num_local_experts", 8, 2);
  x.set("max_position_embeddings", int_key("max_position_embeddings", &TC::max_position_embeddings, 4096 * 32));
  x.set("layernorm_epsilon", float_key({"rms_norm_eps"}, &TC::layernorm_epsilon, 1e-5, 'p'));
  x.set("rotary_base", key({"rope_theta"}, [](const TC& c, ojson& j) { j["rope_theta"] = c.rotary_base; },
                           [](const HfConfigFile& h, TC& c) {
                             c.rotary_base = h.number("rope_theta", 1e6, /*positive=*/true);
                           }));
  x.set("ffn_hidden_size",
        key({"intermediate_size"}, [](const TC& c, ojson& j) { j["intermediate_size"] = c.moe_ffn(); },
            [](const HfConfigFile& h, TC& c) {
              c.ffn_hidden_size = int(h.integer("intermediate_size", 14336));
              c.moe_ffn_hidden_size = 0;
            }));
  x.set("moe_ffn_hidden_size", weights("intermediate_size (the ffn_hidden_size row): the experts' "
                                       "width; every layer is an MoE layer, so an import sets "
                                       "--ffn-hidden-size to it and leaves this 0"));
  x.set("window_size",
        key({"sliding_window"},
            [](const TC& c, ojson& j) {
              j["sliding_window"] = c.window_left >= 0 ? ojson(c.window_left + 1) : ojson(nullptr);
            },
            [](const HfConfigFile& h, TC& c) {
              if (!h.find("sliding_window")) {
                c.window_left = c.window_right = -1;
                return;
              }
              c.window_left = h.integer("sliding_window", std::nullopt, INT32_MAX) - 1;
              c.window_right = 0;
            },
            [in](const TC& c) {
              return c.window_right <= 0 ? std::string()
                                         : says(in, str("--window-size ", c.window_left, " ", c.window_right),
                                                "window_size", "causal windows only (RIGHT 0)");
            }));
  x.set("add_qkv_bias",
        only([](const TC& c) { return !c.qkv_bias(); },
             [in](const TC&) { return says(in, "--add-qkv-bias", "add_qkv_bias", "no biases"); },
             [](TC& c) { c.add_qkv_bias = false; }));
  x.set("moe_layer_freq",
        only([](const TC& c) { return pattern(c) == std::vector<int>(size_t(c.num_layers), 1); },
             [in](const TC& c) {
               return says(in, "--moe-layer-freq " + c.moe_layer_freq, "moe_layer_freq",
                           "an MoE block in every layer");
             },
             [](TC& c) { c.moe_layer_freq = "1"; }));
  x.set("moe_router_pre_softmax",
        only([](const TC& c) { return !c.moe_router_pre_softmax; },
             [in](const TC&) {
               return says(in, "--moe-router-pre-softmax", "moe_router_pre_softmax",
                           "the top-k weights renormalised to sum 1 (a softmax over the top-k logits), "
                           "not the softmax over all experts");
             },
             [](TC& c) { c.moe_router_pre_softmax = false; }));
  x.set("moe_shared_expert_intermediate_size",
        only([](const TC& c) { return c.moe_shared_expert_intermediate_size == 0; },
             [in](const TC& c) {
               return says(in, str("--moe-shared-expert-intermediate-size ", c.moe_shared_expert_intermediate_size),
                           "moe_shared_expert_intermediate_size", "no shared expert");
             },
             [](TC& c) { c.moe_shared_expert_intermediate_size = 0; }));
  x.set("moe_shared_expert_gate",
        only([](const TC& c) { return !c.moe_shared_expert_gate; },
             [in](const TC&) { return says(in, "--moe-shared-expert-gate", "moe_shared_expert_gate", "no shared expert"); },
             [](TC& c) { c.moe_shared_expert_gate = false; }));
}

void qwen2_moe_column(std::map<std::string, Columns>& t) {
  Column x(t, HfArch::qwen2_moe, kQwen);
  const char* in = kQwen;
  common_rows(x, "num_experts", 60, 4);
  x.set("max_position_embeddings", int_key("max_position_embeddings", &TC::max_position_embeddings, 32768));
  // (Llama's rows for intermediate_size, rms_norm_eps and rope_theta have Qwen2MoeConfig's defaults.)
  x.set("moe_ffn_hidden_size",
        key({"moe_intermediate_size"}, [](const TC& c, ojson& j) { j["moe_intermediate_size"] = c.moe_ffn(); },
            [](const HfConfigFile& h, TC& c) {  // (0 when it is the dense width, as --moe-ffn-hidden-size)
              const int64_t f = h.integer("moe_intermediate_size", 1408);
              c.moe_ffn_hidden_size = f == c.ffn() ? 0 : int(f);
            }));
  x.set("kv_channels",
        fixed([in](const TC& c) {
                return int64_t(c.head_dim()) * c.num_attention_heads == c.hidden_size
                           ? std::string()
                           : says(in, str("--kv-channels ", c.head_dim()), "kv_channels",
                                  "heads of hidden-size / num-attention-heads channels only");
              },
              [](const HfConfigFile& h, TC& c) {
                MG_REQUIRE(c.hidden_size % c.num_attention_heads == 0, h.label, ": hidden_size ",
                           c.hidden_size, " is not divisible by num_attention_heads ", c.num_attention_heads);
                if (h.find("head_dim") && h.integer("head_dim") * c.num_attention_heads != c.hidden_size)
                  h.unsupported("head_dim", "Qwen2-MoE's heads have hidden_size / num_attention_heads channels");
                c.kv_channels = 0;
              }));
  x.set("window_size",
        fixed([in](const TC& c) {
                return c.window_left < 0 && c.window_right <= 0
                           ? std::string()
                           : says(in, str("--window-size ", c.window_left, " ", c.window_right), "window_size",
                                  "full attention here (use_sliding_window false)");
              },
              [](const HfConfigFile& h, TC& c) {
                if (h.boolean("use_sliding_window", false))
                  h.unsupported("use_sliding_window", "sliding windows on only some layers "
                                "(max_window_layers) are not built");
                c.window_left = c.window_right = -1;
              },
              [](const TC&, ojson& j) { j["use_sliding_window"] = false; }));
  x.set("add_qkv_bias",
        fixed([in](const TC& c) {
                return c.qkv_bias() ? std::string()
                                    : says(in, "--add-qkv-bias missing", "add_qkv_bias", "biases on q, k and v");
              },
              [](const HfConfigFile& h, TC& c) {
                if (!h.boolean("qkv_bias", true))
                  h.unsupported("qkv_bias", "Qwen2-MoE has biases on q, k and v (older transformers "
                                "always builds them)");
                c.add_qkv_bias = true;
              },
              [](const TC&, ojson& j) { j["qkv_bias"] = true; }));
  x.set("moe_layer_freq",
        key({"decoder_sparse_step", "mlp_only_layers"},
            [](const TC& c, ojson& j) {
              ojson dense = ojson::array();
              const std::vector<int> p = pattern(c);
              for (size_t i = 0; i < p.size(); ++i)
                if (!p[i]) dense.push_back(i);
              j["decoder_sparse_step"] = 1;
              j["mlp_only_layers"] = dense;
            },
            [](const HfConfigFile& h, TC& c) {
              const int64_t step = h.integer("decoder_sparse_step", 1);
              std::vector<int> p(size_t(c.num_layers), 0);
              for (int i = 0; i < c.num_layers; ++i) p[size_t(i)] = (i + 1) % step == 0;
              if (const auto* only_dense = h.find("mlp_only_layers")) {
                MG_REQUIRE(only_dense->is_array(), h.label, ": \"mlp_only_layers\" must be a list of layer numbers");
                for (const auto& v : *only_dense) {
                  MG_REQUIRE(v.is_number_unsigned() && v.get<uint64_t>() < uint64_t(c.num_layers), h.label,
                             ": \"mlp_only_layers\" holds ", v.dump(), ", not a layer number in [0, ",
                             c.num_layers, ")");
                  p[v.get<size_t>()] = 0;
                }
              }
              if (p == std::vector<int>(size_t(c.num_layers), 1)) {
                c.moe_layer_freq = "1";
                return;
              }
              std::string list = "[";
              for (size_t i = 0; i < p.size(); ++i) list += (i ? "," : "") + std::to_string(p[i]);
              c.moe_layer_freq = list + "]";
            }));
  x.set("moe_router_pre_softmax",
        key({"norm_topk_prob"}, [](const TC& c, ojson& j) { j["norm_topk_prob"] = !c.moe_router_pre_softmax; },
            [](const HfConfigFile& h, TC& c) { c.moe_router_pre_softmax = !h.boolean("norm_topk_prob", false); }));
  x.set("moe_shared_expert_intermediate_size",
        key({"shared_expert_intermediate_size"},
            [](const TC& c, ojson& j) { j["shared_expert_intermediate_size"] = c.moe_shared_expert_intermediate_size; },
            [](const HfConfigFile& h, TC& c) {
              c.moe_shared_expert_intermediate_size = int(h.integer("shared_expert_intermediate_size", 5632));
            },
            [in](const TC& c) {
              return c.moe_shared_expert_intermediate_size > 0
                         ? std::string()
                         : says(in, "--moe-shared-expert-intermediate-size 0", "moe_shared_expert_intermediate_size",
                                "a shared expert");
            }));
  x.set("moe_shared_expert_gate",
        only([](const TC& c) { return c.moe_shared_expert_gate; },
             [in](const TC&) {
               return says(in, "--moe-shared-expert-gate missing", "moe_shared_expert_gate",
                           "a sigmoid gate on the shared expert (shared_expert_gate)");
             },
             [](TC& c) { c.moe_shared_expert_gate = true; }));
}

}  // namespace

void moe_columns(std::map<std::string, Columns>& t) {
  mixtral_column(t);
  qwen2_moe_column(t);
}

}  // namespace megatron::model::hf_table
