// A run placed on a world, checked as the trainer checks it (plan_config.h).
#include "plan/plan_config.h"

#include "core/error.h"
#include "data/mock_gpt_dataset.h"
#include "data/tokenizer.h"
#include "model/layer_spec.h"
#include "model/moe/moe_pattern.h"
#include "model/pipeline_layout.h"
#include "plan/data_memory.h"
#include "training/batch_size_schedule.h"

namespace megatron::plan {

std::string Layout::describe() const {
  std::string s = str("TP", tp, " PP", pp);
  if (vp > 1) s += str(" (VP", vp, ")");
  s += str(" CP", cp, " DP", dp, " mbs ", micro_batch_size);
  if (sequence_parallel && tp > 1) s += " SP";
  if (distributed_optimizer) s += " dist-opt";
  if (recompute != model::RecomputeGranularityId::none) s += std::string(" recompute ") + recompute_label();
  return s;
}

Layout layout_of(const training::TrainingArgs& a, int world_size) {
  const training::ParallelArgs& p = a.parallel;
  Layout l;
  l.tp = p.tensor_model_parallel_size;
  l.pp = p.pipeline_model_parallel_size;
  l.cp = p.context_parallel_size;
  const int mp = l.tp * l.pp * l.cp;
  l.dp = mp > 0 ? world_size / mp : 1;
  l.vp = p.num_layers_per_virtual_pipeline_stage > 0 && l.pp > 0
             ? a.model.num_layers / l.pp / p.num_layers_per_virtual_pipeline_stage
             : 1;
  l.micro_batch_size = a.micro_batch_size;
  l.sequence_parallel = a.model.sequence_parallel;
  l.distributed_optimizer = p.use_distributed_optimizer;
  l.recompute = a.model.recompute_granularity_id();
  return l;
}

training::TrainingArgs apply_layout(training::TrainingArgs a, const Layout& l) {
  training::ParallelArgs& p = a.parallel;
  p.tensor_model_parallel_size = l.tp;
  p.pipeline_model_parallel_size = l.pp;
  p.context_parallel_size = l.cp;
  p.num_layers_per_virtual_pipeline_stage = l.vp > 1 ? a.model.num_layers / l.pp / l.vp : 0;
  p.use_distributed_optimizer = l.distributed_optimizer;
  if (!l.distributed_optimizer) p.overlap_param_gather = false;
  a.micro_batch_size = l.micro_batch_size;
  a.model.sequence_parallel = l.sequence_parallel && l.tp > 1;
  if (l.recompute != model::RecomputeGranularityId::full) {
    a.model.recompute_granularity = model::kind_name(l.recompute);
    a.model.recompute_method.clear();
  } else if (!a.model.full_recompute()) {  // keep a run's own full-recompute method
    a.model.recompute_granularity = model::kind_name(model::RecomputeGranularityId::full);
    a.model.recompute_method = model::kind_name(model::RecomputeMethodId::uniform);
    a.model.recompute_num_layers = 1;
  }
  return a;
}

PlanInput make_plan_input(training::TrainingArgs a, int world_size, int64_t vocab_size,
                          bool size_data) {
  MG_REQUIRE(world_size >= 1, "--world-size must be >= 1 (got ", world_size, ")");
  training::validate_args(a);
  training::validate_parallel_args(a, world_size);
  PlanInput in;
  in.world_size = world_size;
  in.vocab_size = vocab_size;
  in.layout = layout_of(a, world_size);
  const int tp = in.layout.tp, dp = in.layout.dp;
  const int64_t mbs = a.micro_batch_size;
  // The global batch per iteration, as setup_training builds its schedule.
  const training::BatchSizeSchedule schedule =
      !a.rampup_batch_size.empty()
          ? training::BatchSizeSchedule::rampup(a.rampup_batch_size[0], a.rampup_batch_size[1],
                                                a.rampup_batch_size[2], a.global_batch_size)
      : !a.step_batch_size_schedule.empty()
          ? training::BatchSizeSchedule::step(a.step_batch_size_schedule, a.model.seq_length)
          : training::BatchSizeSchedule::constant(a.global_batch_size > 0 ? a.global_batch_size
                                                                          : mbs * dp);
  in.global_batch_size = schedule.final_global_batch_size();
  MG_REQUIRE(in.global_batch_size % (mbs * dp) == 0, "the global batch size (",
             in.global_batch_size, ") is not divisible by --micro-batch-size (", mbs,
             ") times data parallel size (", dp, ")");
  in.num_microbatches = in.global_batch_size / (mbs * dp);
  in.first_num_microbatches = std::max<int64_t>(1, schedule.global_batch_size(0) / (mbs * dp));
  a.global_batch_size = in.global_batch_size;
  in.train_iters = a.train_iters > 0     ? a.train_iters
                   : a.train_samples > 0 ? schedule.train_iters_for_samples(a.train_samples)
                                         : 0;
  // The data builder's check of Megatron's synthetic documents (data/data_builder.cpp).
  MG_REQUIRE(!a.mock_data || vocab_size >= data::MockGPTLowLevelDataset::kMaxSequenceLength - 1,
             "--mock-data: Megatron's mock documents hold token ids up to ",
             data::MockGPTLowLevelDataset::kMaxSequenceLength - 2, ", but the vocabulary has ",
             vocab_size, " tokens; use a larger --vocab-size (NullTokenizer) or another tokenizer");
  a.model.padded_vocab_size =
      data::padded_vocab_size(vocab_size, a.make_vocab_size_divisible_by, tp);
  a.model.validate();
  a.model.validate_tensor_parallel(tp);
  a.model.validate_context_parallel(in.layout.cp);
  a.model.params_dtype = a.bf16 ? DType::BF16 : (a.fp16 ? DType::F16 : DType::F32);
  if (model::activation_kind(a.model.activation).gated && a.model.ffn_hidden_size == 0) {
    const int64_t megatron_ffn =
        int64_t((4.0 * double(a.model.hidden_size) * 2.0 / 3.0) / 64.0) * 64;
    if (megatron_ffn != 4 * int64_t(a.model.hidden_size))
      in.megatron_ffn_hidden_size = megatron_ffn;
  }
  if (size_data) in.dataset_bytes = dataset_index_bytes(a, in.global_batch_size, in.train_iters);
  in.args = std::move(a);
  return in;
}

PlanInput with_layout(const PlanInput& base, const Layout& layout) {
  training::TrainingArgs a = apply_layout(base.args, layout);
  a.global_batch_size = base.global_batch_size;
  a.rampup_batch_size.clear();
  a.step_batch_size_schedule.clear();
  PlanInput in = make_plan_input(std::move(a), layout.world(), base.vocab_size, false);
  in.first_num_microbatches = in.num_microbatches;
  in.dataset_bytes = base.dataset_bytes;  // the batch and data are the same
  in.keeps_attention_probs = base.keeps_attention_probs;  // the same device
  return in;
}

ParallelConfig parallel_config(const PlanInput& in) {
  ParallelConfig pc;
  pc.world_size = in.world_size;
  pc.tensor_model_parallel_size = in.layout.tp;
  pc.pipeline_model_parallel_size = in.layout.pp;
  pc.context_parallel_size = in.layout.cp;
  return pc;
}

MegatronMemoryArgs megatron_args_for(const PlanInput& in) {
  const training::TrainingArgs& a = in.args;
  const model::TransformerConfig& m = a.model;
  const Layout& l = in.layout;
  MegatronMemoryArgs r;
  r.num_layers = m.num_layers;
  r.hidden_size = m.hidden_size;
  r.num_attention_heads = m.num_attention_heads;
  r.kv_channels = m.kv_channels > 0 ? m.kv_channels : m.hidden_size / m.num_attention_heads;
  r.swiglu = m.activation == "swiglu";
  r.ffn_hidden_size = in.megatron_ffn_hidden_size.value_or(m.ffn());
  if (m.num_moe_experts > 0) {  // Megatron: --num-experts 0 is None
    r.num_experts = m.num_moe_experts;
    r.moe_ffn_hidden_size = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : r.ffn_hidden_size;
    if (m.moe_shared_expert_intermediate_size > 0)
      r.moe_shared_expert_intermediate_size = m.moe_shared_expert_intermediate_size;
    r.moe_layer_pattern = model::moe_layer_pattern(m.moe_layer_freq, m.num_layers);
  }
  r.group_query_attention = m.num_query_groups > 0;
  r.num_query_groups = m.num_query_groups > 0 ? m.num_query_groups : 1;
  r.normalization = m.normalization;
  r.untie_embeddings_and_output_weights = m.untie_embeddings_and_output_weights;
  r.padded_vocab_size = m.padded_vocab_size;
  r.seq_length = m.seq_length;
  r.micro_batch_size = a.micro_batch_size;
  r.tensor_model_parallel_size = l.tp;
  r.pipeline_model_parallel_size = l.pp;
  // Megatron: (num_layers / PP) / --num-layers-per-virtual-pipeline-stage, even when that is 1.
  if (a.parallel.num_layers_per_virtual_pipeline_stage > 0)
    r.virtual_pipeline_model_parallel_size =
        m.num_layers / l.pp / a.parallel.num_layers_per_virtual_pipeline_stage;
  r.data_parallel_size = l.dp;
  r.use_distributed_optimizer = l.distributed_optimizer;
  r.sequence_parallel = m.sequence_parallel && l.tp > 1;
  r.recompute_granularity = m.recompute_granularity_id();
  return r;
}

}  // namespace megatron::plan
