// `megatron pretrain-gpt`: Megatron-LM's pretrain_gpt.py flags (names and defaults) mapped onto
// training::TrainingArgs; the loop itself is training::pretrain. Under mpirun every rank runs
// this command with the same flags (data, tensor, sequence, pipeline — optionally interleaved —
// and context parallelism). Defaults as pretrain_gpt.py's: --tokenizer-type GPT2BPETokenizer,
// --recompute-num-layers 1, the fused bias-GeLU (tanh form) unless --no-bias-gelu-fusion.
// Flags naming kernels or backends this build always uses are accepted (megatron_compat.h); the
// ones that change what is computed (batch-size ramp-up and step schedule, decoupled LR, bf16
// gradient reduction, mock data, --skip-train) go to TrainingArgs and are checked by
// training::validate_args; --ckpt-format torch saves Megatron-LM's model_optim_rng.pt files.
#include <cmath>
#include <filesystem>
#include <limits>

#include "cli/bert_data_flags.h"
#include "cli/command.h"
#include "cli/device_flag.h"
#include "cli/megatron_compat.h"
#include "cli/pretrain_flags.h"
#include "cli/tokenizer_options.h"
#include "core/error.h"
#include "core/log.h"
#include "model/layer_spec.h"
#include "comm/communicator.h"
#include "training/trainer.h"

namespace megatron::cli {
namespace {


// The flags of training::TrainingArgs the loop does not act on yet (see trainer.h): an error
// naming each, unless it has Megatron's default value or a meaning the loop already has; a note
// for --grad-reduce-in-bf16 without --bf16 (no effect, as in Megatron-LM).
void reject_pending_flags(const training::TrainingArgs& a) {
  if (a.grad_reduce_in_bf16 && !a.bf16)
    log_info("note: --grad-reduce-in-bf16 has no effect without --bf16 (as in Megatron-LM: "
             "gradients of fp32 and fp16 models are reduced in their own dtype here, fp32)");
}

// Relative tokenizer file names are made absolute, so the checkpoint's arguments name files that
// tools run from another folder (checkpoint convert) still find.
void absolute_if_exists(std::string& path) {
  std::error_code ec;
  if (!path.empty() && std::filesystem::path(path).is_relative() && std::filesystem::exists(path, ec))
    path = std::filesystem::absolute(path, ec).lexically_normal().string();
}

}  // namespace

training::TrainingArgs resolve_pretrain_flags(PretrainFlags f) {
  auto& a = f.a;
  auto& sub = *f.app;
  MG_REQUIRE(f.batch_size == 0, "--batch-size is no longer valid (Megatron-LM removed it): use "
             "--micro-batch-size");
  MG_REQUIRE(f.warmup == 0, "--warmup is no longer valid (Megatron-LM removed it): use "
             "--lr-warmup-fraction or --lr-warmup-iters");
  MG_REQUIRE(f.model_parallel_size == 0, "--model-parallel-size is no longer valid (Megatron-LM "
             "removed it): use --tensor-model-parallel-size");
  check_megatron_flags(f.megatron);
  check_compat_flags(f.compat, sub, CompatScope::Model);
  check_compat_flags(f.compat, sub, CompatScope::Training);
  if (!std::isnan(f.decoupled_lr)) a.decoupled_lr = f.decoupled_lr;
  if (!std::isnan(f.decoupled_min_lr)) a.decoupled_min_lr = f.decoupled_min_lr;
  reject_pending_flags(a);
  a.transformer_impl = f.compat.transformer_impl;  // the names --ckpt-format torch writes
  // The architecture from Megatron's model flags (model_flags.h); the run-time fields
  // (recomputation, sequence parallelism, CP exchange) were parsed into a.model directly.
  {
    const model::TransformerConfig run_fields = a.model;
    a.model = f.model.resolve();
    a.model.recompute_granularity = run_fields.recompute_granularity;
    a.model.recompute_method = run_fields.recompute_method;
    a.model.recompute_num_layers = run_fields.recompute_num_layers;
    a.model.sequence_parallel = run_fields.sequence_parallel;
    a.model.cp_comm_type = run_fields.cp_comm_type;
    a.model.apply_query_key_layer_scaling = run_fields.apply_query_key_layer_scaling;
  }
  if (f.bert) {  // BertModel: the encoder attends in both directions under the padding mask
    a.model.model_family = model::kind_name(model::ModelFamilyId::bert);
    a.model.attention_mask_type = "bidirectional";
    a.model.bert_binary_head = f.bert_data.binary_head;
    a.mask_prob = f.bert_data.mask_prob;
    a.short_seq_prob = f.bert_data.short_seq_prob;
  }
  if (f.t5) apply_t5_flags(f.t5_flags, f.model, a);
  f.moe.apply(a);  // after the model and the parallel sizes are resolved
  // The Ascend scripts' band of keys (--pre-tockens / --next-tockens) inside the causal mask.
  f.model.apply_band(a.model);
  if (f.checkpoint_activations) {
    // Megatron-LM's old flag: recompute every layer's input, one layer per chunk.
    MG_REQUIRE(a.model.recompute_granularity.empty(), "--checkpoint-activations and "
               "--recompute-granularity cannot be combined: keep --recompute-granularity");
    log_info("note: --checkpoint-activations (removed from Megatron-LM) is taken as "
             "--recompute-granularity full --recompute-method uniform");
    a.model.recompute_granularity = model::kind_name(model::RecomputeGranularityId::full);
    if (a.model.recompute_method.empty())
      a.model.recompute_method = model::kind_name(model::RecomputeMethodId::uniform);
  }
  if (f.recompute_activations)  // as Megatron
    a.model.recompute_granularity = model::kind_name(model::RecomputeGranularityId::selective);
  absolute_if_exists(a.tokenizer.vocab_file);
  absolute_if_exists(a.tokenizer.merge_file);
  absolute_if_exists(a.tokenizer.tokenizer_model);
  return a;
}

namespace {

void run(const PretrainFlags& f) {
  training::TrainingSummary s = training::pretrain(resolve_pretrain_flags(f));
  if (world_communicator()->rank() == s.world_size - 1)  // the rank that printed the log lines
    log_print(str("training finished: ", s.iterations, " iterations, ", s.consumed_samples,
                " samples, last lm loss ", s.last_loss, ", ", s.tokens_per_second, " tokens/s"));
}

}  // namespace

void add_pretrain_flags(CLI::App& sub, PretrainFlags* f) {
  f->app = &sub;
  auto& a = f->a;
  auto& m = a.model;
  m.recompute_num_layers = 1;             // Megatron's default
  // model
  f->model.add(sub, /*training=*/true);
  f->moe.add(sub, &f->model.config);
  sub.add_option("--make-vocab-size-divisible-by", a.make_vocab_size_divisible_by,
                 "Vocab padding multiple")->capture_default_str();
  sub.add_flag("--apply-query-key-layer-scaling", m.apply_query_key_layer_scaling,
               "Scale Q.K^T by 1/layer (undone in the fp32 softmax: same result)");
  sub.add_option("--recompute-granularity", m.recompute_granularity, "full | selective")
      ->check(CLI::IsMember(model::recompute_granularity_names()));
  sub.add_option("--recompute-method", m.recompute_method, "uniform | block")
      ->check(CLI::IsMember(model::recompute_method_names()));
  sub.add_option("--recompute-num-layers", m.recompute_num_layers,
                 "uniform: layers per recompute chunk; block: layers recomputed per stage")
      ->capture_default_str();
  sub.add_flag("--recompute-activations", f->recompute_activations,
               "Same as --recompute-granularity selective");
  sub.add_flag("--checkpoint-activations", f->checkpoint_activations,
               "Megatron-LM's old name for --recompute-granularity full --recompute-method uniform");
  // batch / schedule / optimizer
  sub.add_option("--micro-batch-size", a.micro_batch_size, "Micro-batch size");
  sub.add_option("--global-batch-size", a.global_batch_size, "Global batch size (default micro)");
  sub.add_option("--batch-size", f->batch_size, "Removed from Megatron-LM: use --micro-batch-size");
  sub.add_option("--rampup-batch-size", a.rampup_batch_size,
                 "START INCR SAMPLES: global batch from START, +INCR every SAMPLES / ((global - START) "
                 "/ INCR) consumed samples (needs --train-samples)")
      ->expected(3);
  sub.add_option("--step-batch-size-schedule", a.step_batch_size_schedule,
                 "\"TOKENS:BATCH ...\" global batch from each consumed-token threshold on (K/M/B/T "
                 "suffixes; first 0; needs --train-samples, replaces --global-batch-size)");
  sub.add_option("--train-epochs", a.train_epochs,
                 "Not a Megatron-LM pretraining flag: refused; use --train-iters or --train-samples");
  sub.add_flag("--skip-train", a.skip_train, "Evaluate only: validation and test splits at the loaded iteration");
  sub.add_flag("--calculate-per-token-loss", a.calculate_per_token_loss,
               "Gradient of one token mean over the whole global batch (all micro-batches and "
               "DP x CP ranks); default, as Megatron-LM: each micro-batch's loss over its own "
               "loss tokens, averaged over micro-batches and DP x CP ranks");
  sub.add_option("--train-iters", a.train_iters, "Training iterations");
  sub.add_option("--train-samples", a.train_samples, "Training samples");
  sub.add_option("--lr", a.lr, "Peak learning rate");
  sub.add_option("--min-lr", a.min_lr, "Minimum learning rate")->capture_default_str();
  sub.add_option("--lr-decay-style", a.lr_decay_style, "constant|linear|cosine|inverse-square-root|WSD")
      ->capture_default_str();
  sub.add_option("--lr-decay-iters", a.lr_decay_iters, "Decay iterations (default --train-iters)");
  sub.add_option("--lr-decay-samples", a.lr_decay_samples, "Decay samples (default --train-samples)");
  sub.add_option("--lr-warmup-fraction", a.lr_warmup_fraction, "Warmup as a fraction of the decay");
  sub.add_option("--lr-warmup-iters", a.lr_warmup_iters, "Warmup iterations")->capture_default_str();
  sub.add_option("--lr-warmup-samples", a.lr_warmup_samples, "Warmup samples")->capture_default_str();
  sub.add_option("--lr-warmup-init", a.lr_warmup_init, "Warmup start LR")->capture_default_str();
  sub.add_option("--warmup", f->warmup, "Removed from Megatron-LM: use --lr-warmup-fraction");
  sub.add_option("--decoupled-lr", f->decoupled_lr,
                 "Peak LR of the word embedding and output layer (same warmup and decay)");
  sub.add_option("--decoupled-min-lr", f->decoupled_min_lr,
                 "Minimum LR of the word embedding and output layer (default --min-lr)");
  sub.add_option("--lr-wsd-decay-style", a.lr_wsd_decay_style, "exponential|linear|cosine|minus_sqrt")
      ->capture_default_str();
  sub.add_option("--lr-wsd-decay-iters", a.lr_wsd_decay_iters, "WSD anneal iterations");
  sub.add_option("--lr-wsd-decay-samples", a.lr_wsd_decay_samples, "WSD anneal samples");
  sub.add_option("--weight-decay", a.weight_decay, "Weight decay")->capture_default_str();
  sub.add_option("--start-weight-decay", a.start_weight_decay, "Initial weight decay");
  sub.add_option("--end-weight-decay", a.end_weight_decay, "Final weight decay");
  sub.add_option("--weight-decay-incr-style", a.weight_decay_incr_style, "constant|linear|cosine")
      ->capture_default_str();
  sub.add_option("--clip-grad", a.optimizer.clip_grad, "Global grad-norm clip (0: off)")->capture_default_str();
  sub.add_option("--adam-beta1", a.optimizer.adam_beta1, "Adam beta1")->capture_default_str();
  sub.add_option("--adam-beta2", a.optimizer.adam_beta2, "Adam beta2")->capture_default_str();
  sub.add_option("--adam-eps", a.optimizer.adam_eps, "Adam epsilon")->capture_default_str();
  sub.add_option("--optimizer", a.optimizer_name, "adam | sgd")->capture_default_str();
  sub.add_option("--sgd-momentum", a.optimizer.sgd_momentum, "SGD momentum")->capture_default_str();
  sub.add_option("--seed", a.seed, "Random seed")->capture_default_str();
  if (f->device_flag) add_device_option(sub, a.device);
  // precision
  sub.add_flag("--fp16", a.fp16, "fp16 parameters with loss scaling");
  sub.add_flag("--bf16", a.bf16, "bf16 parameters");
  sub.add_option("--loss-scale", a.loss_scale, "Static loss scale (default: dynamic for fp16)");
  sub.add_option("--initial-loss-scale", a.initial_loss_scale, "Dynamic scale start")->capture_default_str();
  sub.add_option("--min-loss-scale", a.min_loss_scale, "Dynamic scale floor")->capture_default_str();
  sub.add_option("--loss-scale-window", a.loss_scale_window, "Clean steps before growth")->capture_default_str();
  sub.add_option("--hysteresis", a.hysteresis, "Overflows tolerated before backoff")->capture_default_str();
  sub.add_flag("--grad-reduce-in-bf16", a.grad_reduce_in_bf16,
               "With --bf16: round gradients to bf16 before the data-parallel reduction and the sum "
               "to bf16 (without --bf16 no effect, as in Megatron-LM)");
  sub.add_flag("--accumulate-allreduce-grads-in-fp32", f->accumulate_allreduce_grads_in_fp32,
               "Gradients always accumulate and reduce in fp32 here");
  // parallelism: world size = TP x PP x CP x DP (mpirun -np N)
  auto& par = a.parallel;
  sub.add_option("--tensor-model-parallel-size", par.tensor_model_parallel_size,
                 "Tensor-parallel ranks")->capture_default_str();
  sub.add_option("--pipeline-model-parallel-size", par.pipeline_model_parallel_size,
                 "Pipeline stages (1F1B schedule)")->capture_default_str();
  sub.add_option("--num-layers-per-virtual-pipeline-stage", par.num_layers_per_virtual_pipeline_stage,
                 "Layers per model chunk: interleaved 1F1B with (num-layers / PP) / this chunks per "
                 "pipeline rank");
  sub.add_option("--context-parallel-size", par.context_parallel_size,
                 "Context-parallel ranks: each sequence split over CP ranks in 2 x CP chunks")
      ->capture_default_str();
  sub.add_option("--cp-comm-type", m.cp_comm_type,
                 "How context-parallel attention exchanges keys and values: p2p (ring, overlapped "
                 "with compute) or allgather; a2a is not implemented")
      ->check(CLI::IsMember(model::cp_comm_type_names()))
      ->capture_default_str();
  sub.add_flag("--sequence-parallel", m.sequence_parallel,
               "Shard LayerNorm/dropout regions along the sequence (TP > 1)");
  sub.add_flag("--use-distributed-optimizer", par.use_distributed_optimizer,
               "Shard fp32 main weights and optimizer state over data-parallel ranks");
  sub.add_flag("--overlap-grad-reduce", par.overlap_grad_reduce,
               "Start each gradient bucket's reduction during backward");
  sub.add_flag("--overlap-param-gather", par.overlap_param_gather,
               "Overlap the distributed optimizer's parameter all-gather with the next forward "
               "(each bucket is waited for before its first layer; needs "
               "--use-distributed-optimizer --overlap-grad-reduce)");
  sub.add_option("--ddp-bucket-size", par.ddp_bucket_size,
                 "Elements per gradient bucket with --overlap-grad-reduce (default max(40M, 1M x DP))");
  sub.add_option("--distributed-timeout-minutes", par.distributed_timeout_minutes,
                 "A collective waiting longer aborts the job")->capture_default_str();
  sub.add_option("--model-parallel-size", f->model_parallel_size,
                 "Removed from Megatron-LM: use --tensor-model-parallel-size");
  add_compat_flags(sub, f->compat, CompatScope::Model);
  add_compat_flags(sub, f->compat, CompatScope::Training);
  // data and tokenizer
  add_tokenizer_options(sub, a.tokenizer)->capture_default_str();
  sub.add_flag("--mock-data", a.mock_data,
               f->t5 ? "Synthetic span-corruption samples instead of --data-path: arithmetic "
                       "progressions of token ids with spans replaced by the --vocab-extra-ids "
                       "sentinels (not Megatron's data; Megatron has no mock T5 dataset)"
                     : "Megatron's synthetic dataset (100000 documents 1 2 .. L-1 EOD, split "
                       "1,1,1) instead of --data-path");
  sub.add_option("--data-path", a.data.data_path, "[WEIGHT] PREFIX ... blend");
  sub.add_option("--train-data-path", a.data.train_data_path, "[WEIGHT] PREFIX ...");
  sub.add_option("--valid-data-path", a.data.valid_data_path, "[WEIGHT] PREFIX ...");
  sub.add_option("--test-data-path", a.data.test_data_path, "[WEIGHT] PREFIX ...");
  sub.add_option("--split", a.data.split, "train,valid,test proportions")->capture_default_str();
  sub.add_option("--data-cache-path", a.data.data_cache_path, "Index cache folder");
  sub.add_flag("--reset-position-ids", a.data.reset_position_ids, "Restart positions after EOD");
  sub.add_flag("--reset-attention-mask", a.data.reset_attention_mask, "No attention across EOD");
  sub.add_flag("--eod-mask-loss", a.data.eod_mask_loss, "No loss on EOD tokens");
  // logging / eval / exit
  sub.add_option("--log-interval", a.log_interval, "Iterations per log line")->capture_default_str();
  sub.add_flag("--log-throughput", a.log_throughput, "Print TFLOP/s");
  sub.add_option("--log-metrics-jsonl", a.metrics_jsonl, "Append one JSON line per logged interval");
  auto& tb = a.tensorboard;
  sub.add_option("--tensorboard-dir", tb.dir, "Write TensorBoard scalars (event files) here");
  sub.add_option("--tensorboard-log-interval", tb.log_interval, "Iterations between TensorBoard scalars")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  sub.add_option("--tensorboard-queue-size", tb.queue_size, "TensorBoard events buffered before a flush")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  sub.add_flag("--log-timers-to-tensorboard", tb.log_timers, "Write iteration-time (s) to TensorBoard");
  sub.add_flag("!--no-log-learnig-rate-to-tensorboard,!--no-log-learning-rate-to-tensorboard",
               tb.log_learning_rate, "No learning-rate in TensorBoard (Megatron spells it 'learnig')");
  sub.add_flag("!--no-log-loss-scale-to-tensorboard", tb.log_loss_scale, "No loss-scale in TensorBoard");
  sub.add_flag("--log-batch-size-to-tensorboard", tb.log_batch_size, "Write batch-size to TensorBoard");
  sub.add_flag("--log-world-size-to-tensorboard", tb.log_world_size, "Write world-size to TensorBoard");
  sub.add_flag("--log-validation-ppl-to-tensorboard", tb.log_validation_ppl,
               "Write validation perplexity to TensorBoard");
  sub.add_option("--eval-interval", a.eval_interval, "Iterations between evaluations")->capture_default_str();
  sub.add_option("--eval-iters", a.eval_iters, "Evaluation iterations")->capture_default_str();
  sub.add_option("--exit-interval", a.exit_interval, "Stop after a multiple of this many iterations");
  sub.add_option("--exit-duration-in-mins", a.exit_duration_in_mins, "Stop after this many minutes");
  sub.add_flag("--exit-signal-handler", a.exit_signal_handler,
               "SIGTERM/SIGINT finish the iteration, save (with --save) and exit 0");
  sub.add_option("--save", a.save, "Checkpoint folder to write");
  sub.add_option("--save-interval", a.save_interval, "Iterations between checkpoints");
  sub.add_flag("--no-save-optim", a.no_save_optim, "Do not save the optimizer state");
  sub.add_flag("--no-save-rng", a.no_save_rng, "Do not save the RNG state");
  sub.add_option("--load", a.load, "Checkpoint folder to resume from (a missing folder or tracker "
                 "starts from scratch)");
  sub.add_option("--ckpt-step", a.ckpt_step, "Load this iteration instead of the tracker's");
  sub.add_option("--ckpt-format", a.ckpt_format,
                 "torch_dist (Megatron-Core's torch_dist folder, each rank writing its items) | torch "
                 "(Megatron-LM's iter_N/mp_rank_XX[_YYY]/model_optim_rng.pt files); left out: this "
                 "build's resharding format, safetensors per rank")
      ->check(CLI::IsMember({"torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"}));
  sub.add_flag("--finetune", a.finetune, "Load the weights only; iteration, samples, optimizer, "
               "LR schedule and RNG start from zero");
  sub.add_flag("--no-load-optim", a.no_load_optim, "Do not load optimizer, loss scaler and LR schedule");
  sub.add_flag("--no-load-rng", a.no_load_rng, "Do not load the RNG state (dropout from --seed)");
  sub.add_flag("--override-opt_param-scheduler,--override-opt-param-scheduler",
               a.override_opt_param_scheduler, "LR schedule values from the command line, not the checkpoint");
  sub.add_flag("--override-checkpoint-model-args", a.override_checkpoint_model_args,
               "Resume with this run's model settings (activation, norm epsilon, ...) where they "
               "differ from the checkpoint's (a warning each; shapes must still match)");
  sub.add_flag("--use-checkpoint-opt_param-scheduler,--use-checkpoint-opt-param-scheduler",
               a.use_checkpoint_opt_param_scheduler, "LR schedule values from the checkpoint");
  sub.add_flag("--exit-on-missing-checkpoint", a.exit_on_missing_checkpoint,
               "Fail when --load has no checkpoint instead of starting from scratch");
  add_megatron_flags(sub, f->megatron, sub.get_name(), CommandKind::Training);
}

namespace {

CommandRegistrar reg("pretrain-gpt", "Pretrain a GPT model (Megatron-LM's pretrain_gpt.py flags)", 20,
                     [](CLI::App& sub) {
  auto f = std::make_shared<PretrainFlags>();
  f->a.tokenizer.type = "GPT2BPETokenizer";  // pretrain_gpt.py's default
  add_pretrain_flags(sub, f.get());
  sub.callback([f] { run(*f); });
});

CommandRegistrar reg_bert("pretrain-bert",
                          "Pretrain a BERT model (Megatron-LM's pretrain_bert.py flags)", 21,
                          [](CLI::App& sub) {
  auto f = std::make_shared<PretrainFlags>();
  f->bert = true;
  f->a.tokenizer.type = "BertWordPieceLowerCase";  // pretrain_bert.py's args_defaults
  add_pretrain_flags(sub, f.get());
  add_bert_data_flags(sub, f->bert_data);
  sub.callback([f] { run(*f); });
});

CommandRegistrar reg_t5("pretrain-t5", "Pretrain a T5 model (Megatron-LM's pretrain_t5.py flags)",
                        22, [](CLI::App& sub) {
  auto f = std::make_shared<PretrainFlags>();
  f->t5 = true;
  f->a.tokenizer.type = "BertWordPieceLowerCase";  // pretrain_t5.py's args_defaults
  add_pretrain_flags(sub, f.get());
  add_t5_flags(sub, f->t5_flags);
  sub.callback([f] { run(*f); });
});

}  // namespace
}  // namespace megatron::cli
