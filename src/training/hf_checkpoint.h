// Hugging Face transformers folders, exported from and imported into our checkpoints
// (`megatron checkpoint convert --save-format hf` / `--load-format hf`):
//
//   OUT/config.json                      the model class's configuration (below)
//   OUT/generation_config.json           bos / eos ids
//   OUT/model.safetensors                every tensor, or, past --max-shard-size,
//   OUT/model-00001-of-0000N.safetensors + OUT/model.safetensors.index.json
//                                        ({"metadata": {"total_size": bytes}, "weight_map": {name: file}})
//   OUT/vocab.json, merges.txt | tokenizer.json | tokenizer.model, tokenizer_config.json
//                                        the checkpoint's tokenizer files, copied
//
// One row per model type (megatron-bert, and the mixture-of-experts mixtral and qwen2_moe, are
// described in README.md and hf_checkpoint_internal.h):
//
//   gpt2 (GPT2LMHeadModel): learned absolute positions, LayerNorm, GeLU (tanh form "gelu_new", or
//     exact "gelu"), biases on every linear layer, multi-head attention.
//       embedding.word_embeddings.weight [V, h]      transformer.wte.weight [V, h] (vocabulary cut)
//       embedding.position_embeddings.weight         transformer.wpe.weight
//       decoder.layers.N.input_layernorm.*            transformer.h.N.ln_1.*
//         .self_attention.linear_qkv.weight [3h, h]   .attn.c_attn.weight [h, 3h]
//         .self_attention.linear_proj.weight [h, h]   .attn.c_proj.weight [h, h] (transposed)
//         .pre_mlp_layernorm.*                        .ln_2.*
//         .mlp.linear_fc1.weight [f, h]               .mlp.c_fc.weight [h, f]
//         .mlp.linear_fc2.weight [h, f]               .mlp.c_proj.weight [f, h]
//       decoder.final_layernorm.*                     transformer.ln_f.*
//       output_layer.weight (untied only)             lm_head.weight (else tied to wte)
//     GPT-2's Conv1D stores weights [in, out]: every linear weight is transposed. Our fused QKV
//     rows are interleaved per head ([q_0; k_0; v_0; q_1; ...], d rows each; model/attention.h);
//     c_attn's output columns are [all q; all k; all v], heads in order within each.
//   llama (LlamaForCausalLM): rotary (rotate-half on each head's two halves, as our default,
//     non-interleaved rotary: no permutation), RMSNorm, SwiGLU, grouped-query attention, biases
//     all or none (attention_bias = mlp_bias).
//       embedding.word_embeddings.weight              model.embed_tokens.weight
//       decoder.layers.N.input_layernorm.weight       model.layers.N.input_layernorm.weight
//         .self_attention.linear_qkv.weight           .self_attn.{q,k,v}_proj.weight: per query
//                                                     group j our rows are [q heads of j; k_j; v_j]
//         .self_attention.linear_proj.weight          .self_attn.o_proj.weight
//         .pre_mlp_layernorm.weight                   .post_attention_layernorm.weight
//         .mlp.linear_fc1.weight [2f, h] = [gate; up] .mlp.gate_proj.weight, .mlp.up_proj.weight
//         .mlp.linear_fc2.weight                      .mlp.down_proj.weight
//       decoder.final_layernorm.weight                model.norm.weight
//       output_layer.weight (untied)                  lm_head.weight
//
// A setting the class cannot express (ALiBi or no position embedding, sliding windows,
// --qk-layernorm, squared ReLU, partial or interleaved rotary, a bidirectional mask, GQA or
// kv-channels != h/n for gpt2, a norm or activation of the other family) is an error naming the
// setting, never a silently different model. --apply-layernorm-1p weights are exported as 1 + w.
//
// Import reads config.json (model_type gpt2 or llama; a field that changes the function and that
// we cannot honour is an error naming it), the safetensors files (single, or sharded through the
// index), maps names back (with or without the "transformer." / "model." prefix; the causal-mask
// and rotary buffers some files carry are skipped), and pads the vocabulary by Megatron's rule.
// Every expected tensor must be there with its shape, and no other: errors name the file and the
// tensor. The tokenizer files found in the folder are copied next to the written checkpoint and
// recorded in its args (GPT2BPETokenizer for vocab.json + merges.txt, HuggingFaceTokenizer for
// tokenizer.json, Llama2Tokenizer for a SentencePiece tokenizer.model); with none, the tokenizer
// flags given to `checkpoint convert` are recorded, or a NullTokenizer of config.json's
// vocabulary size, with a note.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/tokenizer.h"
#include "model/hf_config.h"
#include "training/checkpoint_convert.h"
#include "training/trainer.h"

namespace megatron::training {

// transformers' max_shard_size text: an integer (bytes), or digits with KB / MB / GB (powers of
// 10; a lower-case final "b" means bits), KiB / MiB / GiB (powers of 2), any case. Errors name
// --max-shard-size.
int64_t parse_shard_size(const std::string& text);

// "gpt2", "llama", "megatron-bert", "mixtral" or "qwen2_moe" for our model settings, or an Error naming the setting the
// class cannot express (every row's column of model/model_settings_hf.cpp).
std::string hf_model_type(const model::TransformerConfig& c);
// The architecture of a model type; an Error for another.
model::HfArch hf_arch_named(const std::string& model_type);

// config.json of a model of type `type` (hf_model_type): the architecture's own keys and every
// row's keys; bos/eos null when unknown.
nlohmann::ordered_json hf_config_json(const std::string& type, const model::TransformerConfig& c,
                                      int64_t vocab, DType dtype, std::optional<int64_t> bos,
                                      std::optional<int64_t> eos);
// The model settings config.json gives (the rows' columns of its model_type, read from `config`);
// the sizes of the vocabulary and the tensors are the import's. Errors name the file and the key.
model::TransformerConfig hf_config_to_model(const model::HfConfigFile& config);

struct HfExportOptions {
  std::filesystem::path save;     // new or empty folder
  std::optional<DType> params_dtype;  // --target-params-dtype; default: as stored
  int64_t max_shard_bytes = 5'000'000'000;  // --max-shard-size (transformers' default "5GB")
  int64_t true_vocab_size = 0;    // the vocabulary rows kept
  std::optional<data::TokenizerOptions> tokenizer;  // files to copy, special ids; none: skipped
  bool print_structure = false;   // --print-checkpoint-structure
};

struct HfExportResult {
  std::string model_type;
  std::vector<std::pair<std::string, Tensor>> tensors;  // as written, in order
  std::vector<std::string> files;                       // written, relative to save
  std::vector<std::string> notes;
};

// Writes merged single-rank tensors (merge_checkpoint) of a model with these args as a
// transformers folder.
HfExportResult export_hf_checkpoint(const MergedCheckpoint& m, const TrainingArgs& args,
                                    const HfExportOptions& options);

// The model tensors of an HF folder under our names, the padded vocabulary of
// padded_vocab_size(vocab, divisor, target_tp) rows, and args describing the model.
struct HfImport {
  std::string model_type;
  TrainingArgs args;
  std::map<std::string, Tensor> model;
  int64_t true_vocab_size = 0;
  std::vector<std::string> tokenizer_files;  // absolute paths in the HF folder, to copy
  std::vector<std::string> notes;
};
// `tokenizer`: flags given to the converter, used when the folder has no tokenizer files.
HfImport read_hf_checkpoint(const std::filesystem::path& folder, int64_t make_vocab_size_divisible_by,
                            int target_tp, const std::optional<data::TokenizerOptions>& tokenizer);

}  // namespace megatron::training
