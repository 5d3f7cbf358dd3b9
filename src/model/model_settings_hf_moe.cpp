// The mixture-of-experts column of the model-settings table's Hugging Face mappings
// (model_settings_hf.cpp, hf_config.h): transformers' MixtralForCausalLM ("mixtral"). Mixtral is
// Llama's decoder (rotary, RMSNorm, SwiGLU, grouped-query attention, no biases) with a sparse MoE
// block in every layer, so its column is the Llama column with these rows replaced:
//   - the experts: num_local_experts, num_experts_per_tok, intermediate_size (each expert's
//     width; every layer is an MoE layer, so the dense width is unused and an import sets
//     --ffn-hidden-size to it);
//   - the router (MixtralSparseMoeBlock): softmax over all experts, top-k, the k weights
//     renormalised to sum 1. That is a softmax over the top-k logits, Megatron-Core's router with
//     the softmax score function, no pre-softmax, no top-k scaling (or 1), no group-limited
//     routing and no expert bias: each other setting is refused by its name;
//   - the load-balancing loss: router_aux_loss_coef is --moe-aux-loss-coeff, as Megatron's bridges
//     map it (transformers adds it only with output_router_logits, and normalises it otherwise:
//     it is a training loss, not part of the function); Sinkhorn routing chooses and weighs the
//     experts differently and is refused; the z-loss, the capacity and token dropping are
//     training-time (generation and evaluation here route every token, as Mixtral does);
//   - sliding_window: a query sees itself and the sliding_window - 1 keys before it
//     (transformers' sliding_window_overlay, kv > q - W), our --window-size W-1 0;
//   - no biases: MixtralForCausalLM has none (attention_bias / mlp_bias are not its keys);
//   - the defaults of MixtralConfig for absent keys (rms_norm_eps 1e-5, rope_theta 1e6,
//     max_position_embeddings 131072).
#include <string>

#include "core/error.h"
#include "model/model_settings_hf_internal.h"

namespace megatron::model::hf_table {

namespace {

constexpr size_t kLlamaCol = size_t(HfArch::llama), kMixtralCol = size_t(HfArch::mixtral);
constexpr const char* kLlamaIntro = "a rotary model exports as LlamaForCausalLM, which has ";
constexpr const char* kMixtral =
    "a mixture-of-experts model exports as MixtralForCausalLM, which has ";

// The Llama column's mapping with its refusals speaking of Mixtral.
HfMapping as_mixtral(HfMapping m) {
  if (m.refuse)
    m.refuse = [llama = m.refuse](const TC& c) {
      std::string why = llama(c);
      const std::string from = kLlamaIntro;
      if (const size_t at = why.find(from); at != std::string::npos) why.replace(at, from.size(), kMixtral);
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

}  // namespace

void mixtral_columns(std::map<std::string, Columns>& t) {
  for (auto& [row, cols] : t) cols[kMixtralCol] = as_mixtral(cols[kLlamaCol]);
  auto set = [&](const char* row, HfMapping m) {
    MG_CHECK(t.count(row), "mixtral_columns: no row ", row);
    t[row][kMixtralCol] = std::move(m);
  };

  // ---- MixtralConfig's own defaults
  set("max_position_embeddings",
      int_key("max_position_embeddings", &TC::max_position_embeddings, 4096 * 32));
  set("layernorm_epsilon", float_key({"rms_norm_eps"}, &TC::layernorm_epsilon, 1e-5, 'p'));
  set("rotary_base", key({"rope_theta"}, [](const TC& c, ojson& j) { j["rope_theta"] = c.rotary_base; },
                         [](const HfConfigFile& h, TC& c) {
                           c.rotary_base = h.number("rope_theta", 1e6, /*positive=*/true);
                         }));
  set("ffn_hidden_size",
      key({"intermediate_size"}, [](const TC& c, ojson& j) { j["intermediate_size"] = c.moe_ffn(); },
          [](const HfConfigFile& h, TC& c) {
            c.ffn_hidden_size = int(h.integer("intermediate_size", 14336));
            c.moe_ffn_hidden_size = 0;
          }));
  set("moe_ffn_hidden_size", weights("intermediate_size (the ffn_hidden_size row): the experts' "
                                     "width; every layer is an MoE layer, so an import sets "
                                     "--ffn-hidden-size to it and leaves this 0"));

  // ---- attention: a sliding window, no biases
  set("window_size",
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
          [](const TC& c) {
            return c.window_right <= 0 ? std::string()
                                       : str("--window-size ", c.window_left, " ", c.window_right,
                                             " (window_size): ", kMixtral, "causal windows only (RIGHT 0)");
          }));
  set("add_bias_linear",
      only([](const TC& c) { return !c.add_bias_linear; },
           [](const TC&) { return str("biases on the linear layers (add_bias_linear; train with "
                                      "--disable-bias-linear): ", kMixtral, "none"); },
           [](TC& c) { c.add_bias_linear = false; }));
  set("add_qkv_bias",
      only([](const TC& c) { return !c.qkv_bias(); },
           [](const TC&) { return str("--add-qkv-bias (add_qkv_bias): ", kMixtral, "no biases"); },
           [](TC& c) { c.add_qkv_bias = false; }));

  // ---- the experts and the router
  set("num_moe_experts",
      key({"num_local_experts"}, [](const TC& c, ojson& j) { j["num_local_experts"] = c.num_moe_experts; },
          [](const HfConfigFile& h, TC& c) { c.num_moe_experts = int(h.integer("num_local_experts", 8)); },
          [](const TC& c) {
            return c.num_moe_experts > 0 ? std::string()
                                         : str("--num-experts 0 (num_moe_experts): ", kMixtral, "experts");
          }));
  set("moe_router_topk",
      key({"num_experts_per_tok"},
          [](const TC& c, ojson& j) { j["num_experts_per_tok"] = c.moe_router_topk; },
          [](const HfConfigFile& h, TC& c) {
            c.moe_router_topk = int(h.integer("num_experts_per_tok", 2));
            MG_REQUIRE(c.moe_router_topk <= c.num_moe_experts, h.label, ": num_experts_per_tok ",
                       c.moe_router_topk, " exceeds num_local_experts ", c.num_moe_experts);
          }));
  set("moe_layer_freq",
      only(
          [](const TC& c) {
            for (int i = 0; i < c.num_layers; ++i)
              if (!c.is_moe_layer(i)) return false;
            return true;
          },
          [](const TC& c) {
            return str("--moe-layer-freq ", c.moe_layer_freq, " (moe_layer_freq): ", kMixtral,
                       "an MoE block in every layer");
          },
          [](TC& c) { c.moe_layer_freq = "1"; }));
  set("moe_router_score_function",
      only([](const TC& c) { return c.moe_router_score_function == "softmax"; },
           [](const TC& c) {
             return str("--moe-router-score-function ", c.moe_router_score_function,
                        " (moe_router_score_function): ", kMixtral, "a softmax router");
           },
           [](TC& c) { c.moe_router_score_function = "softmax"; }));
  set("moe_router_pre_softmax",
      only([](const TC& c) { return !c.moe_router_pre_softmax; },
           [](const TC&) {
             return str("--moe-router-pre-softmax (moe_router_pre_softmax): ", kMixtral,
                        "the top-k weights renormalised to sum 1 (a softmax over the top-k logits), "
                        "not the softmax over all experts");
           },
           [](TC& c) { c.moe_router_pre_softmax = false; }));
  set("moe_router_topk_scaling_factor",
      only([](const TC& c) {
             return c.moe_router_topk_scaling_factor == 0 || c.moe_router_topk_scaling_factor == 1;
           },
           [](const TC& c) {
             return str("--moe-router-topk-scaling-factor ", c.moe_router_topk_scaling_factor,
                        " (moe_router_topk_scaling_factor): ", kMixtral, "unscaled routing weights");
           },
           [](TC& c) { c.moe_router_topk_scaling_factor = 0; }));
  for (const char* row : {"moe_router_num_groups", "moe_router_group_topk"})
    set(row, only([](const TC& c) { return c.moe_router_num_groups == 0 && c.moe_router_group_topk == 0; },
                  [](const TC& c) {
                    return str("--moe-router-num-groups ", c.moe_router_num_groups, " --moe-router-group-topk ",
                               c.moe_router_group_topk, " (moe_router_num_groups, moe_router_group_topk): ",
                               kMixtral, "no group-limited routing");
                  },
                  [](TC& c) { c.moe_router_num_groups = c.moe_router_group_topk = 0; }));
  set("moe_router_enable_expert_bias",
      only([](const TC& c) { return !c.moe_router_enable_expert_bias; },
           [](const TC&) {
             return str("--moe-router-enable-expert-bias (moe_router_enable_expert_bias): ", kMixtral,
                        "no expert bias in the choice of experts");
           },
           [](TC& c) { c.moe_router_enable_expert_bias = false; }));
  set("moe_router_force_load_balancing",
      only([](const TC& c) { return !c.moe_router_force_load_balancing; },
           [](const TC&) {
             return str("--moe-router-force-load-balancing (moe_router_force_load_balancing): a "
                        "benchmark's random routing; ", kMixtral, "the gate's routing");
           },
           [](TC& c) { c.moe_router_force_load_balancing = false; }));
  HfMapping balancing = dropped(
      "the training loss only: MixtralForCausalLM's load-balancing loss is the batch's (aux_loss, "
      "router_aux_loss_coef); an import takes aux_loss",
      [](const HfConfigFile&, TC& c) { c.moe_router_load_balancing_type = "aux_loss"; });
  balancing.refuse = [](const TC& c) {
    return c.moe_router_load_balancing_type != "sinkhorn"
               ? std::string()
               : str("--moe-router-load-balancing-type sinkhorn (moe_router_load_balancing_type): "
                     "Sinkhorn routing weighs the experts by their scores without renormalising; ",
                     kMixtral, "a softmax over the top-k logits");
  };
  set("moe_router_load_balancing_type", balancing);
  set("moe_aux_loss_coeff", float_key({"router_aux_loss_coef"}, &TC::moe_aux_loss_coeff, 0.001, 'n'));
  set("moe_z_loss_coeff", dropped("a training loss MixtralForCausalLM does not have: no effect on "
                                  "the exported function; an import takes 0"));
  const HfMapping capacity = dropped(
      "training-time capacity and token dropping: generation and evaluation route every token, "
      "as MixtralForCausalLM does; an import takes none");
  for (const char* row : {"moe_expert_capacity_factor", "moe_token_drop_policy", "moe_pad_expert_input_to_capacity"})
    set(row, capacity);
  set("moe_router_bias_update_rate", dropped("no effect without the expert bias (refused)"));
  set("moe_shared_expert_intermediate_size",
      only([](const TC& c) { return c.moe_shared_expert_intermediate_size == 0; },
           [](const TC& c) {
             return str("--moe-shared-expert-intermediate-size ", c.moe_shared_expert_intermediate_size,
                        " (moe_shared_expert_intermediate_size): ", kMixtral, "no shared expert");
           },
           [](TC& c) { c.moe_shared_expert_intermediate_size = 0; }));
  set("moe_shared_expert_gate",
      only([](const TC& c) { return !c.moe_shared_expert_gate; },
           [](const TC&) {
             return str("--moe-shared-expert-gate (moe_shared_expert_gate): ", kMixtral, "no shared expert");
           },
           [](TC& c) { c.moe_shared_expert_gate = false; }));
  set("moe_grouped_gemm", weights("the experts' tensor names: the export reads the sequential "
                                  "(local_experts) and the grouped (linear_fc1.weight<e>) layouts; "
                                  "an import writes the sequential one"));
  set("moe_token_dispatcher_type", dropped("a run setting: how tokens reach other ranks' experts"));
}

}  // namespace megatron::model::hf_table
