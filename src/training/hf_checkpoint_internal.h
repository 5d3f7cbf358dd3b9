// Internal to the Hugging Face export and import (hf_checkpoint*.cpp, checkpoint_convert.cpp):
// the fused-QKV layout conversions and small helpers both directions use, and the pieces of
// `checkpoint convert` the Hugging Face front ends share with it.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/hf_config.h"
#include "model/pipeline_layout.h"
#include "training/checkpoint_convert.h"
#include "training/trainer.h"

namespace megatron::training::hf_detail {

// Our fused QKV rows (weight or bias) for `groups` query groups of heads/groups query heads of
// head_dim rows each: per group [its query heads; its key; its value]. q holds the query heads in
// order (heads * head_dim rows), k and v one head per group (groups * head_dim rows).
struct QkvParts {
  Tensor q, k, v;
};
QkvParts split_qkv(const Tensor& fused, int heads, int groups, int head_dim);
Tensor fuse_qkv(const QkvParts& parts, int heads, int groups, int head_dim);

Tensor transposed(const Tensor& t);                // 2-D, contiguous copy
Tensor cat_rows(const std::vector<Tensor>& parts);  // along dim 0

// A float setting as the double of its shortest decimal text (1e-05, not 9.99999974737875e-06),
// so config.json reads as a person wrote it and reads back to the same float.
double short_float(float v);
// The mixture-of-experts block of one layer (hf_checkpoint_moe.cpp): our
//   decoder.layers.L.mlp.router.weight [E, h]
//   decoder.layers.L.mlp.experts.local_experts.e.linear_fc1.weight [2f, h] = [gate; up]
//     (or, grouped, decoder.layers.L.mlp.experts.linear_fc1.weight<e>), .linear_fc2.weight [h, f]
//   decoder.layers.L.mlp.shared_experts.linear_fc1.weight [2s, h], .linear_fc2.weight [h, s],
//     .gate_weight [1, h]
// against Mixtral's
//   model.layers.L.block_sparse_moe.gate.weight [E, h]
//   model.layers.L.block_sparse_moe.experts.e.w1.weight [f, h] (gate), .w3.weight (up), .w2.weight [h, f]
// and Qwen2-MoE's
//   model.layers.L.mlp.gate.weight [E, h]
//   model.layers.L.mlp.experts.e.{gate_proj, up_proj, down_proj}.weight
//   model.layers.L.mlp.shared_expert.{gate_proj, up_proj, down_proj}.weight,
//   model.layers.L.mlp.shared_expert_gate.weight [1, h].
// Export: `take` our tensor by name (an Error when absent), `has` whether it is there, `add` the
// tensor under its transformers name. Import: `take` the file's tensor by its name without the
// "model." prefix, checked against the shape; `out` our tensors.
struct MoeExportIo {
  std::function<const Tensor&(const std::string&)> take;
  std::function<bool(const std::string&)> has;
  std::function<void(const std::string&, const Tensor&)> add;
};
void export_moe_block(const MoeExportIo& io, const model::TransformerConfig& c, int layer, model::HfArch arch);
void import_moe_block(const std::function<Tensor(const std::string&, const Shape&)>& take,
                      const model::TransformerConfig& c, int layer, model::HfArch arch,
                      std::map<std::string, Tensor>& out);

// config.json's torch_dtype: "float32", "bfloat16", "float16".
const char* torch_dtype_name(DType t);
// Why Megatron's T5 and transformers' T5 do not convert into each other (export and import).
const char* t5_hf_mismatch();

}  // namespace megatron::training::hf_detail

namespace megatron::training::convert_detail {

// The unpadded vocabulary size: --true-vocab-size, or from the tokenizer (options.tokenizer, else
// the checkpoint's); nullopt with the reason in why_not.
std::optional<int64_t> true_vocab_size(const ConvertOptions& options, const TrainingArgs& args,
                                       std::string* why_not);
// The target layout checked against the model; `label` names the file of the model's arguments.
model::PipelineLayout target_layout(const TrainingArgs& args, const ConvertOptions& options,
                                    const std::string& label);
// Writes m's single-rank tensors (vocabulary padded for the target) in the target layout and
// format (ours or torch); m.source and m.metadata describe the source.
ConvertResult write_target(MergedCheckpoint& m, const ConvertOptions& options,
                           const model::PipelineLayout& layout, int num_layers, int64_t target_vocab,
                           ConvertResult res);

// --save-format hf from a checkpoint (hf_checkpoint_convert.cpp).
ConvertResult export_hf(const CheckpointOnDisk& ckpt, const TrainingArgs& args, const ConvertOptions& options);
// --load-format hf into any layout and format (hf_checkpoint_convert.cpp).
ConvertResult import_hf(const ConvertOptions& options);

}  // namespace megatron::training::convert_detail
