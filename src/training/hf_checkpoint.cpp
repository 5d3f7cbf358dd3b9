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

// The transformers class a configuration exports as.
model::HfArch hf_arch(const model::TransformerConfig& c) {
  if (c.family_id() == model::ModelFamilyId::bert) return model::HfArch::megatron_bert;
  MG_REQUIRE(c.family_id() != model::ModelFamilyId::t5, "cannot export a T5 checkpoint to Hugging "
             "Face transformers: ", hf_detail::t5_hf_mismatch(), "; keep this build's format or "
             "--save-format torch");
  // The position embedding picks the decoder class.
  if (c.learned_position_embedding()) return model::HfArch::gpt2;
  // Experts in a rotary model: Mixtral, or Qwen2-MoE with shared experts (with learned positions
  // GPT-2's column refuses them).
  if (c.rope() && c.num_moe_experts > 0)
    return c.moe_shared_expert_intermediate_size > 0 ? model::HfArch::qwen2_moe : model::HfArch::mixtral;
  if (c.rope()) return model::HfArch::llama;
  MG_THROW("cannot export to Hugging Face transformers: --position-embedding-type ",
           c.position_embedding_type, ": ", c.alibi() ? "ALiBi attention biases" : "a model without "
           "position embeddings", "; transformers' GPT2LMHeadModel and LlamaForCausalLM cannot "
           "express it, and an export would compute another function");
}

}  // namespace

model::HfArch hf_arch_named(const std::string& model_type) {
  for (size_t i = 0; i < model::kHfArchCount; ++i)
    if (model_type == model::kHfArchNames[i]) return model::HfArch(i);
  MG_THROW("Hugging Face model type '", model_type, "' is not one of: gpt2, llama, megatron-bert, mixtral, qwen2_moe");
}

// Every setting through its column of the architecture (model/model_settings_hf.cpp): the first
// value the class cannot express is refused by its flag.
std::string hf_model_type(const model::TransformerConfig& c) {
  const model::HfArch arch = hf_arch(c);
  for (const model::ModelSetting& s : model::model_settings()) {
    const model::HfMapping& m = s.hf[size_t(arch)];
    MG_REQUIRE(m.role != model::HfRole::Unmapped, "cannot export to Hugging Face transformers: the "
               "setting ", s.key, " has no mapping to ", model::kHfArchNames[size_t(arch)],
               " in this build");
    const std::string why = m.refuse ? m.refuse(c) : std::string();
    if (why.empty()) continue;
    if (arch == model::HfArch::megatron_bert)
      MG_THROW("cannot export this BERT to Hugging Face transformers: ", why, "; transformers' "
               "MegatronBert classes cannot express it, and an export would compute another function");
    if (arch == model::HfArch::mixtral || arch == model::HfArch::qwen2_moe)
      MG_THROW("cannot export this mixture-of-experts model to Hugging Face transformers: ", why,
               "; transformers' ", model::kHfArchClasses[size_t(arch)], " cannot express it, and an "
               "export would compute another function");
    MG_THROW("cannot export to Hugging Face transformers: ", why, "; transformers' GPT2LMHeadModel "
             "and LlamaForCausalLM cannot express it, and an export would compute another function");
  }
  return model::kHfArchNames[size_t(arch)];
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

double short_float(float v) { return model::short_float(v); }

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
