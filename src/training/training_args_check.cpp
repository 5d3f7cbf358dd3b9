// Validation of pretrain-gpt's arguments (TrainingArgs, trainer.h) before anything is built: each
// error names the flags involved and what would be accepted. The model's own settings are
// checked by model::TransformerConfig::validate when the model is built.
#include <cstdint>

#include "core/error.h"
#include "model/pipeline_layout.h"
#include "training/trainer.h"
#include "training/torch_dist_write.h"

namespace megatron::training {

void validate_args(const TrainingArgs& a) {
  MG_REQUIRE(a.micro_batch_size > 0, "--micro-batch-size is required and must be > 0");
  const int64_t gbs = a.global_batch_size > 0 ? a.global_batch_size : a.micro_batch_size;
  MG_REQUIRE(gbs % a.micro_batch_size == 0, "--global-batch-size (", gbs,
             ") must be divisible by --micro-batch-size (", a.micro_batch_size, ")");
  MG_REQUIRE(a.model.num_layers > 0, "--num-layers is required and must be > 0");
  MG_REQUIRE(a.model.hidden_size > 0, "--hidden-size is required and must be > 0");
  MG_REQUIRE(a.model.num_attention_heads > 0, "--num-attention-heads is required and must be > 0");
  MG_REQUIRE(a.model.kv_channels > 0 || a.model.hidden_size % a.model.num_attention_heads == 0,
             "--hidden-size (", a.model.hidden_size, ") must be divisible by --num-attention-heads (",
             a.model.num_attention_heads, ") unless --kv-channels is given");
  MG_REQUIRE(a.model.seq_length > 0, "--seq-length is required and must be > 0");
  MG_REQUIRE(a.model.max_position_embeddings >= a.model.seq_length, "--max-position-embeddings (",
             a.model.max_position_embeddings, ") must be >= --seq-length (", a.model.seq_length, ")");
  MG_REQUIRE(!(a.fp16 && a.bf16), "--fp16 and --bf16 are mutually exclusive; pick one");
  if (a.model.family_id() == model::ModelFamilyId::bert) {  // pretrain_bert.py
    MG_REQUIRE(!a.calculate_per_token_loss, "--calculate-per-token-loss: BERT's loss is the mean "
               "over each micro-batch's masked tokens plus the sentence-order loss "
               "(pretrain_bert.py returns no token count), so there is no per-token form; drop "
               "the flag");
    MG_REQUIRE(!a.mock_data, "--mock-data is Megatron's synthetic GPT dataset; pretrain-bert "
               "needs --data-path with sentence-split data");
    MG_REQUIRE(!a.data.reset_position_ids && !a.data.reset_attention_mask && !a.data.eod_mask_loss,
               "--reset-position-ids, --reset-attention-mask and --eod-mask-loss belong to GPT's "
               "documents; BERT's samples are sentence pairs with their own padding");
    MG_REQUIRE(a.mask_prob > 0 && a.mask_prob < 1, "--mask-prob must be in (0, 1) (got ",
               a.mask_prob, ")");
    MG_REQUIRE(a.short_seq_prob >= 0 && a.short_seq_prob <= 1,
               "--short-seq-prob must be in [0, 1] (got ", a.short_seq_prob, ")");
  }
  if (a.model.family_id() == model::ModelFamilyId::t5) {  // pretrain_t5.py
    MG_REQUIRE(!a.data.reset_position_ids && !a.data.reset_attention_mask && !a.data.eod_mask_loss,
               "--reset-position-ids, --reset-attention-mask and --eod-mask-loss belong to GPT's "
               "documents; T5's samples are span-corrupted sentences with their own padding");
    MG_REQUIRE(a.mask_prob > 0 && a.mask_prob < 1, "--mask-prob must be in (0, 1) (got ",
               a.mask_prob, ")");
    MG_REQUIRE(a.ckpt_format != "torch" || a.parallel.pipeline_model_parallel_size == 1,
               "--ckpt-format torch (Megatron-LM's model_optim_rng.pt) is written for T5 with "
               "--pipeline-model-parallel-size 1 only; leave out --ckpt-format (this build's format)");
  }
  MG_REQUIRE(a.train_epochs == 0, "--train-epochs is not a Megatron-LM pretraining flag (only its "
             "finetuning tasks take --epochs); give the length as --train-iters N or --train-samples N");
  MG_REQUIRE(!(a.train_iters > 0 && a.train_samples > 0),
             "give exactly one of --train-iters and --train-samples");
  MG_REQUIRE(a.skip_train || a.train_iters > 0 || a.train_samples > 0,
             "give exactly one of --train-iters and --train-samples (or --skip-train to evaluate only)");
  if (!a.rampup_batch_size.empty()) {
    MG_REQUIRE(a.rampup_batch_size.size() == 3, "--rampup-batch-size expects <start batch size> "
               "<batch size increment> <ramp-up samples>");
    MG_REQUIRE(a.step_batch_size_schedule.empty(),
               "Cannot specify both --step-batch-size-schedule and --rampup-batch-size");
    MG_REQUIRE(a.train_iters == 0, "--rampup-batch-size needs sample-based training: Megatron-LM "
               "expects no batch-size rampup for iteration-based training; replace --train-iters "
               "with --train-samples (and -iters LR flags with -samples ones)");
    MG_REQUIRE(a.global_batch_size > 0, "--rampup-batch-size needs --global-batch-size (the batch "
               "size the ramp-up ends at)");
  }
  if (!a.step_batch_size_schedule.empty()) {
    MG_REQUIRE(a.global_batch_size == 0, "Cannot specify both --step-batch-size-schedule and "
               "--global-batch-size (the schedule's last batch size is the global batch size)");
    // Iteration-based training takes a step schedule as current Megatron-LM does: each iteration
    // consumes the batch the schedule gives for the samples consumed so far.
  }
  MG_REQUIRE(!a.decoupled_min_lr || a.decoupled_lr, "--decoupled-min-lr needs --decoupled-lr (the "
             "decoupled group exists only with it; Megatron-LM ignores --decoupled-min-lr alone)");
  MG_REQUIRE(!a.decoupled_lr || *a.decoupled_lr >= 0, "--decoupled-lr must be >= 0 (got ",
             a.decoupled_lr.value_or(0), ")");
  if (a.train_iters > 0) {
    MG_REQUIRE(a.lr_decay_samples == 0 && a.lr_warmup_samples == 0 && a.lr_wsd_decay_samples == 0,
               "iteration-based training (--train-iters) cannot use --lr-decay-samples, "
               "--lr-warmup-samples or --lr-wsd-decay-samples; use the -iters flags");
  } else {
    MG_REQUIRE(a.lr_decay_iters == 0 && a.lr_warmup_iters == 0 && a.lr_wsd_decay_iters == 0,
               "sample-based training (--train-samples) cannot use --lr-decay-iters, "
               "--lr-warmup-iters or --lr-wsd-decay-iters; use the -samples flags");
  }
  MG_REQUIRE(a.lr >= 0 || a.skip_train || (a.use_checkpoint_opt_param_scheduler && !a.load.empty()),
             "--lr is required (unless --load with --use-checkpoint-opt_param-scheduler)");
  MG_REQUIRE(a.lr < 0 || a.min_lr <= a.lr, "--min-lr (", a.min_lr, ") must be <= --lr (", a.lr, ")");
  MG_REQUIRE(a.lr_warmup_fraction < 0 || (a.lr_warmup_iters == 0 && a.lr_warmup_samples == 0),
             "--lr-warmup-fraction cannot be combined with --lr-warmup-iters/--lr-warmup-samples");
  MG_REQUIRE(a.lr_warmup_fraction < 0 || a.lr_warmup_fraction <= 1.0,
             "--lr-warmup-fraction must be in [0, 1]");
  MG_REQUIRE(a.mock_data || !a.data.data_path.empty() || !a.data.train_data_path.empty() ||
                 (a.skip_train && (!a.data.valid_data_path.empty() || !a.data.test_data_path.empty())),
             "--data-path (or --train-data-path, or --mock-data for Megatron's synthetic data) is required");
  MG_REQUIRE(!a.mock_data || (a.data.data_path.empty() && a.data.train_data_path.empty() &&
                              a.data.valid_data_path.empty() && a.data.test_data_path.empty()),
             "--mock-data cannot be combined with --data-path/--train-data-path/--valid-data-path/"
             "--test-data-path: keep one");
  MG_REQUIRE(!a.tokenizer.type.empty(), "--tokenizer-type is required");
  MG_REQUIRE(a.log_interval > 0, "--log-interval must be > 0");
  MG_REQUIRE(a.eval_interval > 0, "--eval-interval must be > 0");
  MG_REQUIRE(a.eval_iters >= 0, "--eval-iters must be >= 0");
  MG_REQUIRE(a.loss_scale >= 0, "--loss-scale must be > 0");
  MG_REQUIRE(a.save.empty() || a.save_interval > 0,
             "--save needs --save-interval N (> 0): how often to write a checkpoint");
  MG_REQUIRE(a.save_interval >= 0, "--save-interval must be > 0");
  MG_REQUIRE(!(a.override_opt_param_scheduler && a.use_checkpoint_opt_param_scheduler),
             "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are "
             "mutually exclusive: take the schedule from the command line or from the checkpoint");
  MG_REQUIRE(a.ckpt_step >= -1, "--ckpt-step must be >= 0");
  MG_REQUIRE(a.ckpt_step < 0 || !a.load.empty(), "--ckpt-step needs --load DIR");
  MG_REQUIRE(a.ckpt_format.empty() || a.ckpt_format == "torch_dist" || a.ckpt_format == "torch", "--ckpt-format ",
             a.ckpt_format, " is not supported: use torch_dist (Megatron-Core's torch_dist folder), torch "
             "(Megatron-LM's model_optim_rng.pt files), or leave it out (this build's resharding "
             "checkpoint format, safetensors per rank)");
  if (a.ckpt_format == "torch_dist" && !a.save.empty())
    check_torch_dist_save(a, a.parallel.num_layers_per_virtual_pipeline_stage > 0 ? 2 : 1, 1);
  MG_REQUIRE(a.weight_decay_incr_style == "constant" ||
                 (a.start_weight_decay >= 0 && a.end_weight_decay >= 0),
             "--weight-decay-incr-style ", a.weight_decay_incr_style,
             " needs --start-weight-decay and --end-weight-decay");
}

// Context parallelism (model/context_parallel.h): the sequence splits into 2 x CP chunks; under
// sequence parallelism each rank's S/CP tokens split again over TP.
void validate_context_parallel_args(const TrainingArgs& a) {
  const int C = a.parallel.context_parallel_size, T = a.parallel.tensor_model_parallel_size;
  const int64_t S = a.model.seq_length;
  MG_REQUIRE(C >= 1, "--context-parallel-size must be >= 1 (got ", C, ")");
  if (C == 1) return;
  MG_REQUIRE(S % (2 * C) == 0, "--seq-length ", S, " is not divisible by 2 x --context-parallel-size = ",
             2 * C, " (each context-parallel rank holds 2 of the 2 x CP sequence chunks)");
  MG_REQUIRE(!a.model.sequence_parallel || T == 1 || (S / C) % T == 0, "--seq-length ", S,
             " / --context-parallel-size ", C, " is not divisible by --tensor-model-parallel-size ", T,
             " (required by --sequence-parallel: each rank holds seq-length / CP / TP of the tokens)");
}

void validate_parallel_args(const TrainingArgs& a, int world_size) {
  const ParallelArgs& p = a.parallel;
  MG_REQUIRE(p.tensor_model_parallel_size >= 1, "--tensor-model-parallel-size must be >= 1 (got ",
             p.tensor_model_parallel_size, ")");
  MG_REQUIRE(p.pipeline_model_parallel_size >= 1, "--pipeline-model-parallel-size must be >= 1 (got ",
             p.pipeline_model_parallel_size, ")");
  MG_REQUIRE(p.num_layers_per_virtual_pipeline_stage >= 0,
             "--num-layers-per-virtual-pipeline-stage must be > 0 (got ",
             p.num_layers_per_virtual_pipeline_stage, ")");
  // L % PP, and with virtual stages (L / PP) % layers-per-virtual-stage (errors name the flags).
  const model::PipelineLayout pl = model::PipelineLayout::make(
      int(a.model.num_layers), p.pipeline_model_parallel_size, p.num_layers_per_virtual_pipeline_stage);
  validate_context_parallel_args(a);
  MG_REQUIRE(p.ddp_bucket_size >= 0, "--ddp-bucket-size must be > 0 (got ", p.ddp_bucket_size, ")");
  MG_REQUIRE(p.distributed_timeout_minutes > 0, "--distributed-timeout-minutes must be > 0");
  MG_REQUIRE(!p.overlap_param_gather || (p.use_distributed_optimizer && p.overlap_grad_reduce),
             "--overlap-param-gather requires --use-distributed-optimizer and --overlap-grad-reduce");
  const int mp = p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size;
  MG_REQUIRE(world_size % mp == 0, "the world size ", world_size,
             " is not divisible by --tensor-model-parallel-size ", p.tensor_model_parallel_size,
             " x --pipeline-model-parallel-size ", p.pipeline_model_parallel_size,
             " x --context-parallel-size ", p.context_parallel_size, " = ", mp,
             "; launch a multiple of ", mp, " ranks (data-parallel size = world / ", mp, ")");
  const int dp = world_size / mp;
  const int64_t gbs = a.global_batch_size > 0 ? a.global_batch_size : a.micro_batch_size * dp;
  MG_REQUIRE(gbs % (a.micro_batch_size * dp) == 0, "--global-batch-size (", gbs,
             ") must be divisible by --micro-batch-size (", a.micro_batch_size,
             ") x data-parallel size (", dp, " = world ", world_size, " / (TP x PP x CP))");
  const int64_t num_micro = gbs / (a.micro_batch_size * dp);
  // Megatron (before microbatch groups): the interleaved schedule takes micro-batches in groups
  // of PP, so their number must be a multiple of PP.
  MG_REQUIRE(pl.num_chunks == 1 || num_micro % pl.pipeline_size == 0,
             "number of micro-batches per data-parallel rank (", num_micro, " = --global-batch-size ",
             gbs, " / (--micro-batch-size ", a.micro_batch_size, " x data-parallel size ", dp,
             ")) is not divisible by --pipeline-model-parallel-size ", pl.pipeline_size,
             " as the interleaved schedule (--num-layers-per-virtual-pipeline-stage) requires");
}

}  // namespace megatron::training
