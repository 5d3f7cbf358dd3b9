// `megatron pretrain-gpt`: Megatron-LM's pretrain_gpt.py flags (names and defaults) mapped onto
// training::TrainingArgs; the loop itself is training::pretrain_gpt. Under mpirun every rank runs
// this command with the same flags (data, tensor, sequence, pipeline — optionally interleaved —
// and context parallelism).
#include "cli/command.h"
#include "cli/tokenizer_options.h"
#include "core/error.h"
#include "core/log.h"
#include "comm/communicator.h"
#include "training/trainer.h"

namespace megatron::cli {
namespace {

struct PretrainFlags {
  training::TrainingArgs a;
  double hidden_dropout = 0.1, attention_dropout = 0.1;
  bool openai_gelu = false;
};

void run(PretrainFlags f) {
  if (f.a.model.max_position_embeddings == 0) f.a.model.max_position_embeddings = f.a.model.seq_length;
  f.a.model.hidden_dropout = float(f.hidden_dropout);
  f.a.model.attention_dropout = float(f.attention_dropout);
  f.a.model.gelu_tanh = f.openai_gelu;  // Megatron's default GeLU is the exact (erf) one
  training::TrainingSummary s = training::pretrain_gpt(f.a);
  if (world_communicator()->rank() == s.world_size - 1)  // the rank that printed the log lines
    log_print(str("training finished: ", s.iterations, " iterations, ", s.consumed_samples,
                " samples, last lm loss ", s.last_loss, ", ", s.tokens_per_second, " tokens/s"));
}

CommandRegistrar reg("pretrain-gpt", "Pretrain a GPT model (Megatron-LM's pretrain_gpt.py flags)", 20,
                     [](CLI::App& sub) {
  auto f = std::make_shared<PretrainFlags>();
  auto& a = f->a;
  auto& m = a.model;
  // model
  sub.add_option("--num-layers", m.num_layers, "Transformer layers");
  sub.add_option("--hidden-size", m.hidden_size, "Hidden size");
  sub.add_option("--num-attention-heads", m.num_attention_heads, "Attention heads");
  sub.add_option("--ffn-hidden-size", m.ffn_hidden_size, "MLP width (default 4 x hidden)");
  sub.add_option("--kv-channels", m.kv_channels, "Per-head width (default hidden / heads)");
  sub.add_option("--num-query-groups", m.num_query_groups, "Query groups (GQA)");
  sub.add_option("--seq-length", m.seq_length, "Sequence length");
  sub.add_option("--max-position-embeddings", m.max_position_embeddings,
                 "Position embeddings (default --seq-length)");
  sub.add_option("--make-vocab-size-divisible-by", a.make_vocab_size_divisible_by,
                 "Vocab padding multiple")->capture_default_str();
  sub.add_option("--init-method-std", m.init_method_std, "Init std")->capture_default_str();
  sub.add_option("--layernorm-epsilon", m.layernorm_epsilon, "LayerNorm epsilon")->capture_default_str();
  sub.add_flag("--openai-gelu", f->openai_gelu, "GeLU in its tanh approximation");
  sub.add_option("--hidden-dropout", f->hidden_dropout, "Hidden dropout")->capture_default_str();
  sub.add_option("--attention-dropout", f->attention_dropout, "Attention dropout")->capture_default_str();
  sub.add_option("--recompute-granularity", m.recompute_granularity, "full | selective")
      ->check(CLI::IsMember({"full", "selective"}));
  sub.add_option("--recompute-method", m.recompute_method, "uniform | block")
      ->check(CLI::IsMember({"uniform", "block"}));
  sub.add_option("--recompute-num-layers", m.recompute_num_layers, "Layers per recompute chunk");
  // batch / schedule / optimizer
  sub.add_option("--micro-batch-size", a.micro_batch_size, "Micro-batch size");
  sub.add_option("--global-batch-size", a.global_batch_size, "Global batch size (default micro)");
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
  // precision
  sub.add_flag("--fp16", a.fp16, "fp16 parameters with loss scaling");
  sub.add_flag("--bf16", a.bf16, "bf16 parameters");
  sub.add_option("--loss-scale", a.loss_scale, "Static loss scale (default: dynamic for fp16)");
  sub.add_option("--initial-loss-scale", a.initial_loss_scale, "Dynamic scale start")->capture_default_str();
  sub.add_option("--min-loss-scale", a.min_loss_scale, "Dynamic scale floor")->capture_default_str();
  sub.add_option("--loss-scale-window", a.loss_scale_window, "Clean steps before growth")->capture_default_str();
  sub.add_option("--hysteresis", a.hysteresis, "Overflows tolerated before backoff")->capture_default_str();
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
      ->check(CLI::IsMember({"p2p", "a2a", "allgather", "a2a+p2p"}))
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
  // data and tokenizer
  add_tokenizer_options(sub, a.tokenizer);
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
  sub.callback([f] { run(*f); });
});

}  // namespace
}  // namespace megatron::cli
