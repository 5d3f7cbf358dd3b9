// What export and import of Hugging Face folders share (hf_checkpoint.h): the model-type rule,
// --max-shard-size, and the fused-QKV layout conversions.
#include "training/hf_checkpoint.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "model/model_settings.h"
#include "training/hf_checkpoint_internal.h"

namespace megatron::training {

int64_t parse_shard_size(const std::string& text) {
  auto digits = [&](size_t suffix) -> int64_t {
    const std::string num = text.substr(0, text.size() - suffix);
    bool ok = !num.empty() && num.size() <= 15;
    for (char c : num) ok = ok && std::isdigit(static_cast<unsigned char>(c));
    MG_REQUIRE(ok, "--max-shard-size '", text, "': expected an integer followed by a unit, e.g. "
               "5GB, 500MB, 2GiB, or a number of bytes");
    return std::stoll(num);
  };
  std::string upper = text;
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  int64_t bytes = 0;
  const bool bits = !text.empty() && text.back() == 'b';
  if (upper.ends_with("GIB"))
    bytes = digits(3) << 30;
  else if (upper.ends_with("MIB"))
    bytes = digits(3) << 20;
  else if (upper.ends_with("KIB"))
    bytes = digits(3) << 10;
  else if (upper.ends_with("GB"))
    bytes = digits(2) * 1'000'000'000 / (bits ? 8 : 1);
  else if (upper.ends_with("MB"))
    bytes = digits(2) * 1'000'000 / (bits ? 8 : 1);
  else if (upper.ends_with("KB"))
    bytes = digits(2) * 1'000 / (bits ? 8 : 1);
  else
    bytes = digits(0);
  MG_REQUIRE(bytes > 0, "--max-shard-size '", text, "' must be more than 0 bytes");
  return bytes;
}

namespace {

// transformers' MegatronBertForPreTraining / ForMaskedLM: Megatron's pre-LayerNorm BERT with
// learned positions, biases everywhere, multi-head attention and one GeLU (hidden_act) for the
// encoder's MLP and the LM head's transform.
std::string megatron_bert_type(const model::TransformerConfig& c) {
  auto refuse = [](const std::string& setting, const std::string& why) {
    MG_THROW("cannot export this BERT to Hugging Face transformers: ", setting, ": ", why,
             "; transformers' MegatronBert classes cannot express it, and an export would compute "
             "another function");
  };
  if (!c.learned_position_embedding())
    refuse("--position-embedding-type " + c.position_embedding_type, "learned absolute positions only");
  if (c.normalization != "LayerNorm") refuse("--normalization " + c.normalization, "LayerNorm only");
  if (c.activation != "gelu")
    refuse(model::activation_flag(c.activation) + " (" + c.activation + ")",
           "one hidden_act serves the encoder's MLP and the masked-LM head, whose GeLU is the exact "
           "(erf) one; an encoder trained with Megatron's fused bias-GeLU (the tanh form, on by "
           "default) differs: train with --no-bias-gelu-fusion to export");
  if (!c.add_bias_linear) refuse("--disable-bias-linear", "biases on every linear layer");
  if (c.query_groups() != c.num_attention_heads)
    refuse("--num-query-groups " + std::to_string(c.query_groups()), "multi-head attention only");
  if (int64_t(c.head_dim()) * c.num_attention_heads != c.hidden_size)
    refuse("--kv-channels " + std::to_string(c.head_dim()),
           "heads of hidden-size / num-attention-heads channels only");
  if (c.qk_layernorm) refuse("--qk-layernorm", "a norm over each query and key head");
  if (c.window_left >= 0) refuse("--window-size", "sliding-window attention");
  return "megatron-bert";
}

}  // namespace

std::string hf_model_type(const model::TransformerConfig& c) {
  if (c.model_family == "bert") return megatron_bert_type(c);
  MG_REQUIRE(c.model_family != "t5", "cannot export a T5 checkpoint to Hugging Face transformers: ",
             hf_detail::t5_hf_mismatch(), "; keep this build's format or --save-format torch");
  auto refuse = [](const std::string& setting, const std::string& why) {
    MG_THROW("cannot export to Hugging Face transformers: ", setting, ": ", why,
             "; transformers' GPT2LMHeadModel and LlamaForCausalLM cannot express it, and an "
             "export would compute another function");
  };
  if (c.attention_mask_type != "causal")
    refuse("attention mask '" + c.attention_mask_type + "'", "both classes are causal decoders");
  if (c.window_left >= 0) refuse("--window-size", "sliding-window attention");
  if (c.qk_layernorm) refuse("--qk-layernorm", "a norm over each query and key head");
  if (c.activation == "squared_relu") refuse("--squared-relu", "the squared ReLU activation");
  if (c.alibi()) refuse("--position-embedding-type alibi", "ALiBi attention biases");
  if (c.learned_position_embedding()) {
    const char* gpt2 = "a GPT-2-style model (learned absolute positions) exports as GPT2LMHeadModel, "
                       "which has ";
    if (c.normalization != "LayerNorm")
      refuse("--normalization " + c.normalization, std::string(gpt2) + "LayerNorm only");
    if (c.activation != "gelu" && c.activation != "gelu_tanh")
      refuse(model::activation_flag(c.activation) + " (" + c.activation + ")",
             std::string(gpt2) + "a GeLU MLP only");
    if (!c.add_bias_linear) refuse("--disable-bias-linear", std::string(gpt2) + "biases on every linear layer");
    if (c.query_groups() != c.num_attention_heads)
      refuse("--num-query-groups " + std::to_string(c.query_groups()),
             std::string(gpt2) + "multi-head attention only");
    if (int64_t(c.head_dim()) * c.num_attention_heads != c.hidden_size)
      refuse("--kv-channels " + std::to_string(c.head_dim()),
             std::string(gpt2) + "heads of hidden-size / num-attention-heads channels only");
    return "gpt2";
  }
  if (c.rope()) {
    const char* llama = "a rotary model exports as LlamaForCausalLM, which has ";
    if (c.normalization != "RMSNorm")
      refuse("--normalization " + c.normalization, std::string(llama) + "RMSNorm only");
    if (c.activation != "swiglu")
      refuse(model::activation_flag(c.activation) + " (" + c.activation + ")",
             std::string(llama) + "a SwiGLU MLP only");
    if (c.rotary_percent != 1.0f)
      refuse("--rotary-percent " + std::to_string(c.rotary_percent), std::string(llama) + "every head dim rotated");
    if (c.rotary_interleaved)
      refuse("--rotary-interleaved", std::string(llama) + "rotate-half rotary only");
    if (c.add_qkv_bias && !c.add_bias_linear)
      refuse("--add-qkv-bias without linear biases",
             std::string(llama) + "attention_bias on q, k, v and o_proj together");
    return "llama";
  }
  refuse("--position-embedding-type " + c.position_embedding_type, "a model without position embeddings");
  return "";
}

namespace hf_detail {

const char* t5_hf_mismatch() {
  return "Megatron's T5 (LayerNorm with a bias, biased linear layers, learned absolute positions "
         "by default, a tied LM head with a bias, attention scores scaled by 1/sqrt(head dim), "
         "and a GeLU MLP) is not transformers' T5 (RMSNorm without bias, no linear biases, relative "
         "position bias only, no score scaling, a decoder output scaled by d_model^-0.5 before a "
         "tied head without bias, and a ReLU or gated-GeLU MLP). No Megatron T5 argument set "
         "gives transformers' MLP (ReLU, or gated tanh-GeLU for t5 v1.1), so no configuration "
         "maps exactly";
}

QkvParts split_qkv(const Tensor& fused, int heads, int groups, int head_dim) {
  const int64_t d = head_dim, per = heads / groups;
  MG_CHECK(fused.size(0) == int64_t(groups) * (per + 2) * d, "split_qkv: ", shape_str(fused.shape()));
  auto rows = [&](int64_t n) {
    Shape s = fused.shape();
    s[0] = n;
    return Tensor::empty(s, fused.dtype());
  };
  QkvParts p{rows(heads * d), rows(groups * d), rows(groups * d)};
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t base = g * (per + 2) * d;
    p.q.narrow(0, g * per * d, per * d).copy_(fused.narrow(0, base, per * d));
    p.k.narrow(0, g * d, d).copy_(fused.narrow(0, base + per * d, d));
    p.v.narrow(0, g * d, d).copy_(fused.narrow(0, base + (per + 1) * d, d));
  }
  return p;
}

Tensor fuse_qkv(const QkvParts& p, int heads, int groups, int head_dim) {
  const int64_t d = head_dim, per = heads / groups;
  Shape s = p.q.shape();
  s[0] = int64_t(groups) * (per + 2) * d;
  Tensor out = Tensor::empty(s, p.q.dtype());
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t base = g * (per + 2) * d;
    out.narrow(0, base, per * d).copy_(p.q.narrow(0, g * per * d, per * d));
    out.narrow(0, base + per * d, d).copy_(p.k.narrow(0, g * d, d));
    out.narrow(0, base + (per + 1) * d, d).copy_(p.v.narrow(0, g * d, d));
  }
  return out;
}

Tensor transposed(const Tensor& t) { return t.transpose(0, 1).contiguous(); }

Tensor cat_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& t : parts) rows += t.size(0);
  Shape s = parts.at(0).shape();
  s[0] = rows;
  Tensor out = Tensor::empty(s, parts[0].dtype());
  int64_t at = 0;
  for (const Tensor& t : parts) {
    out.narrow(0, at, t.size(0)).copy_(t);
    at += t.size(0);
  }
  return out;
}

double short_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  // The shortest text that reads back as v: 1e-05, not 9.99999974737875e-06.
  for (int prec = 1; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, double(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: MG_THROW("a Hugging Face export holds float32, bfloat16 or float16 weights, not ", dtype_name(t));
  }
}

}  // namespace hf_detail
}  // namespace megatron::training
