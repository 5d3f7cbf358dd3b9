// Export of merged single-rank tensors as a transformers folder (hf_checkpoint.h has the names
// and layouts).
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "model/model_settings.h"
#include "training/checkpoint_files.h"
#include "training/hf_checkpoint.h"
#include "training/hf_checkpoint_internal.h"

namespace megatron::training {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using namespace hf_detail;

namespace {

// The tensors of the model under transformers' names, in module order.
class ExportTensors {
 public:
  ExportTensors(const MergedCheckpoint& m, const std::string& label) : m_(m), label_(label) {}

  const Tensor& take(const std::string& ours) {
    auto it = m_.model.find(ours);
    MG_REQUIRE(it != m_.model.end(), label_, " has no tensor '", ours, "', which the export needs");
    used_.insert(ours);
    return it->second;
  }
  bool has(const std::string& ours) const { return m_.model.count(ours) > 0; }
  void add(const std::string& hf_name, const Tensor& t) { out_.emplace_back(hf_name, t.contiguous()); }
  // Every tensor of the checkpoint must have been placed.
  void check_all_used(const std::string& cls) const {
    for (const auto& [name, t] : m_.model)
      MG_REQUIRE(used_.count(name), label_, ": tensor '", name, "' has no place in ", cls,
                 " (a setting the export does not know?)");
  }
  std::vector<std::pair<std::string, Tensor>>& tensors() { return out_; }

 private:
  const MergedCheckpoint& m_;
  std::string label_;
  std::set<std::string> used_;
  std::vector<std::pair<std::string, Tensor>> out_;
};

// --apply-layernorm-1p stores gamma - 1.
Tensor norm_weight(const Tensor& w, bool one_p) {
  if (!one_p) return w;
  Tensor f = w.to(DType::F32);
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] += 1.0f;
  return f.to(w.dtype());
}

std::string layer(int i) { return "decoder.layers." + std::to_string(i) + "."; }

void gpt2_tensors(ExportTensors& x, const model::TransformerConfig& c, int64_t vocab) {
  const bool one_p = c.apply_layernorm_1p;
  x.add("transformer.wte.weight", x.take("embedding.word_embeddings.weight").narrow(0, 0, vocab));
  x.add("transformer.wpe.weight", x.take("embedding.position_embeddings.weight"));
  const int n = c.num_attention_heads, d = c.head_dim();
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string o = layer(i), h = "transformer.h." + std::to_string(i) + ".";
    x.add(h + "ln_1.weight", norm_weight(x.take(o + "input_layernorm.weight"), one_p));
    x.add(h + "ln_1.bias", x.take(o + "input_layernorm.bias"));
    const QkvParts w = split_qkv(x.take(o + "self_attention.linear_qkv.weight"), n, n, d);
    x.add(h + "attn.c_attn.weight", transposed(cat_rows({w.q, w.k, w.v})));
    const QkvParts b = split_qkv(x.take(o + "self_attention.linear_qkv.bias"), n, n, d);
    x.add(h + "attn.c_attn.bias", cat_rows({b.q, b.k, b.v}));
    x.add(h + "attn.c_proj.weight", transposed(x.take(o + "self_attention.linear_proj.weight")));
    x.add(h + "attn.c_proj.bias", x.take(o + "self_attention.linear_proj.bias"));
    x.add(h + "ln_2.weight", norm_weight(x.take(o + "pre_mlp_layernorm.weight"), one_p));
    x.add(h + "ln_2.bias", x.take(o + "pre_mlp_layernorm.bias"));
    x.add(h + "mlp.c_fc.weight", transposed(x.take(o + "mlp.linear_fc1.weight")));
    x.add(h + "mlp.c_fc.bias", x.take(o + "mlp.linear_fc1.bias"));
    x.add(h + "mlp.c_proj.weight", transposed(x.take(o + "mlp.linear_fc2.weight")));
    x.add(h + "mlp.c_proj.bias", x.take(o + "mlp.linear_fc2.bias"));
  }
  x.add("transformer.ln_f.weight", norm_weight(x.take("decoder.final_layernorm.weight"), one_p));
  x.add("transformer.ln_f.bias", x.take("decoder.final_layernorm.bias"));
  if (c.untie_embeddings_and_output_weights)
    x.add("lm_head.weight", x.take("output_layer.weight").narrow(0, 0, vocab));
  x.check_all_used("GPT2LMHeadModel");
}

// LlamaForCausalLM, and the decoders of MixtralForCausalLM and Qwen2MoeForCausalLM.
void llama_tensors(ExportTensors& x, const model::TransformerConfig& c, int64_t vocab, model::HfArch arch) {
  const bool one_p = c.apply_layernorm_1p, bias = c.add_bias_linear;
  x.add("model.embed_tokens.weight", x.take("embedding.word_embeddings.weight").narrow(0, 0, vocab));
  const int n = c.num_attention_heads, g = c.query_groups(), d = c.head_dim();
  const int64_t f = c.ffn();
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string o = layer(i), h = "model.layers." + std::to_string(i) + ".";
    x.add(h + "input_layernorm.weight", norm_weight(x.take(o + "input_layernorm.weight"), one_p));
    for (const char* kind : {"weight", "bias"}) {
      const std::string k = kind;
      if (k == "bias" && !c.qkv_bias()) continue;  // (Qwen2-MoE: biases on q, k, v only)
      const QkvParts p = split_qkv(x.take(o + "self_attention.linear_qkv." + k), n, g, d);
      x.add(h + "self_attn.q_proj." + k, p.q);
      x.add(h + "self_attn.k_proj." + k, p.k);
      x.add(h + "self_attn.v_proj." + k, p.v);
      if (k == "weight" || bias) x.add(h + "self_attn.o_proj." + k, x.take(o + "self_attention.linear_proj." + k));
    }
    x.add(h + "post_attention_layernorm.weight", norm_weight(x.take(o + "pre_mlp_layernorm.weight"), one_p));
    if (c.is_moe_layer(i)) {  // Mixtral, Qwen2-MoE
      export_moe_block({[&](const std::string& n) -> const Tensor& { return x.take(n); },
                        [&](const std::string& n) { return x.has(n); },
                        [&](const std::string& n, const Tensor& t) { x.add(n, t); }},
                       c, i, arch);
      continue;
    }
    for (const char* kind : {"weight", "bias"}) {
      const std::string k = kind;
      if (k == "bias" && !bias) continue;
      const Tensor& fc1 = x.take(o + "mlp.linear_fc1." + k);
      MG_REQUIRE(fc1.size(0) == 2 * f, "linear_fc1." + k, " of layer ", i, " has ", fc1.size(0),
                 " rows, not [gate; up] of ", f, " each");
      x.add(h + "mlp.gate_proj." + k, fc1.narrow(0, 0, f));
      x.add(h + "mlp.up_proj." + k, fc1.narrow(0, f, f));
      x.add(h + "mlp.down_proj." + k, x.take(o + "mlp.linear_fc2." + k));
    }
  }
  x.add("model.norm.weight", norm_weight(x.take("decoder.final_layernorm.weight"), one_p));
  if (c.untie_embeddings_and_output_weights)
    x.add("lm_head.weight", x.take("output_layer.weight").narrow(0, 0, vocab));
  x.check_all_used(model::kHfArchClasses[size_t(arch)]);
}

// MegatronBertForPreTraining (with the binary head) or MegatronBertForMaskedLM.
void megatron_bert_tensors(ExportTensors& x, const model::TransformerConfig& c, int64_t vocab) {
  const bool one_p = c.apply_layernorm_1p;
  x.add("bert.embeddings.word_embeddings.weight",
        x.take("embedding.word_embeddings.weight").narrow(0, 0, vocab));
  x.add("bert.embeddings.position_embeddings.weight", x.take("embedding.position_embeddings.weight"));
  if (c.bert_binary_head) {
    x.add("bert.embeddings.token_type_embeddings.weight",
          x.take("embedding.tokentype_embeddings.weight"));
  } else {  // transformers always adds a token-type row; one of zeros adds nothing
    const Tensor& w = x.take("embedding.word_embeddings.weight");
    x.add("bert.embeddings.token_type_embeddings.weight", Tensor::zeros({1, w.size(1)}, w.dtype()));
  }
  const int n = c.num_attention_heads, d = c.head_dim();
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string o = "encoder.layers." + std::to_string(i) + ".";
    const std::string h = "bert.encoder.layer." + std::to_string(i) + ".";
    x.add(h + "attention.ln.weight", norm_weight(x.take(o + "input_layernorm.weight"), one_p));
    x.add(h + "attention.ln.bias", x.take(o + "input_layernorm.bias"));
    for (const char* kind : {"weight", "bias"}) {
      const std::string k = kind;
      const QkvParts p = split_qkv(x.take(o + "self_attention.linear_qkv." + k), n, n, d);
      x.add(h + "attention.self.query." + k, p.q);
      x.add(h + "attention.self.key." + k, p.k);
      x.add(h + "attention.self.value." + k, p.v);
    }
    for (const char* kind : {"weight", "bias"}) {
      const std::string k = kind;
      x.add(h + "attention.output.dense." + k, x.take(o + "self_attention.linear_proj." + k));
    }
    x.add(h + "ln.weight", norm_weight(x.take(o + "pre_mlp_layernorm.weight"), one_p));
    x.add(h + "ln.bias", x.take(o + "pre_mlp_layernorm.bias"));
    for (const char* kind : {"weight", "bias"}) {
      const std::string k = kind;
      x.add(h + "intermediate.dense." + k, x.take(o + "mlp.linear_fc1." + k));
      x.add(h + "output.dense." + k, x.take(o + "mlp.linear_fc2." + k));
    }
  }
  x.add("bert.encoder.ln.weight", norm_weight(x.take("encoder.final_layernorm.weight"), one_p));
  x.add("bert.encoder.ln.bias", x.take("encoder.final_layernorm.bias"));
  if (c.bert_binary_head) {
    x.add("bert.pooler.dense.weight", x.take("pooler.dense.weight"));
    x.add("bert.pooler.dense.bias", x.take("pooler.dense.bias"));
  }
  x.add("cls.predictions.bias", x.take("output_layer.bias").narrow(0, 0, vocab));
  x.add("cls.predictions.transform.dense.weight", x.take("lm_head.dense.weight"));
  x.add("cls.predictions.transform.dense.bias", x.take("lm_head.dense.bias"));
  x.add("cls.predictions.transform.LayerNorm.weight", x.take("lm_head.layer_norm.weight"));
  x.add("cls.predictions.transform.LayerNorm.bias", x.take("lm_head.layer_norm.bias"));
  if (c.untie_embeddings_and_output_weights)
    x.add("cls.predictions.decoder.weight", x.take("output_layer.weight").narrow(0, 0, vocab));
  if (c.bert_binary_head) {
    x.add("cls.seq_relationship.weight", x.take("binary_head.weight"));
    x.add("cls.seq_relationship.bias", x.take("binary_head.bias"));
  }
  x.check_all_used(c.bert_binary_head ? "MegatronBertForPreTraining" : "MegatronBertForMaskedLM");
}

std::optional<int64_t> id_or_null(std::optional<int32_t> a, std::optional<int32_t> b) {
  if (a) return *a;
  if (b) return *b;
  return std::nullopt;
}

void write_json(const fs::path& p, const ojson& j) { detail::write_text_file(p, j.dump(2) + "\n"); }

// Copies the tokenizer's files; what cannot be copied is a note naming the flag to pass.
void copy_tokenizer(const data::TokenizerOptions& t, int max_positions, const fs::path& dir,
                    std::vector<std::string>& files, std::vector<std::string>& notes) {
  std::error_code ec;
  auto copy = [&](const std::string& from, const std::string& to, const char* flag) {
    if (from.empty() || !fs::is_regular_file(from, ec)) {
      notes.push_back(str("the tokenizer file ", from.empty() ? "(none recorded)" : from,
                          " was not found, so ", to, " is not in the export: pass ", flag,
                          " to `checkpoint convert` to include it"));
      return false;
    }
    fs::copy_file(from, dir / to, fs::copy_options::overwrite_existing);
    detail::set_mode(dir / to, 0640);
    files.push_back(to);
    return true;
  };
  ojson cfg;
  if (t.type == "BertWordPieceLowerCase" || t.type == "BertWordPieceCase") {
    copy(t.vocab_file, "vocab.txt", "--vocab-file");
    cfg["tokenizer_class"] = "BertTokenizer";
    cfg["do_lower_case"] = t.type == "BertWordPieceLowerCase";
  } else if (t.type == "GPT2BPETokenizer") {
    copy(t.vocab_file, "vocab.json", "--vocab-file");
    copy(t.merge_file, "merges.txt", "--merge-file");
    cfg["tokenizer_class"] = "GPT2Tokenizer";
  } else if (t.type == "HuggingFaceTokenizer") {
    fs::path json_file = t.tokenizer_model;
    if (fs::is_directory(json_file, ec)) json_file /= "tokenizer.json";
    copy(json_file.string(), "tokenizer.json", "--tokenizer-model");
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  } else if (t.type == "SentencePieceTokenizer" || t.type == "GPTSentencePieceTokenizer" ||
             t.type == "Llama2Tokenizer") {
    copy(t.tokenizer_model, "tokenizer.model", "--tokenizer-model");
    cfg["tokenizer_class"] = "LlamaTokenizer";
  } else {
    notes.push_back(str("the tokenizer ", t.type.empty() ? "(none)" : t.type,
                        " has no files transformers loads; the export has none"));
    return;
  }
  cfg["model_max_length"] = max_positions;
  write_json(dir / "tokenizer_config.json", cfg);
  files.push_back("tokenizer_config.json");
}

}  // namespace

// The architecture's own keys, then every row's column (model/model_settings_hf.cpp); keys in
// transformers' order: architectures, model_type, then alphabetical.
ojson hf_config_json(const std::string& type, const model::TransformerConfig& c, int64_t vocab,
                     DType dtype, std::optional<int64_t> bos, std::optional<int64_t> eos) {
  const model::HfArch arch = hf_arch_named(type);
  auto id = [](std::optional<int64_t> v) { return v ? ojson(*v) : ojson(nullptr); };
  ojson rest = ojson::object();
  for (const model::ModelSetting& s : model::model_settings())
    if (const model::HfMapping& m = s.hf[size_t(arch)]; m.write) m.write(c, rest);
  std::map<std::string, ojson> keys;
  for (const auto& [k, v] : rest.items()) keys[k] = v;
  ojson j;
  if (arch == model::HfArch::megatron_bert) {
    j["architectures"] = {c.bert_binary_head ? "MegatronBertForPreTraining" : "MegatronBertForMaskedLM"};
    keys["pad_token_id"] = 0;
    keys["type_vocab_size"] = c.bert_binary_head ? 2 : 1;
  } else if (arch == model::HfArch::gpt2) {
    j["architectures"] = {"GPT2LMHeadModel"};
    keys["bos_token_id"] = id(bos);
    keys["eos_token_id"] = id(eos);
    keys["reorder_and_upcast_attn"] = false;
    keys["scale_attn_by_inverse_layer_idx"] = false;
    keys["scale_attn_weights"] = true;
  } else if (arch == model::HfArch::mixtral || arch == model::HfArch::qwen2_moe) {
    j["architectures"] = {model::kHfArchClasses[size_t(arch)]};
    keys["bos_token_id"] = id(bos);
    keys["eos_token_id"] = id(eos);
    keys["output_router_logits"] = false;
    if (arch == model::HfArch::mixtral) keys["router_jitter_noise"] = 0.0;
    if (arch == model::HfArch::qwen2_moe) keys["sliding_window"] = nullptr;  // (use_sliding_window false)
  } else {
    j["architectures"] = {"LlamaForCausalLM"};
    keys["bos_token_id"] = id(bos);
    keys["eos_token_id"] = id(eos);
    keys["pretraining_tp"] = 1;
  }
  j["model_type"] = type;
  keys["torch_dtype"] = torch_dtype_name(dtype);
  keys["use_cache"] = true;
  keys["vocab_size"] = vocab;
  for (auto& [k, v] : keys) j[k] = std::move(v);
  return j;
}

HfExportResult export_hf_checkpoint(const MergedCheckpoint& m, const TrainingArgs& args,
                                    const HfExportOptions& o) {
  const model::TransformerConfig& c = args.model;
  HfExportResult res;
  res.model_type = hf_model_type(c);
  const int64_t vocab = o.true_vocab_size;
  MG_REQUIRE(vocab >= 1 && vocab <= m.padded_vocab_size, "the vocabulary size ", vocab,
             " to export must be in [1, ", m.padded_vocab_size, "] (the padded vocabulary)");
  const std::string label = m.source.dir.string();
  ExportTensors x(m, label);
  if (res.model_type == "gpt2")
    gpt2_tensors(x, c, vocab);
  else if (res.model_type == "megatron-bert")
    megatron_bert_tensors(x, c, vocab);
  else  // llama, mixtral, qwen2_moe
    llama_tensors(x, c, vocab, hf_arch_named(res.model_type));
  const DType dtype = o.params_dtype ? *o.params_dtype : m.model.at("embedding.word_embeddings.weight").dtype();
  torch_dtype_name(dtype);  // refuses other dtypes
  for (auto& [name, t] : x.tensors())
    if (t.dtype() != dtype) t = t.to(dtype);
  res.tensors = x.tensors();

  // Special ids from the tokenizer, where it can be built.
  std::optional<int64_t> bos, eos;
  if (o.tokenizer) {
    try {
      const auto tok = data::build_tokenizer(*o.tokenizer);
      bos = id_or_null(tok->bos(), tok->eod());
      eos = id_or_null(tok->eos(), tok->eod());
    } catch (const Error& e) {
      res.notes.push_back(str("bos/eos ids left out of config.json: the tokenizer cannot be built (",
                              e.what(), ")"));
    }
  }

  // Everything goes to a temporary folder inside --save, then is moved up, config.json last.
  detail::create_private_dirs(o.save);
  const fs::path tmp = o.save / ".tmp_hf_export";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  detail::set_mode(tmp, 0750);
  std::vector<std::vector<size_t>> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (size_t i = 0; i < res.tensors.size(); ++i) {
    const int64_t b = int64_t(res.tensors[i].second.nbytes());
    if (!shards.back().empty() && shard_bytes + b > o.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += b;
    total += b;
  }
  const std::map<std::string, std::string> st_meta = {{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors(tmp / "model.safetensors", res.tensors, st_meta);
    res.files.push_back("model.safetensors");
    log_info("checkpoint convert: wrote model.safetensors (", total, " bytes)");
  } else {
    ojson map = ojson::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      std::vector<std::pair<std::string, Tensor>> part;
      for (size_t i : shards[s]) {
        part.push_back(res.tensors[i]);
        map[res.tensors[i].first] = name;
      }
      write_safetensors(tmp / name, part, st_meta);
      res.files.push_back(name);
      log_info("checkpoint convert: wrote ", name, " (", s + 1, " of ", shards.size(), ")");
    }
    write_json(tmp / "model.safetensors.index.json",
               ojson{{"metadata", {{"total_size", total}}}, {"weight_map", map}});
    res.files.push_back("model.safetensors.index.json");
  }
  for (const std::string& f : res.files) detail::set_mode(tmp / f, 0640);
  ojson gen;
  gen["_from_model_config"] = true;
  gen["bos_token_id"] = bos ? ojson(*bos) : ojson(nullptr);
  gen["eos_token_id"] = eos ? ojson(*eos) : ojson(nullptr);
  write_json(tmp / "generation_config.json", gen);
  res.files.push_back("generation_config.json");
  if (o.tokenizer)
    copy_tokenizer(*o.tokenizer, c.max_position_embeddings, tmp, res.files, res.notes);
  else
    res.notes.push_back("no tokenizer given: the export has no tokenizer files");
  write_json(tmp / "config.json", hf_config_json(res.model_type, c, vocab, dtype, bos, eos));
  res.files.push_back("config.json");
  for (const std::string& f : res.files) fs::rename(tmp / f, o.save / f);  // config.json last
  detail::fsync_path(o.save, true);
  fs::remove_all(tmp);

  if (o.print_structure)
    for (const auto& [name, t] : res.tensors)
      log_print(str(name, " ", shape_str(t.shape()), " ", dtype_name(t.dtype())));
  return res;
}

}  // namespace megatron::training
