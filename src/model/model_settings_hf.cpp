// The Hugging Face columns of the model-settings table (model_settings.h, hf_config.h): for each
// row, how its setting reaches transformers' GPT2LMHeadModel ("gpt2"), LlamaForCausalLM ("llama")
// and MegatronBertForPreTraining / ForMaskedLM ("megatron-bert"): the config.json keys it is
// written to and read from, the value the class fixes (any other is refused, naming the flag),
// the tensors that carry it, or why it has no counterpart. The export and import
// (training/hf_checkpoint*.cpp) walk these columns; tests/model/model_settings_test.cpp takes
// every row through every architecture.
#include <map>

#include "core/error.h"
#include "model/layer_spec.h"
#include "model/model_settings.h"
#include "model/model_settings_hf_internal.h"

namespace megatron::model {

namespace {

using namespace hf_table;

// Each architecture's words before a reason it refuses ("which has ...").
constexpr const char* kGpt2 =
    "a GPT-2-style model (learned absolute positions) exports as GPT2LMHeadModel, which has ";
constexpr const char* kLlama = "a rotary model exports as LlamaForCausalLM, which has ";

Columns all(const HfMapping& m) {
  Columns c;
  c.fill(m);
  return c;
}

std::string name_of(const char* flag, const std::string& value) { return str(flag, " ", value); }

// ---- the columns, by the row's key -------------------------------------------------------------
std::map<std::string, Columns> columns() {
  std::map<std::string, Columns> t;
  const HfMapping run = dropped("a run setting: no counterpart in transformers, no effect on the weights");
  const HfMapping t5 = dropped("a T5 setting: T5 models do not export");
  const HfMapping no_rope = dropped("no rotary embedding in this architecture");
  const HfMapping moe = dropped("a mixture-of-experts setting: no effect without experts (refused with them)");

  t["num_layers"] = {int_key("n_layer", &TC::num_layers), int_key("num_hidden_layers", &TC::num_layers),
                     int_key("num_hidden_layers", &TC::num_layers)};
  t["hidden_size"] = {int_key("n_embd", &TC::hidden_size), int_key("hidden_size", &TC::hidden_size),
                      int_key("hidden_size", &TC::hidden_size)};
  t["num_attention_heads"] = {int_key("n_head", &TC::num_attention_heads),
                              int_key("num_attention_heads", &TC::num_attention_heads),
                              int_key("num_attention_heads", &TC::num_attention_heads)};
  auto intermediate = key(
      {"intermediate_size"}, [](const TC& c, ojson& j) { j["intermediate_size"] = c.ffn(); },
      [](const HfConfigFile& h, TC& c) { c.ffn_hidden_size = int(h.integer("intermediate_size")); });
  t["ffn_hidden_size"] = {
      key({"n_inner"},
          [](const TC& c, ojson& j) {
            j["n_inner"] = c.ffn() == 4 * c.hidden_size ? ojson(nullptr) : ojson(c.ffn());
          },
          [](const HfConfigFile& h, TC& c) {
            const int64_t inner = h.integer("n_inner", 4 * int64_t(c.hidden_size));
            c.ffn_hidden_size = inner == 4 * c.hidden_size ? 0 : int(inner);
          }),
      intermediate, intermediate};
  // GPT-2 and MegatronBert: heads of hidden / heads channels.
  auto whole_heads = [](const char* intro, const char* hidden, const char* heads) {
    return fixed(
        [intro](const TC& c) {
          return int64_t(c.head_dim()) * c.num_attention_heads == c.hidden_size
                     ? std::string()
                     : str("--kv-channels ", c.head_dim(), ": ", intro,
                           "heads of hidden-size / num-attention-heads channels only");
        },
        [hidden, heads](const HfConfigFile& h, TC& c) {
          MG_REQUIRE(c.hidden_size % c.num_attention_heads == 0, h.label, ": ", hidden, " ",
                     c.hidden_size, " is not divisible by ", heads, " ", c.num_attention_heads);
          c.kv_channels = 0;
        });
  };
  t["kv_channels"] = {
      whole_heads(kGpt2, "n_embd", "n_head"),
      key({"head_dim"}, [](const TC& c, ojson& j) { j["head_dim"] = c.head_dim(); },
          [](const HfConfigFile& h, TC& c) {
            const int64_t d = h.integer("head_dim", c.hidden_size / c.num_attention_heads);
            MG_REQUIRE(d * c.num_attention_heads <= INT32_MAX, h.label, ": head_dim ", d,
                       " x num_attention_heads ", c.num_attention_heads, " does not fit in 32 bits");
            c.kv_channels = d * c.num_attention_heads == c.hidden_size ? 0 : int(d);
          }),
      whole_heads("", "hidden_size", "num_attention_heads")};
  auto mha = [](const char* intro) {
    return fixed(
        [intro](const TC& c) {
          return c.query_groups() == c.num_attention_heads
                     ? std::string()
                     : str("--num-query-groups ", c.query_groups(), ": ", intro, "multi-head attention only");
        },
        [](const HfConfigFile&, TC& c) { c.num_query_groups = 0; });
  };
  t["num_query_groups"] = {
      mha(kGpt2),
      key({"num_key_value_heads"},
          [](const TC& c, ojson& j) { j["num_key_value_heads"] = c.query_groups(); },
          [](const HfConfigFile& h, TC& c) {
            const int64_t kv = h.integer("num_key_value_heads", c.num_attention_heads);
            MG_REQUIRE(c.num_attention_heads % kv == 0, h.label, ": num_attention_heads ",
                       c.num_attention_heads, " is not a multiple of num_key_value_heads ", kv);
            c.num_query_groups = kv == c.num_attention_heads ? 0 : int(kv);
          }),
      mha("")};
  auto max_pos = [](int64_t fallback) {
    return key({"max_position_embeddings"},
               [](const TC& c, ojson& j) { j["max_position_embeddings"] = c.max_position_embeddings; },
               [fallback](const HfConfigFile& h, TC& c) {
                 c.max_position_embeddings = int(h.integer("max_position_embeddings", fallback));
               });
  };
  t["max_position_embeddings"] = {
      key({"n_positions", "n_ctx"},
          [](const TC& c, ojson& j) {
            j["n_ctx"] = c.max_position_embeddings;
            j["n_positions"] = c.max_position_embeddings;
          },
          [](const HfConfigFile& h, TC& c) {
            c.max_position_embeddings =
                int(h.find("n_positions") ? h.integer("n_positions") : h.integer("n_ctx"));
          }),
      max_pos(2048), max_pos(512)};
  auto norm = [](const char* intro, NormId want) {
    return fixed(
        [intro, want](const TC& c) {
          return c.norm_id() == want ? std::string()
                                     : str(name_of("--normalization", c.normalization), ": ", intro,
                                           kNormKinds[size_t(want)].name, " only");
        },
        [want](const HfConfigFile&, TC& c) { c.normalization = kNormKinds[size_t(want)].name; });
  };
  t["normalization"] = {norm(kGpt2, NormId::layernorm), norm(kLlama, NormId::rmsnorm),
                        norm("", NormId::layernorm)};
  t["layernorm_epsilon"] = {float_key({"layer_norm_epsilon"}, &TC::layernorm_epsilon, 1e-5, 'p'),
                            float_key({"rms_norm_eps"}, &TC::layernorm_epsilon, 1e-6, 'p'),
                            float_key({"layer_norm_eps"}, &TC::layernorm_epsilon, 1e-12, 'p')};
  t["apply_layernorm_1p"] = all(weights(
      "the export stores the norm weights as gamma (weight + 1), which is what transformers keeps"));
  // The activation: GPT-2's GeLU forms by activation_function; Llama's SwiGLU and MegatronBert's
  // exact GeLU by hidden_act. Squared ReLU has no counterpart anywhere.
  auto act_refusal = [](const TC& c, const char* intro, const char* only, auto ok) {
    if (c.activation_id() == ActivationId::squared_relu)
      return std::string("--squared-relu: the squared ReLU activation");
    return ok(c.activation_id()) ? std::string()
                                 : str(activation_flag(c.activation), " (", c.activation, "): ", intro, only);
  };
  t["activation"] = {
      key({"activation_function"},
          [](const TC& c, ojson& j) {
            j["activation_function"] = c.activation_id() == ActivationId::gelu_tanh ? "gelu_new" : "gelu";
          },
          [](const HfConfigFile& h, TC& c) {
            const std::string a = h.string("activation_function", "gelu_new");
            if (a == "gelu_new" || a == "gelu_pytorch_tanh")
              c.activation = kActivationKinds[size_t(ActivationId::gelu_tanh)].name;
            else if (a == "gelu")
              c.activation = kActivationKinds[size_t(ActivationId::gelu)].name;
            else
              h.unsupported("activation_function",
                            "GPT-2 models import with gelu_new, gelu_pytorch_tanh or gelu");
          },
          [act_refusal](const TC& c) {
            return act_refusal(c, kGpt2, "a GeLU MLP only", [](ActivationId a) {
              return a == ActivationId::gelu || a == ActivationId::gelu_tanh;
            });
          }),
      key({"hidden_act"}, [](const TC&, ojson& j) { j["hidden_act"] = "silu"; },
          [](const HfConfigFile& h, TC& c) {
            if (h.string("hidden_act", "silu") != "silu")
              h.unsupported("hidden_act", "Llama models import with silu (SwiGLU)");
            c.activation = kActivationKinds[size_t(ActivationId::swiglu)].name;
          },
          [act_refusal](const TC& c) {
            return act_refusal(c, kLlama, "a SwiGLU MLP only",
                               [](ActivationId a) { return a == ActivationId::swiglu; });
          }),
      key({"hidden_act"}, [](const TC&, ojson& j) { j["hidden_act"] = "gelu"; },
          [](const HfConfigFile& h, TC& c) {
            if (h.string("hidden_act", "gelu") != "gelu")
              h.unsupported("hidden_act", "Megatron's BERT has the exact (erf) GeLU in its masked-LM "
                            "head, so MegatronBert models import with \"gelu\"");
            c.activation = kActivationKinds[size_t(ActivationId::gelu)].name;
          },
          [act_refusal](const TC& c) {
            return act_refusal(c, "",
                               "one hidden_act serves the encoder's MLP and the masked-LM head, whose "
                               "GeLU is the exact (erf) one; an encoder trained with Megatron's fused "
                               "bias-GeLU (the tanh form, on by default) differs: train with "
                               "--no-bias-gelu-fusion to export",
                               [](ActivationId a) { return a == ActivationId::gelu; });
          })};
  // The position embedding picks the decoder class (hf_model_type): learned is GPT-2, rotary Llama.
  auto positions = [](const char* intro, PositionEmbeddingId want) {
    return fixed(
        [intro, want](const TC& c) {
          return c.position_embedding_id() == want
                     ? std::string()
                     : str(name_of("--position-embedding-type", c.position_embedding_type), ": ", intro,
                           want == PositionEmbeddingId::rope ? "rotary" : "learned absolute",
                           " positions only");
        },
        [want](const HfConfigFile&, TC& c) {
          c.position_embedding_type = kPositionEmbeddingKinds[size_t(want)].name;
        });
  };
  HfMapping bert_positions = positions("", PositionEmbeddingId::learned_absolute);
  bert_positions.role = HfRole::Key;
  bert_positions.keys = {"position_embedding_type"};
  bert_positions.write = [](const TC&, ojson& j) { j["position_embedding_type"] = "absolute"; };
  bert_positions.read = [](const HfConfigFile& h, TC& c) {
    if (h.string("position_embedding_type", "absolute") != "absolute")
      h.unsupported("position_embedding_type", "BERT imports with absolute (learned) positions");
    c.position_embedding_type = kPositionEmbeddingKinds[size_t(PositionEmbeddingId::learned_absolute)].name;
  };
  t["position_embedding_type"] = {positions(kGpt2, PositionEmbeddingId::learned_absolute),
                                  positions(kLlama, PositionEmbeddingId::rope), bert_positions};
  t["rotary_percent"] = {
      no_rope,
      fixed(
          [](const TC& c) {
            return c.rotary_percent == 1.0f
                       ? std::string()
                       : str("--rotary-percent ", c.rotary_percent, ": ", kLlama, "every head dim rotated");
          },
          [](const HfConfigFile& h, TC& c) {
            if (h.find("rope_scaling")) h.unsupported("rope_scaling", "rotary scaling is not implemented");
            if (h.find("partial_rotary_factor") && h.number("partial_rotary_factor", 1.0) != 1.0)
              h.unsupported("partial_rotary_factor", "Llama rotates every head dim");
            c.rotary_percent = 1.0f;
          },
          [](const TC&, ojson& j) { j["rope_scaling"] = nullptr; }),
      no_rope};
  t["rotary_base"] = {no_rope,
                      key({"rope_theta"}, [](const TC& c, ojson& j) { j["rope_theta"] = c.rotary_base; },
                          [](const HfConfigFile& h, TC& c) {
                            c.rotary_base = h.number("rope_theta", 10000.0, /*positive=*/true);
                          }),
                      no_rope};
  t["rotary_interleaved"] = {
      no_rope,
      fixed([](const TC& c) {
              return c.rotary_interleaved ? str("--rotary-interleaved: ", kLlama, "rotate-half rotary only")
                                          : std::string();
            },
            [](const HfConfigFile&, TC& c) { c.rotary_interleaved = false; }),
      no_rope};
  auto mask = [](AttentionMaskId want, const char* why) {
    return fixed(
        [want, why](const TC& c) {
          return c.attention_mask_id() == want
                     ? std::string()
                     : str("the attention mask (attention_mask_type) '", c.attention_mask_type, "': ", why);
        },
        [want](const HfConfigFile& h, TC& c) {
          if (want == AttentionMaskId::causal && h.boolean("add_cross_attention", false))
            h.unsupported("add_cross_attention", "decoder-only GPT models have no cross-attention");
          if (want == AttentionMaskId::bidirectional &&
              (h.boolean("is_decoder", false) || h.boolean("add_cross_attention", false)))
            h.unsupported("is_decoder", "BERT is an encoder (no causal mask, no cross-attention)");
          c.attention_mask_type = kAttentionMaskKinds[size_t(want)].name;
        });
  };
  t["attention_mask_type"] = {mask(AttentionMaskId::causal, "both classes are causal decoders"),
                              mask(AttentionMaskId::causal, "both classes are causal decoders"),
                              mask(AttentionMaskId::bidirectional, "MegatronBert is a bidirectional encoder")};
  t["window_size"] = all(fixed(
      [](const TC& c) {
        return c.window_left >= 0 || c.window_right >= 0 ? std::string("--window-size: sliding-window attention")
                                                         : std::string();
      },
      [](const HfConfigFile&, TC& c) { c.window_left = c.window_right = -1; }));
  t["qk_layernorm"] = all(fixed(
      [](const TC& c) {
        return c.qk_layernorm ? std::string("--qk-layernorm: a norm over each query and key head") : std::string();
      },
      [](const HfConfigFile&, TC& c) { c.qk_layernorm = false; }));
  auto biases = [](const char* intro) {
    return fixed(
        [intro](const TC& c) {
          return c.add_bias_linear ? std::string()
                                   : str("--disable-bias-linear: ", intro, "biases on every linear layer");
        },
        [](const HfConfigFile&, TC& c) { c.add_bias_linear = true; });
  };
  t["add_bias_linear"] = {
      biases(kGpt2),
      key({"attention_bias", "mlp_bias"},
          [](const TC& c, ojson& j) {
            j["attention_bias"] = c.add_bias_linear;
            j["mlp_bias"] = c.add_bias_linear;
          },
          [](const HfConfigFile& h, TC& c) {
            const bool attn = h.boolean("attention_bias", false), mlp = h.boolean("mlp_bias", false);
            if (attn != mlp)
              h.unsupported("attention_bias", "biases are on every linear layer or none here "
                            "(attention_bias must equal mlp_bias)");
            c.add_bias_linear = attn;
          }),
      biases("")};
  // The QKV bias goes with the other biases (attention_bias covers q, k, v and o_proj together).
  auto qkv_bias = [](const char* intro) {
    return fixed(
        [intro](const TC& c) {
          return c.qkv_bias() == c.add_bias_linear
                     ? std::string()
                     : str("--add-qkv-bias without linear biases: ", intro,
                           "attention_bias on q, k, v and o_proj together");
        },
        [](const HfConfigFile&, TC& c) { c.add_qkv_bias = false; });
  };
  t["add_qkv_bias"] = {qkv_bias(kGpt2), qkv_bias(kLlama), qkv_bias("")};
  auto tie = [](bool fallback) {
    return key({"tie_word_embeddings"},
               [](const TC& c, ojson& j) { j["tie_word_embeddings"] = !c.untie_embeddings_and_output_weights; },
               [fallback](const HfConfigFile& h, TC& c) {
                 c.untie_embeddings_and_output_weights = !h.boolean("tie_word_embeddings", fallback);
               });
  };
  t["untie_embeddings_and_output_weights"] = {tie(true), tie(false), tie(true)};
  t["decoder_num_layers"] = t["relative_attention_num_buckets"] =
      t["relative_attention_max_distance"] = t["decoder_seq_length"] = all(t5);

  // ---- the Recorded rows
  auto family = [](ModelFamilyId want) {
    return fixed(
        [want](const TC& c) {
          return c.family_id() == want ? std::string()
                                       : str("the model family '", c.model_family, "'");
        },
        [want](const HfConfigFile&, TC& c) { c.model_family = kind_name(want); });
  };
  t["model_family"] = {family(ModelFamilyId::gpt), family(ModelFamilyId::gpt), family(ModelFamilyId::bert)};
  const HfMapping not_bert = dropped("a BERT setting");
  t["bert_binary_head"] = {not_bert, not_bert,
                           weights("the binary head's tensors (cls.seq_relationship): "
                                   "MegatronBertForPreTraining with them, ForMaskedLM without")};
  t["seq_length"] = all(dropped("the training sequence length: an import takes max_position_embeddings"));
  t["padded_vocab_size"] = all(weights("vocab_size: the export cuts the padded vocabulary to the "
                                       "tokenizer's, an import pads it again"));
  t["hidden_dropout"] = {
      float_key({"resid_pdrop", "embd_pdrop"}, &TC::hidden_dropout, 0.1, 'f'),
      dropped("LlamaForCausalLM has no hidden dropout: an import takes 0",
              [](const HfConfigFile&, TC& c) { c.hidden_dropout = 0.0f; }),
      float_key({"hidden_dropout_prob"}, &TC::hidden_dropout, 0.1, 'f')};
  // (GPT-2's embd_pdrop is the same rate.)
  t["hidden_dropout"][0].write = [](const TC& c, ojson& j) {
    j["embd_pdrop"] = short_float(c.hidden_dropout);
    j["resid_pdrop"] = short_float(c.hidden_dropout);
  };
  t["attention_dropout"] = {float_key({"attn_pdrop"}, &TC::attention_dropout, 0.1, 'f'),
                            float_key({"attention_dropout"}, &TC::attention_dropout, 0.0, 'f'),
                            float_key({"attention_probs_dropout_prob"}, &TC::attention_dropout, 0.1, 'f')};
  t["init_method_std"] = all(float_key({"initializer_range"}, &TC::init_method_std, 0.02, 'n'));
  for (const char* k : {"apply_query_key_layer_scaling", "recompute_granularity", "recompute_method",
                        "recompute_num_layers", "sequence_parallel", "cp_comm_type"})
    t[k] = all(run);
  t["params_dtype"] = all(weights("torch_dtype, and the dtype of the tensors"));
  t["num_moe_experts"] = all(fixed(
      [](const TC& c) {
        return c.num_moe_experts == 0 ? std::string()
                                      : str("--num-experts ", c.num_moe_experts, " (num_moe_experts): mixture-of-experts layers");
      },
      [](const HfConfigFile&, TC& c) { c.num_moe_experts = 0; }));
  for (const char* k : {"moe_layer_freq", "moe_ffn_hidden_size", "moe_router_topk",
                        "moe_router_score_function", "moe_router_pre_softmax",
                        "moe_router_topk_scaling_factor", "moe_router_num_groups", "moe_router_group_topk",
                        "moe_router_enable_expert_bias", "moe_router_bias_update_rate",
                        "moe_router_force_load_balancing", "moe_router_load_balancing_type",
                        "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_expert_capacity_factor",
                        "moe_token_drop_policy", "moe_pad_expert_input_to_capacity",
                        "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
                        "moe_grouped_gemm", "moe_token_dispatcher_type"})
    t[k] = all(moe);
  moe_columns(t);
  return t;
}

}  // namespace

Columns hf_columns(const std::string& row) {
  static const std::map<std::string, Columns> table = columns();
  const auto it = table.find(row);
  return it == table.end() ? Columns() : it->second;
}

}  // namespace megatron::model
