// Import of a transformers folder (config.json + safetensors) as single-rank tensors under our
// names (hf_checkpoint.h has the names and layouts).
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/input_bounds.h"
#include "core/safetensors.h"
#include "model/model_settings.h"
#include "training/checkpoint.h"
#include "training/hf_checkpoint.h"
#include "training/hf_checkpoint_internal.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace hf_detail;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MG_REQUIRE(in, "cannot read ", p.string());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

json read_json(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    MG_THROW(p.string(), ": malformed JSON: ", e.what());
  }
}

// The folder's tensors, every file's header checked against the index.
struct Tensors {
  std::map<std::string, Tensor> t;
  std::map<std::string, std::string> file_of;
  std::set<std::string> used;
  std::string prefix;  // "transformer." / "model.", when the file uses it

  // The tensor `name` (without the prefix) with `shape`; errors name file and tensor.
  Tensor take(const std::string& name, const Shape& shape, const std::string& folder) {
    std::string key = prefix + name;
    if (!t.count(key)) key = name;
    auto it = t.find(key);
    MG_REQUIRE(it != t.end(), folder, ": tensor '", prefix + name, "' is missing from the "
               "safetensors files (config.json says it is there)");
    MG_REQUIRE(it->second.shape() == shape, file_of.at(key), ": tensor '", key, "' has shape ",
               shape_str(it->second.shape()), " but config.json implies ", shape_str(shape));
    const DType dt = it->second.dtype();
    MG_REQUIRE(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16 || dt == DType::F64,
               file_of.at(key), ": tensor '", key, "' has dtype ", safetensors_dtype_code(dt),
               "; a weight must be floating point (F32, BF16, F16 or F64): the file is corrupted "
               "or its header relabels the data");
    // (Only the weights taken: a skipped buffer such as a causal mask may hold -inf.)
    check_finite_tensor(it->second, key, file_of.at(key),
                        "the weights are corrupted or the model had diverged when it was saved: "
                        "save it again from a model whose weights are finite");
    used.insert(key);
    return it->second;
  }
  bool has(const std::string& name) const { return t.count(prefix + name) || t.count(name); }
};

Tensors read_tensors(const fs::path& folder, const std::string& prefix) {
  Tensors out;
  out.prefix = prefix;
  std::error_code ec;
  const fs::path index = folder / "model.safetensors.index.json";
  std::vector<std::string> files;
  json weight_map;
  if (fs::exists(index, ec)) {
    const json j = read_json(index);
    MG_REQUIRE(j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
               ": missing \"weight_map\" object");
    weight_map = j["weight_map"];
    std::set<std::string> seen;
    for (const auto& [name, file] : weight_map.items()) {
      MG_REQUIRE(file.is_string(), index.string(), ": weight_map[\"", name, "\"] must be a file name");
      const std::string f = file.get<std::string>();
      MG_REQUIRE(f.find('/') == std::string::npos && f != ".." && !f.empty(), index.string(),
                 ": weight_map[\"", name, "\"] = '", f, "' is not a file name in the folder");
      if (seen.insert(f).second) files.push_back(f);
    }
  } else if (fs::exists(folder / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    MG_THROW(folder.string(), " has neither model.safetensors nor model.safetensors.index.json "
             "(weights in pytorch_model.bin are pickles, which are not read: save the model with "
             "safe_serialization=True)");
  }
  for (const std::string& f : files) {
    const fs::path p = folder / f;
    MG_REQUIRE(fs::is_regular_file(p, ec), p.string(), " is missing",
               weight_map.is_null() ? "" : " (named in model.safetensors.index.json)");
    for (auto& [name, tensor] : read_safetensors(p).tensors) {
      MG_REQUIRE(!out.t.count(name), p.string(), ": tensor '", name, "' is also in ",
                 out.file_of[name]);
      if (!weight_map.is_null())
        MG_REQUIRE(weight_map.contains(name) && weight_map[name] == f, p.string(), ": tensor '",
                   name, "' is not listed for this file in model.safetensors.index.json");
      out.file_of[name] = p.string();
      out.t[name] = std::move(tensor);
    }
  }
  if (!weight_map.is_null())
    for (const auto& [name, file] : weight_map.items())
      MG_REQUIRE(out.t.count(name), index.string(), " lists tensor '", name, "' in ",
                 file.get<std::string>(), ", which does not hold it");
  return out;
}

// Buffers some files carry that are not parameters.
bool skipped_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with("rotary_emb.inv_freq") || name.ends_with("embeddings.position_ids");
}

std::string ours(int i, const std::string& rest) { return "decoder.layers." + std::to_string(i) + "." + rest; }

void gpt2_tensors(Tensors& x, const model::TransformerConfig& c, int64_t V, const std::string& folder,
                  std::map<std::string, Tensor>& m) {
  const int64_t h = c.hidden_size, f = c.ffn();
  const int n = c.num_attention_heads, d = c.head_dim();
  m["embedding.word_embeddings.weight"] = x.take("wte.weight", {V, h}, folder);
  m["embedding.position_embeddings.weight"] = x.take("wpe.weight", {c.max_position_embeddings, h}, folder);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string l = "h." + std::to_string(i) + ".";
    m[ours(i, "input_layernorm.weight")] = x.take(l + "ln_1.weight", {h}, folder);
    m[ours(i, "input_layernorm.bias")] = x.take(l + "ln_1.bias", {h}, folder);
    const Tensor w = transposed(x.take(l + "attn.c_attn.weight", {h, 3 * h}, folder));
    m[ours(i, "self_attention.linear_qkv.weight")] =
        fuse_qkv({w.narrow(0, 0, h), w.narrow(0, h, h), w.narrow(0, 2 * h, h)}, n, n, d);
    const Tensor b = x.take(l + "attn.c_attn.bias", {3 * h}, folder);
    m[ours(i, "self_attention.linear_qkv.bias")] =
        fuse_qkv({b.narrow(0, 0, h), b.narrow(0, h, h), b.narrow(0, 2 * h, h)}, n, n, d);
    m[ours(i, "self_attention.linear_proj.weight")] = transposed(x.take(l + "attn.c_proj.weight", {h, h}, folder));
    m[ours(i, "self_attention.linear_proj.bias")] = x.take(l + "attn.c_proj.bias", {h}, folder);
    m[ours(i, "pre_mlp_layernorm.weight")] = x.take(l + "ln_2.weight", {h}, folder);
    m[ours(i, "pre_mlp_layernorm.bias")] = x.take(l + "ln_2.bias", {h}, folder);
    m[ours(i, "mlp.linear_fc1.weight")] = transposed(x.take(l + "mlp.c_fc.weight", {h, f}, folder));
    m[ours(i, "mlp.linear_fc1.bias")] = x.take(l + "mlp.c_fc.bias", {f}, folder);
    m[ours(i, "mlp.linear_fc2.weight")] = transposed(x.take(l + "mlp.c_proj.weight", {f, h}, folder));
    m[ours(i, "mlp.linear_fc2.bias")] = x.take(l + "mlp.c_proj.bias", {h}, folder);
  }
  m["decoder.final_layernorm.weight"] = x.take("ln_f.weight", {h}, folder);
  m["decoder.final_layernorm.bias"] = x.take("ln_f.bias", {h}, folder);
}

// LlamaForCausalLM, and the decoders of MixtralForCausalLM and Qwen2MoeForCausalLM.
void llama_tensors(Tensors& x, const model::TransformerConfig& c, int64_t V, const std::string& folder,
                   model::HfArch arch, std::map<std::string, Tensor>& m) {
  const int64_t h = c.hidden_size, f = c.ffn();
  const int n = c.num_attention_heads, g = c.query_groups(), d = c.head_dim();
  const bool bias = c.add_bias_linear;
  m["embedding.word_embeddings.weight"] = x.take("embed_tokens.weight", {V, h}, folder);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    m[ours(i, "input_layernorm.weight")] = x.take(l + "input_layernorm.weight", {h}, folder);
    for (const char* kind : {"weight", "bias"}) {
      const std::string k = kind;
      if (k == "bias" && !c.qkv_bias()) continue;  // (Qwen2-MoE: biases on q, k, v only)
      auto shape = [&](int64_t rows, int64_t cols) { return k == "bias" ? Shape{rows} : Shape{rows, cols}; };
      QkvParts p{x.take(l + "self_attn.q_proj." + k, shape(n * d, h), folder),
                 x.take(l + "self_attn.k_proj." + k, shape(g * d, h), folder),
                 x.take(l + "self_attn.v_proj." + k, shape(g * d, h), folder)};
      m[ours(i, "self_attention.linear_qkv." + k)] = fuse_qkv(p, n, g, d);
      if (k == "bias" && !bias) continue;
      m[ours(i, "self_attention.linear_proj." + k)] =
          x.take(l + "self_attn.o_proj." + k, k == "bias" ? Shape{h} : Shape{h, n * d}, folder);
      if (c.is_moe_layer(i)) continue;  // Mixtral, Qwen2-MoE: the MoE block below
      m[ours(i, "mlp.linear_fc1." + k)] = cat_rows({x.take(l + "mlp.gate_proj." + k, shape(f, h), folder),
                                                    x.take(l + "mlp.up_proj." + k, shape(f, h), folder)});
      m[ours(i, "mlp.linear_fc2." + k)] =
          x.take(l + "mlp.down_proj." + k, k == "bias" ? Shape{h} : Shape{h, f}, folder);
    }
    m[ours(i, "pre_mlp_layernorm.weight")] = x.take(l + "post_attention_layernorm.weight", {h}, folder);
    if (c.is_moe_layer(i))
      import_moe_block([&](const std::string& n, const Shape& s) { return x.take(n, s, folder); }, c, i, arch, m);
  }
  m["decoder.final_layernorm.weight"] = x.take("norm.weight", {h}, folder);
}

void megatron_bert_tensors(Tensors& x, model::TransformerConfig& c, int64_t V, int64_t types,
                           const std::string& folder, std::map<std::string, Tensor>& m) {
  const int64_t h = c.hidden_size, f = c.ffn();
  const int n = c.num_attention_heads, d = c.head_dim();
  c.bert_binary_head = x.has("cls.seq_relationship.weight");
  m["embedding.word_embeddings.weight"] = x.take("embeddings.word_embeddings.weight", {V, h}, folder);
  m["embedding.position_embeddings.weight"] =
      x.take("embeddings.position_embeddings.weight", {c.max_position_embeddings, h}, folder);
  const Tensor tt = x.take("embeddings.token_type_embeddings.weight", {types, h}, folder);
  if (c.bert_binary_head) {
    MG_REQUIRE(types == 2, folder, ": type_vocab_size is ", types, "; Megatron's BERT with the "
               "sentence-order head has 2 token types");
    m["embedding.tokentype_embeddings.weight"] = tt;
  } else {  // without the binary head Megatron's BERT has no token types: the table must add nothing
    const Tensor z = tt.to(DType::F32);
    for (int64_t i = 0; i < z.numel(); ++i)
      MG_REQUIRE(z.data<float>()[i] == 0.0f, x.file_of.at(x.has("bert.embeddings.token_type_embeddings.weight")
                                                               ? "bert.embeddings.token_type_embeddings.weight"
                                                               : "embeddings.token_type_embeddings.weight"),
                 ": the token-type embeddings are not zero, but the model has no sentence-order head "
                 "(cls.seq_relationship), and Megatron's BERT has token types only with it");
  }
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string l = "encoder.layer." + std::to_string(i) + ".";
    const std::string o = "encoder.layers." + std::to_string(i) + ".";
    m[o + "input_layernorm.weight"] = x.take(l + "attention.ln.weight", {h}, folder);
    m[o + "input_layernorm.bias"] = x.take(l + "attention.ln.bias", {h}, folder);
    for (const char* kind : {"weight", "bias"}) {
      const std::string k = kind;
      const Shape sq = k == "bias" ? Shape{h} : Shape{h, h};
      QkvParts p{x.take(l + "attention.self.query." + k, sq, folder),
                 x.take(l + "attention.self.key." + k, sq, folder),
                 x.take(l + "attention.self.value." + k, sq, folder)};
      m[o + "self_attention.linear_qkv." + k] = fuse_qkv(p, n, n, d);
      m[o + "self_attention.linear_proj." + k] = x.take(l + "attention.output.dense." + k, sq, folder);
      m[o + "mlp.linear_fc1." + k] =
          x.take(l + "intermediate.dense." + k, k == "bias" ? Shape{f} : Shape{f, h}, folder);
      m[o + "mlp.linear_fc2." + k] =
          x.take(l + "output.dense." + k, k == "bias" ? Shape{h} : Shape{h, f}, folder);
    }
    m[o + "pre_mlp_layernorm.weight"] = x.take(l + "ln.weight", {h}, folder);
    m[o + "pre_mlp_layernorm.bias"] = x.take(l + "ln.bias", {h}, folder);
  }
  m["encoder.final_layernorm.weight"] = x.take("encoder.ln.weight", {h}, folder);
  m["encoder.final_layernorm.bias"] = x.take("encoder.ln.bias", {h}, folder);
  if (c.bert_binary_head) {
    m["pooler.dense.weight"] = x.take("pooler.dense.weight", {h, h}, folder);
    m["pooler.dense.bias"] = x.take("pooler.dense.bias", {h}, folder);
    m["binary_head.weight"] = x.take("cls.seq_relationship.weight", {2, h}, folder);
    m["binary_head.bias"] = x.take("cls.seq_relationship.bias", {2}, folder);
  }
  m["lm_head.dense.weight"] = x.take("cls.predictions.transform.dense.weight", {h, h}, folder);
  m["lm_head.dense.bias"] = x.take("cls.predictions.transform.dense.bias", {h}, folder);
  m["lm_head.layer_norm.weight"] = x.take("cls.predictions.transform.LayerNorm.weight", {h}, folder);
  m["lm_head.layer_norm.bias"] = x.take("cls.predictions.transform.LayerNorm.bias", {h}, folder);
  m["output_layer.bias"] = x.take("cls.predictions.bias", {V}, folder);
  if (x.has("cls.predictions.decoder.bias")) {  // transformers ties it to cls.predictions.bias
    const Tensor b = x.take("cls.predictions.decoder.bias", {V}, folder);
    MG_REQUIRE(std::memcmp(b.contiguous().raw_data(), m["output_layer.bias"].contiguous().raw_data(),
                           b.nbytes()) == 0 && b.dtype() == m["output_layer.bias"].dtype(),
               x.file_of.at("cls.predictions.decoder.bias"), ": cls.predictions.decoder.bias differs "
               "from cls.predictions.bias, which transformers ties it to");
  }
}

// The tokenizer files of the folder, as our tokenizer options.
std::optional<data::TokenizerOptions> folder_tokenizer(const fs::path& folder, const std::string& type,
                                                       std::vector<std::string>& files) {
  std::error_code ec;
  auto has = [&](const char* f) { return fs::is_regular_file(folder / f, ec); };
  data::TokenizerOptions t;
  if (type == "megatron-bert" && has("vocab.txt")) {  // BertTokenizer's WordPiece vocabulary
    bool lower = true;
    if (has("tokenizer_config.json")) {
      const json j = read_json(folder / "tokenizer_config.json");
      if (j.is_object() && j.contains("do_lower_case") && j["do_lower_case"].is_boolean())
        lower = j["do_lower_case"].get<bool>();
    }
    t.type = lower ? "BertWordPieceLowerCase" : "BertWordPieceCase";
    t.vocab_file = "vocab.txt";
    files = {"vocab.txt"};
  } else if (has("vocab.json") && has("merges.txt") && (type == "gpt2" || !has("tokenizer.json"))) {
    t.type = "GPT2BPETokenizer";
    t.vocab_file = "vocab.json";
    t.merge_file = "merges.txt";
    files = {"vocab.json", "merges.txt"};
  } else if (has("tokenizer.model") && (type == "llama" || type == "mixtral" || type == "qwen2_moe" || !has("tokenizer.json"))) {
    t.type = "Llama2Tokenizer";
    t.tokenizer_model = "tokenizer.model";
    files = {"tokenizer.model"};
  } else if (has("tokenizer.json")) {
    t.type = "HuggingFaceTokenizer";
    t.tokenizer_model = "tokenizer.json";
    files = {"tokenizer.json"};
  } else {
    return std::nullopt;
  }
  if (has("tokenizer_config.json")) files.push_back("tokenizer_config.json");
  for (std::string& f : files) f = (folder / f).string();
  return t;
}

}  // namespace

// The architecture's own keys, then every row's column (model/model_settings_hf.cpp) in the
// table's order (the sizes before what depends on them).
model::TransformerConfig hf_config_to_model(const model::HfConfigFile& cfg) {
  MG_REQUIRE(cfg.j.is_object(), cfg.label, ": expected a JSON object");
  const std::string type = cfg.string("model_type", "");
  std::optional<model::HfArch> arch;
  for (size_t i = 0; i < model::kHfArchCount; ++i)
    if (type == model::kHfArchNames[i]) arch = model::HfArch(i);
  if (!arch)
    cfg.unsupported("model_type", "this build imports gpt2 (GPT2LMHeadModel), llama "
                    "(LlamaForCausalLM), megatron-bert (MegatronBertForPreTraining, "
                    "MegatronBertForMaskedLM), mixtral (MixtralForCausalLM) and qwen2_moe "
                    "(Qwen2MoeForCausalLM) models");
  if (*arch == model::HfArch::mixtral) {  // (jitter: training-time noise on the router's input)
    if (cfg.number("router_jitter_noise", 0.0) != 0.0)
      cfg.unsupported("router_jitter_noise", "the router's input is not jittered here (training "
                      "would differ from transformers'); set it to 0.0");
  }
  if (*arch == model::HfArch::gpt2) {
    if (!cfg.boolean("scale_attn_weights", true))
      cfg.unsupported("scale_attn_weights", "attention is scaled by 1/sqrt(head dim) here");
    if (cfg.boolean("scale_attn_by_inverse_layer_idx", false))
      cfg.unsupported("scale_attn_by_inverse_layer_idx", "no per-layer attention scaling here");
  }
  model::TransformerConfig c;
  for (const model::ModelSetting& s : model::model_settings())
    if (const model::HfMapping& m = s.hf[size_t(*arch)]; m.read) m.read(cfg, c);
  return c;
}

HfImport read_hf_checkpoint(const fs::path& folder, int64_t divisor, int target_tp,
                            const std::optional<data::TokenizerOptions>& tokenizer) try {
  std::error_code ec;
  MG_REQUIRE(fs::is_directory(folder, ec), "--load ", folder.string(), " is not a directory");
  const fs::path config_path = folder / "config.json";
  MG_REQUIRE(fs::is_regular_file(config_path, ec), config_path.string(),
             " is missing: --load-format hf reads a Hugging Face transformers model folder "
             "(config.json and model.safetensors)");
  const model::HfConfigFile cfg{read_json(config_path), config_path.string()};
  HfImport out;
  out.model_type = cfg.j.is_object() ? cfg.string("model_type", "") : "";
  MG_REQUIRE(out.model_type != "t5" && out.model_type != "mt5" && out.model_type != "umt5",
             cfg.label, ": model_type '", out.model_type, "': cannot import transformers' T5 as "
             "Megatron's T5Model: ", t5_hf_mismatch());
  model::TransformerConfig c = hf_config_to_model(cfg);
  const int64_t V = cfg.integer("vocab_size");

  const bool bert = out.model_type == "megatron-bert";
  Tensors x = read_tensors(folder, out.model_type == "gpt2" ? "transformer." : bert ? "bert." : "model.");
  std::map<std::string, Tensor>& m = out.model;
  if (out.model_type == "gpt2")
    gpt2_tensors(x, c, V, folder.string(), m);
  else if (bert)
    megatron_bert_tensors(x, c, V, cfg.integer("type_vocab_size", 2), folder.string(), m);
  else  // llama, mixtral, qwen2_moe
    llama_tensors(x, c, V, folder.string(), hf_arch_named(out.model_type), m);
  const Tensor& emb = m.at("embedding.word_embeddings.weight");
  const std::string head_name = bert ? "cls.predictions.decoder.weight" : "lm_head.weight";
  if (c.untie_embeddings_and_output_weights) {
    m["output_layer.weight"] = x.take(head_name, {V, c.hidden_size}, folder.string());
  } else if (x.t.count(head_name)) {  // a tied copy saved anyway: it must be the embedding
    const Tensor& head = x.t.at(head_name);
    MG_REQUIRE(head.shape() == emb.shape() && head.dtype() == emb.dtype() &&
                   std::memcmp(head.raw_data(), emb.raw_data(), head.nbytes()) == 0,
               x.file_of.at(head_name), ": ", head_name, " differs from the word embedding but "
               "config.json ties them (tie_word_embeddings): set \"tie_word_embeddings\": false");
    x.used.insert(head_name);
  }
  for (const auto& [name, t] : x.t)
    MG_REQUIRE(x.used.count(name) || skipped_buffer(name), x.file_of.at(name), ": unexpected tensor '",
               name, "' (not part of a ", out.model_type, " model as config.json describes it)");

  // One parameter dtype: the embedding's.
  const DType dtype = emb.dtype();
  MG_REQUIRE(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             x.file_of.begin()->second, ": weights must be float32, bfloat16 or float16, not ",
             dtype_name(dtype));
  bool mixed = false;
  for (auto& [name, t] : m)
    if (t.dtype() != dtype) t = t.to(dtype), mixed = true;
  if (mixed)
    out.notes.push_back(str("the folder mixes dtypes; every weight was converted to ", dtype_name(dtype)));

  c.params_dtype = dtype;
  c.padded_vocab_size = data::padded_vocab_size(V, divisor, target_tp);
  c.seq_length = c.max_position_embeddings;
  out.true_vocab_size = V;
  TrainingArgs& a = out.args;
  a.model = c;
  a.make_vocab_size_divisible_by = divisor;
  a.bf16 = dtype == DType::BF16;
  a.fp16 = dtype == DType::F16;
  if (auto t = folder_tokenizer(folder, out.model_type, out.tokenizer_files)) {
    a.tokenizer = *t;
  } else if (tokenizer && !tokenizer->type.empty()) {
    a.tokenizer = *tokenizer;
  } else {
    a.tokenizer.type = "NullTokenizer";
    a.tokenizer.vocab_size = V;
    out.notes.push_back(str(folder.string(), " has no tokenizer files (vocab.json + merges.txt, "
                            "tokenizer.json or tokenizer.model): the checkpoint records a NullTokenizer "
                            "of ", V, " ids; pass --tokenizer-type and its files to record another"));
  }
  return out;
} MG_CATCH_OUT_OF_MEMORY(folder.string())

}  // namespace megatron::training
