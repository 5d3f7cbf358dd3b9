// The table of Megatron-LM's shared arguments (megatron_arguments.h), in the order of
// megatron/training/arguments.py's argument groups.
#include "training/megatron_arguments.h"

#include <algorithm>
#include <map>

namespace megatron::training {

namespace {

constexpr ArgEffect R = ArgEffect::Runtime, T = ArgEffect::Training, M = ArgEffect::Model;

constexpr MegatronArgument S(const char* f, ArgEffect e, const char* dest = "",
                             const char* neutral = nullptr) {
  return {f, ArgValues::None, e, dest, neutral};
}
constexpr MegatronArgument V(const char* f, ArgEffect e, const char* neutral = nullptr,
                             const char* dest = "") {
  return {f, ArgValues::One, e, dest, neutral};
}
constexpr MegatronArgument L(const char* f, ArgEffect e, const char* neutral = nullptr) {
  return {f, ArgValues::Many, e, "", neutral};
}
constexpr MegatronArgument B(const char* f, ArgEffect e) { return {f, ArgValues::Toggle, e, ""}; }

const MegatronArgument kArguments[] = {
    // network size (and the TransformerConfig fields newer versions generate flags from)
    V("--num-layers", M), V("--encoder-num-layers", M), V("--decoder-num-layers", M),
    V("--hidden-size", M), V("--ffn-hidden-size", M), V("--num-attention-heads", M),
    V("--attention-backend", R), V("--kv-channels", M), S("--group-query-attention", M),
    V("--num-query-groups", M), V("--softmax-type", M, "'vanilla'"), L("--window-size", M),
    V("--window-attn-skip-freq", M, "None"), V("--max-position-embeddings", M),
    V("--position-embedding-type", M), V("--relative-attention-num-buckets", M),
    V("--relative-attention-max-distance", M), S("--use-rotary-position-embeddings", M),
    V("--rotary-base", M), V("--rotary-percent", M), S("--rotary-interleaved", M),
    V("--rotary-seq-len-interpolation-factor", M, "None"), S("--use-rope-scaling", M, "", "False"),
    V("--rope-scaling-factor", R), V("--no-rope-freq", M, "None"),
    S("--no-position-embedding", M, "add_position_embedding"), L("--mrope-section", M, "None"),
    V("--make-vocab-size-divisible-by", M), V("--normalization", M), V("--norm-epsilon", M),
    S("--apply-layernorm-1p", M), S("--apply-residual-connection-post-layernorm", M, "", "False"),
    S("--openai-gelu", M), S("--squared-relu", M), S("--swiglu", M),
    S("--quick-geglu", M, "", "False"), V("--activation-func-clamp-value", M, "None"),
    V("--glu-linear-offset", M, "0.0"), V("--onnx-safe", R), S("--bert-no-binary-head", R),
    S("--untie-embeddings-and-output-weights", M), S("--multi-latent-attention", M, "", "False"),
    V("--mtp-num-layers", M, "None"), V("--mtp-loss-scaling-factor", R), S("--qk-layernorm", M),
    S("--qk-l2-norm", M, "", "False"), V("--linear-attention-freq", M, "None"),
    // straggler detector, workload inspector, in-process restart, one logger, fault tolerance
    S("--log-straggler", R), S("--disable-straggler-on-startup", R), V("--straggler-ctrlr-port", R),
    V("--straggler-minmax-count", R), S("--run-workload-inspector-server", R),
    S("--inprocess-restart", R), V("--inprocess-max-iterations", R),
    V("--inprocess-monitor-thread-interval", R), V("--inprocess-monitor-process-interval", R),
    V("--inprocess-progress-watchdog-interval", R), V("--inprocess-heartbeat-interval", R),
    V("--inprocess-soft-timeout", R), V("--inprocess-hard-timeout", R),
    V("--inprocess-heartbeat-timeout", R), V("--inprocess-barrier-timeout", R),
    V("--inprocess-completion-timeout", R), V("--inprocess-last-call-wait", R),
    V("--inprocess-termination-grace-time", R), V("--inprocess-granularity", R),
    V("--inprocess-active-world-size", R), S("--inprocess-empty-cuda-cache", R),
    S("--no-one-logger", R, "enable_one_logger"), S("--enable-one-logger", R),
    V("--one-logger-project", R), V("--one-logger-entity", R), V("--one-logger-run-name", R),
    S("--one-logger-async", R), V("--app-tag-run-name", R), V("--app-tag-run-version", R),
    S("--enable-ft-package", R), S("--calc-ft-timeouts", R), V("--ft-num-warmup-iters", R),
    V("--config-logger-dir", R),
    // logging
    S("--log-params-norm", R), S("--log-num-zeros-in-grad", R), S("--log-throughput", R),
    S("--log-progress", R), V("--timing-log-level", R), S("--log-energy", R),
    S("--no-barrier-with-level-1-timing", R, "barrier_with_L1_time"), V("--timing-log-option", R),
    V("--tensorboard-log-interval", R), V("--tensorboard-queue-size", R),
    S("--log-timers-to-tensorboard", R), S("--log-batch-size-to-tensorboard", R),
    S("--no-log-learnig-rate-to-tensorboard", R, "log_learning_rate_to_tensorboard"),
    S("--no-log-loss-scale-to-tensorboard", R, "log_loss_scale_to_tensorboard"),
    S("--log-validation-ppl-to-tensorboard", R), S("--log-memory-to-tensorboard", R),
    S("--log-world-size-to-tensorboard", R), V("--log-memory-interval", R), V("--wandb-project", R),
    V("--wandb-entity", R), V("--wandb-exp-name", R), V("--wandb-save-dir", R),
    V("--logging-level", R), V("--log-interval", R), V("--tensorboard-dir", R),
    S("--log-max-attention-logit", R), S("--log-device-memory-used", R),
    V("--moe-routing-trace-path", R), V("--gpu-sniff-test-interval", R), V("--exit-signal", R),
    S("--exit-signal-handler-for-dataloader", R), S("--exit-signal-handler-for-training", R),
    // regularization
    V("--attention-dropout", T), V("--hidden-dropout", T), V("--weight-decay", T),
    V("--start-weight-decay", T), V("--end-weight-decay", T), V("--weight-decay-incr-style", T),
    V("--clip-grad", T), V("--adam-beta1", T), V("--adam-beta2", T), V("--adam-eps", T),
    V("--sgd-momentum", T), V("--muon-momentum", T), S("--muon-no-split-qkv", T, "muon_split_qkv"),
    S("--muon-use-nesterov", T), V("--muon-scale-mode", T), V("--muon-fp32-matmul-prec", T),
    V("--muon-num-ns-steps", T), V("--muon-tp-mode", T), V("--muon-extra-scale-factor", T),
    S("--apply-wd-to-qk-layernorm", T), V("--no-weight-decay-cond-type", T),
    // reinforcement learning
    S("--perform-rl-step", T), V("--rl-prompts-per-eval", T), V("--grpo-prompts-per-step", T),
    V("--grpo-group-size", T), V("--grpo-iterations", T), V("--grpo-clamp-eps-lower", T),
    V("--grpo-clamp-eps-upper", T), V("--grpo-kl-beta", T), V("--grpo-entropy-term-weight", T),
    S("--grpo-filter-groups-with-same-reward", T), V("--grpo-default-temperature", T),
    V("--grpo-default-top-p", T), V("--langrl-inference-server-type", T),
    V("--langrl-inference-server-conversation-template", T), B("--langrl-external-server", T),
    V("--langrl-env-config", T), S("--rl-offload-optimizer-during-inference", T),
    B("--rl-offload-kv-cache-during-training", T), B("--rl-remove-kv-cache-during-training", T),
    B("--rl-reset-cuda-graphs", T), B("--rl-partial-rollouts", T),
    B("--rl-inference-logprobs-is-correction", T), V("--rl-importance-sampling-truncation-coef", T),
    B("--rl-calculate-intra-group-similarity", T), B("--rl-use-sequence-packing", T),
    V("--rl-sequence-packing-bin-size", T), V("--rl-sequence-packing-algo", T),
    V("--rl-sequence-packing-max-sequences-per-bin", T), V("--rl-default-temperature", T),
    V("--rl-default-top-p", T), V("--rl-default-top-k", T), V("--rl-kv-cache-management-mode", T),
    B("--rl-persist-cuda-graphs", T), B("--rl-training-cuda-graphs", T),
    V("--rl-inference-tensor-model-parallel-size", T),
    V("--rl-inference-pipeline-model-parallel-size", T),
    V("--rl-inference-expert-model-parallel-size", T),
    V("--rl-inference-expert-tensor-model-parallel-size", T),
    V("--rl-inference-model-unified-memory-level", T),
    B("--rl-offload-inference-model-weights-when-idle", T), V("--refit-method", T),
    B("--rl-verify-model-weights-swap", T), V("--rl-parallel-generation-tasks", T),
    B("--rl-skip-bos-token", T), S("--rl-profile", T), V("--rl-profile-dir", T),
    // training
    V("--micro-batch-size", T), V("--batch-size", T), V("--global-batch-size", T),
    L("--rampup-batch-size", T), V("--step-batch-size-schedule", T),
    S("--decrease-batch-size-if-needed", T), S("--recompute-activations", R),
    V("--recompute-granularity", R),
    S("--no-check-for-nan-in-loss-and-grad", R, "check_for_nan_in_loss_and_grad"),
    S("--check-for-spiky-loss", R), S("--check-for-large-grads", R),
    S("--distribute-saved-activations", R), V("--recompute-method", R),
    V("--recompute-num-layers", R), L("--recompute-modules", R),
    V("--cpu-offloading-num-layers", R),
    S("--no-clone-scatter-output-in-embedding", R, "clone_scatter_output_in_embedding"),
    S("--profile", R), V("--profile-step-start", R), V("--profile-step-end", R),
    L("--iterations-to-skip", T), V("--result-rejected-tracker-filename", R),
    S("--disable-gloo-process-groups", R, "enable_gloo_process_groups"),
    S("--use-pytorch-profiler", R), L("--profile-ranks", R), S("--record-memory-history", R),
    V("--memory-snapshot-path", R), S("--tp-comm-overlap", R), V("--tp-comm-overlap-cfg", R),
    S("--disable-tp-comm-overlap-ag", R, "tp_comm_overlap_ag"),
    S("--disable-tp-comm-overlap-rs", R, "tp_comm_overlap_rs"), S("--tp-comm-overlap-rs-dgrad", R),
    S("--disable-tp-comm-bulk-dgrad", R, "tp_comm_bulk_dgrad"),
    S("--disable-tp-comm-bulk-wgrad", R, "tp_comm_bulk_wgrad"), V("--tp-comm-bootstrap-backend", R),
    S("--use-cpu-initialization", R), V("--empty-unused-memory-level", R),
    S("--deterministic-mode", R), V("--check-weight-hash-across-dp-replicas-interval", R),
    S("--calculate-per-token-loss", T), V("--train-sync-interval", R),
    S("--checkpoint-activations", R), V("--train-iters", T), V("--train-samples", T),
    V("--exit-interval", T), V("--exit-duration-in-mins", T), S("--exit-signal-handler", T),
    S("--no-masked-softmax-fusion", R, "masked_softmax_fusion"),
    S("--no-bias-gelu-fusion", M, "bias_gelu_fusion"),
    S("--no-bias-swiglu-fusion", R, "bias_swiglu_fusion"),
    S("--use-fused-weighted-squared-relu", R),
    S("--no-bias-dropout-fusion", R, "bias_dropout_fusion"),
    S("--no-rope-fusion", R, "apply_rope_fusion"), V("--rope-type", M),
    S("--cross-entropy-loss-fusion", R), V("--cross-entropy-fusion-impl", R),
    S("--use-flash-attn", R), S("--disable-bias-linear", M, "add_bias_linear"),
    S("--add-qkv-bias", M), V("--optimizer", T), S("--optimizer-cpu-offload", R),
    V("--optimizer-offload-fraction", R), S("--use-torch-optimizer-for-cpu-offload", R),
    S("--overlap-cpu-optimizer-d2h-h2d", R), V("--dump-param-to-param-group-map", R),
    S("--no-pin-cpu-grads", R, "pin_cpu_grads"), S("--no-pin-cpu-params", R, "pin_cpu_params"),
    V("--dataloader-type", T),
    S("--no-async-tensor-model-parallel-allreduce", R, "async_tensor_model_parallel_allreduce"),
    S("--no-persist-layer-norm", R), S("--sequence-parallel", R),
    S("--no-gradient-accumulation-fusion", R, "gradient_accumulation_fusion"),
    S("--use-mcore-models", R, "deprecated_use_mcore_models"), S("--use-legacy-models", R),
    S("--manual-gc", R), V("--manual-gc-interval", R),
    S("--no-manual-gc-eval", R, "manual_gc_eval"),
    S("--disable-tp-comm-split-ag", R, "tp_comm_split_ag"),
    S("--disable-tp-comm-split-rs", R, "tp_comm_split_rs"),
    V("--pipeline-model-parallel-comm-backend", R), L("--high-priority-stream-groups", R),
    S("--use-te-activation-func", R),
    // rerun state machine, initialization
    V("--error-injection-rate", T), V("--error-injection-type", T), V("--rerun-mode", R),
    V("--seed", T), S("--data-parallel-random-init", T), V("--init-method-std", T),
    V("--embedding-init-method-std", T), S("--init-method-xavier-uniform", T),
    // learning rate
    V("--lr", T), V("--lr-decay-style", T), V("--lr-wsd-decay-style", T), V("--lr-decay-iters", T),
    V("--lr-decay-samples", T), V("--lr-wsd-decay-samples", T), V("--lr-wsd-decay-iters", T),
    V("--lr-warmup-fraction", T), V("--lr-warmup-iters", T), V("--lr-warmup-samples", T),
    V("--lr-warmup-init", T), V("--warmup", T), V("--min-lr", T),
    S("--override-opt_param-scheduler,--override-opt-param-scheduler", T),
    S("--use-checkpoint-opt_param-scheduler,--use-checkpoint-opt-param-scheduler", T),
    V("--decoupled-lr", T), V("--decoupled-min-lr", T),
    // checkpointing
    V("--save", R), V("--save-interval,--persistent-save-interval", R),
    V("--save-retain-interval", R), S("--no-save-optim", R), S("--no-save-rng", R), V("--load", R),
    S("--no-load-optim", R), S("--load-main-params-from-ckpt", T), S("--no-load-rng", R),
    S("--no-strict-fsdp-dtensor-load", R, "strict_fsdp_dtensor_load"),
    V("--non-persistent-save-interval", R), V("--non-persistent-ckpt-type", R),
    V("--non-persistent-global-ckpt-dir", R), V("--non-persistent-local-ckpt-dir", R),
    V("--non-persistent-local-ckpt-algo", R), S("--finetune", T), V("--pretrained-checkpoint", T),
    V("--ckpt-step", R), S("--no-initialization", R, "perform_initialization"),
    S("--use-checkpoint-args", T), S("--use-mp-args-from-checkpoint-args", T),
    S("--no-use-tokenizer-model-from-checkpoint-args", R,
      "use_tokenizer_model_from_checkpoint_args"),
    S("--exit-on-missing-checkpoint", R), S("--use-dist-ckpt", R, "use_dist_ckpt_deprecated"),
    S("--use-persistent-ckpt-worker", R), S("--auto-detect-ckpt-format", R),
    V("--dist-ckpt-format", R, nullptr, "dist_ckpt_format_deprecated"), V("--ckpt-format", R),
    V("--ckpt-convert-format", R), V("--ckpt-convert-save", R),
    S("--ckpt-convert-update-legacy-dist-opt-format", R),
    S("--ckpt-fully-parallel-save", R, "ckpt_fully_parallel_save_deprecated"),
    S("--no-ckpt-fully-parallel-save", R, "ckpt_fully_parallel_save"), S("--async-save", R),
    S("--ckpt-fully-parallel-load", R), V("--ckpt-fully-parallel-load-exchange-algo", R),
    S("--ckpt-assume-constant-structure", R), V("--dist-ckpt-strictness", R),
    S("--dist-ckpt-save-pre-mcore-014", R), S("--dist-ckpt-optim-fully-reshardable", R),
    S("--distrib-optim-fully-reshardable-mem-efficient", R), V("--dist-ckpt-workers", R),
    // mixed precision
    S("--fp16", M), S("--bf16", M), S("--grad-reduce-in-bf16", T), V("--loss-scale", T),
    V("--initial-loss-scale", T), V("--min-loss-scale", T), V("--loss-scale-window", T),
    V("--hysteresis", T), S("--fp32-residual-connection", M, "", "False"),
    S("--apply-query-key-layer-scaling", R), S("--attention-softmax-in-fp32", R),
    S("--accumulate-allreduce-grads-in-fp32", R), S("--fp16-lm-cross-entropy", T),
    S("--disable-bf16-reduced-precision-matmul", R), S("--reuse-grad-buf-for-mxfp8-param-ag", R),
    // distributed
    V("--tensor-model-parallel-size", R), V("--pipeline-model-parallel-size", R),
    V("--decoder-first-pipeline-num-layers", T), V("--decoder-last-pipeline-num-layers", T),
    V("--pipeline-model-parallel-layout", T), V("--model-parallel-size", T),
    V("--num-layers-per-virtual-pipeline-stage", T), V("--num-virtual-stages-per-pipeline-rank", T),
    V("--microbatch-group-size-per-virtual-pipeline-stage", R, nullptr,
      "microbatch_group_size_per_vp_stage"),
    S("--no-overlap-p2p-communication", R, "overlap_p2p_comm"),
    S("--overlap-p2p-communication-warmup-flush", R, "overlap_p2p_comm_warmup_flush"),
    V("--distributed-backend", R), V("--distributed-timeout-minutes", R),
    V("--distributed-timeout-seconds-after-init", R), S("--overlap-grad-reduce", R),
    S("--defer-embedding-wgrad-compute", R), V("--wgrad-deferral-limit", R),
    S("--no-align-grad-reduce", R, "align_grad_reduce"), V("--ddp-num-buckets", R),
    V("--ddp-bucket-size", R), S("--ddp-pad-buckets-for-high-nccl-busbw", R),
    S("--ddp-reduce-scatter-with-fp32-accumulation", R), S("--ddp-average-in-collective", R),
    S("--overlap-param-gather", R), S("--overlap-param-gather-with-optimizer-step", R),
    S("--no-align-param-gather", R, "align_param_gather"),
    S("--no-scatter-gather-tensors-in-pipeline", R, "scatter_gather_tensors_in_pipeline"),
    S("--use-ring-exchange-p2p", R), V("--local-rank", R), V("--lazy-mpu-init", R),
    S("--account-for-embedding-in-pipeline-split", T), S("--account-for-loss-in-pipeline-split", T),
    S("--use-distributed-optimizer", R), S("--use-nccl-ub", R, "nccl_ub"),
    S("--disable-symmetric-registration", R), S("--fsdp-manual-registration", R),
    S("--create-all-gather-group", R), S("--use-sharp", R), V("--sharp-enabled-group", R),
    S("--use-megatron-fsdp", R), S("--init-model-with-meta-device", R),
    V("--data-parallel-sharding-strategy", R), V("--outer-dp-sharding-strategy", R),
    S("--no-gradient-reduce-div-fusion", R, "gradient_reduce_div_fusion"),
    S("--fsdp-double-buffer", R), V("--suggested-communication-unit-size", R),
    S("--keep-fp8-transpose-cache", R), S("--enable-full-sharding-in-hsdp", R),
    V("--num-distributed-optimizer-instances", R), S("--use-torch-fsdp2", R),
    S("--torch-fsdp2-no-reshard-after-forward", R, "torch_fsdp2_reshard_after_forward"),
    V("--context-parallel-size", R), L("--cp-comm-type", R),
    L("--hierarchical-context-parallel-sizes", R), V("--nccl-communicator-config-path", R),
    S("--use-tp-pp-dp-mapping", R), S("--replication", R), V("--replication-jump", R),
    V("--replication-factor", R), S("--fake-process-group", R),
    // validation
    S("--full-validation", T), S("--multiple-validation-sets", T), V("--eval-iters", T),
    V("--eval-interval", T), S("--test-mode", R), S("--skip-train", T),
    V("--start-eval-at-iter", T), V("--eval-global-batch-size", T), V("--eval-micro-batch-size", T),
    L("--validation-set-names", T),
    // tokenizer
    V("--vocab-size", M), V("--padded-vocab-size", M, "None"), V("--vocab-file", M),
    V("--merge-file", M), V("--vocab-extra-ids", M), V("--tokenizer-type", M),
    V("--tokenizer-model", M), V("--tokenizer-metadata", M, "None"), V("--tiktoken-pattern", M),
    V("--tiktoken-num-special-tokens", M), L("--tiktoken-special-tokens", M),
    L("--tokenizer-special-tokens", M), S("--tokenizer-sentencepiece-legacy", M, "", "False"),
    S("--legacy-tokenizer", R), S("--trust-remote-code", R), S("--tokenizer-hf-use-fast", R),
    S("--tokenizer-hf-include-special-tokens", R), S("--tokenizer-hf-no-use-fast", R),
    S("--tokenizer-hf-no-include-special-tokens", R),
    // data and dataloader
    L("--data-path", T), L("--train-data-path", T), L("--valid-data-path", T),
    L("--test-data-path", T), V("--split", T), V("--data-args-path", T),
    V("--per-split-data-args-path", T), V("--per-dataset-sequences-path", T),
    V("--phase-transition-iterations", T), S("--dataloader-fast-cache-load", R),
    S("--dataloader-defer-npy-index-mmap", R), V("--data-cache-path", R),
    S("--no-mmap-bin-files", R, "mmap_bin_files"), S("--mock-data", T), V("--seq-length", M),
    V("--encoder-seq-length", M), V("--decoder-seq-length", M),
    V("--retriever-seq-length", R), V("--sample-rate", T), V("--mask-prob", R),
    V("--short-seq-prob", R), V("--num-workers", R), S("--reset-position-ids", T),
    S("--reset-attention-mask", T), S("--eod-mask-loss", T),
    S("--no-create-attention-mask-in-dataloader", R, "create_attention_mask_in_dataloader"),
    V("--num-dataset-builder-threads", R), V("--object-storage-cache-path", R),
    V("--mid-level-dataset-surplus", T), S("--allow-ambiguous-pad-tokens", T), S("--fim-data", T),
    V("--fim-rate", T), V("--fim-spm-rate", T), V("--fim-split-sample", T),
    V("--fim-fragment-rate", T), V("--fim-no-prefix", T), V("--fim-prefix-token", T),
    V("--fim-middle-token", T), V("--fim-suffix-token", T), V("--fim-pad-token", T),
    V("--fim-eod-token", T),
    // autoresume, biencoder and vision (other model families: no effect on a GPT)
    S("--adlr-autoresume", R), V("--adlr-autoresume-interval", R), V("--ict-head-size", R),
    V("--biencoder-projection-dim", R), S("--biencoder-shared-query-context-model", R),
    V("--ict-load", R), V("--bert-load", R), V("--titles-data-path", R),
    V("--query-in-block-prob", R), S("--use-one-sent-docs", R), V("--evidence-data-path", R),
    L("--retriever-report-topk-accuracies", R), S("--retriever-score-scaling", R),
    V("--block-data-path", R), V("--embedding-path", R), V("--indexer-batch-size", R),
    V("--indexer-log-interval", R), V("--num-classes", R), V("--img-h", R), V("--img-w", R),
    V("--num-channels", R), V("--patch-dim", R), V("--classes-fraction", R),
    V("--data-per-class-fraction", R), S("--no-data-sharding", R, "data_sharding"),
    V("--head-lr-mult", R), S("--vision-pretraining", R), V("--vision-pretraining-type", R),
    V("--vision-backbone-type", R), V("--swin-backbone-type", R), V("--mask-type", R),
    V("--mask-factor", R), V("--iter-per-epoch", R), V("--dino-local-img-size", R),
    V("--dino-local-crops-number", R), V("--dino-head-hidden-size", R),
    V("--dino-bottleneck-size", R), V("--dino-freeze-last-layer", R),
    S("--dino-norm-last-layer", R), V("--dino-warmup-teacher-temp", R), V("--dino-teacher-temp", R),
    V("--dino-warmup-teacher-temp-epochs", R),
    // mixture of experts: only --num-experts makes one; the rest matters only with it
    V("--num-experts", M), V("--expert-model-parallel-size", R),
    V("--expert-tensor-parallel-size", R), V("--moe-layer-freq", R), V("--moe-ffn-hidden-size", R),
    V("--moe-shared-expert-intermediate-size", R), S("--moe-shared-expert-overlap", R),
    S("--moe-shared-expert-gate", R),
    S("--moe-grouped-gemm", R), S("--moe-use-legacy-grouped-gemm", R),
    S("--moe-layer-recompute", R), S("--moe-extended-tp", R), S("--moe-use-upcycling", R),
    L("--moe-router-load-balancing-type", R), V("--moe-router-dtype", R),
    S("--moe-router-fusion", R), V("--moe-router-score-function", R), V("--moe-router-topk", R),
    S("--moe-router-pre-softmax", R), V("--moe-router-num-groups", R),
    V("--moe-router-group-topk", R), V("--moe-router-topk-scaling-factor", R),
    S("--moe-router-enable-expert-bias", R), V("--moe-router-bias-update-rate", R),
    S("--moe-router-force-load-balancing", R), S("--moe-router-padding-for-fp8", R),
    L("--moe-aux-loss-coeff", R), V("--moe-z-loss-coeff", R), V("--moe-input-jitter-eps", R),
    S("--moe-per-layer-logging", R), V("--moe-token-dispatcher-type", R),
    S("--moe-enable-deepep", R), V("--moe-deepep-num-sms", R), S("--moe-permute-fusion", R),
    V("--moe-expert-capacity-factor", R), S("--moe-pad-expert-input-to-capacity", R),
    V("--moe-token-drop-policy", R), S("--moe-apply-probs-on-input", R),
    S("--overlap-moe-expert-parallel-comm", R), S("--delay-wgrad-compute", R),
    V("--moe-upcycling-granularity", R), S("--moe-pad-experts-for-cuda-graph-inference", R),
    // multi-latent attention (with --multi-latent-attention), heterogeneous layers, experimental
    V("--q-lora-rank", R), V("--kv-lora-rank", R), V("--qk-head-dim", R),
    V("--qk-pos-emb-head-dim", R), V("--v-head-dim", R), V("--rotary-scaling-factor", R),
    V("--mscale", R), V("--mscale-all-dim", R), S("--cache-mla-latents", R),
    V("--heterogeneous-layers-config-path", M, "None"),
    V("--heterogeneous-layers-config-encoded-json", M, "None"), S("--enable-experimental", R),
    L("--spec", M), V("--hybrid-attention-ratio", M, "0.0"),
    V("--hybrid-mlp-ratio", M, "0.0"), V("--hybrid-override-pattern", M, "None"),
    V("--hybrid-layer-pattern", M, "None"), V("--mtp-hybrid-override-pattern", R),
    V("--mamba-state-dim", R), V("--mamba-head-dim", R), V("--mamba-num-groups", R),
    V("--mamba-num-heads", R), S("--is-hybrid-model", M, "", "False"),
    S("--disable-mamba-mem-eff-path", R), V("--yaml-cfg", T),
    S("--use-precision-aware-optimizer", T), V("--main-grads-dtype", T),
    V("--main-params-dtype", T), V("--exp-avg-dtype", T), V("--exp-avg-sq-dtype", T),
    V("--megatron-fsdp-main-params-dtype", R), V("--megatron-fsdp-main-grads-dtype", R),
    V("--megatron-fsdp-grad-comm-dtype", R), S("--disable-msc", R, "enable_msc"),
    V("--kitchen-config-file", M, "None"), V("--kitchen-recipe-number", M, "None"), S("--sft", T),
    V("--sft-tokenizer-prompt-format", T),
    // Transformer Engine: FP8 / FP4 change the arithmetic; the rest only with them
    V("--fp8-format", M, nullptr, "fp8"), V("--fp8-recipe", R), V("--fp8-quantizer-factory", R),
    V("--fp8-margin", R), V("--fp8-interval", R), V("--fp8-amax-history-len", R),
    V("--fp8-amax-compute-algo", R), S("--no-fp8-wgrad", R, "fp8_wgrad"),
    V("--transformer-impl", R), S("--fp8-param-gather", R), S("--first-last-layers-bf16", R),
    V("--num-layers-at-start-in-bf16", R), V("--num-layers-at-end-in-bf16", R),
    V("--fp4-format", M, nullptr, "fp4"), V("--fp4-recipe", R), V("--fp4-quantizer-factory", R),
    S("--fp4-param-gather", R, "fp4_param"), S("--te-rng-tracker", R),
    S("--inference-rng-tracker", R), V("--te-precision-config-file", M),
    // inference (Megatron's engines; generate and serve have their own knobs)
    V("--inference-batch-times-seqlen-threshold", R), V("--max-tokens-to-oom", R),
    S("--output-bert-embeddings", R), V("--bert-embedder-type", R), S("--flash-decode", R),
    S("--enable-cuda-graph", R), V("--cuda-graph-warmup-steps", R), S("--external-cuda-graph", R),
    V("--cuda-graph-impl", R), L("--cuda-graph-scope", R), S("--use-legacy-static-engine", R),
    V("--inference-max-requests", R), V("--inference-max-seq-length", R),
    V("--inference-max-batch-size", R), S("--inference-dynamic-batching", R),
    V("--inference-dynamic-batching-buffer-size-gb", R),
    V("--inference-dynamic-batching-paused-buffer-size-gb", R),
    V("--inference-dynamic-batching-mamba-memory-ratio", R),
    V("--inference-dynamic-batching-block-size", R),
    V("--inference-dynamic-batching-buffer-guaranteed-fraction", R),
    V("--inference-dynamic-batching-buffer-overflow-factor", R),
    V("--inference-dynamic-batching-max-requests-override", R),
    V("--inference-dynamic-batching-max-tokens-override", R),
    V("--inference-dynamic-batching-max-requests", R),
    V("--inference-dynamic-batching-max-tokens", R),
    V("--inference-dynamic-batching-num-cuda-graphs", R),
    S("--inference-dynamic-batching-track-paused-request-events", R),
    S("--inference-dynamic-batching-track-generated-token-events", R),
    S("--decode-only-cuda-graphs", R), V("--inference-dynamic-batching-unified-memory-level", R),
    S("--enable-chunked-prefill", R), B("--inference-dynamic-batching-prefix-caching", R),
    V("--inference-dynamic-batching-prefix-caching-eviction-policy", R),
    V("--inference-dynamic-batching-prefix-caching-coordinator-policy", R),
    V("--inference-dynamic-batching-cuda-graph-max-tokens", R),
    V("--inference-dynamic-batching-cuda-graph-mixed-prefill-count", R),
    V("--symmetric-ar-type", R), S("--nccl-all-reduce-for-prefill", R),
    V("--mlp-chunks-for-prefill", R), S("--disable-chunked-prefill", R),
    V("--inference-wandb-logging-step-interval", R), V("--inference-logging-step-interval", R),
    B("--inference-flask-server-logging", R), B("--inference-wandb-logging", R),
    V("--inference-coordinator-port", R), V("--mamba-inference-conv-states-dtype", R),
    V("--mamba-inference-ssm-states-dtype", R),
    // retro (a GPT with a retriever only with --retro-add-retriever)
    V("--retro-project-dir", R), S("--retro-add-retriever", M, "", "False"),
    V("--retro-cyclic-train-iters", R), V("--retro-encoder-layers", R),
    V("--retro-encoder-hidden-dropout", R), V("--retro-encoder-attention-dropout", R),
    V("--retro-num-neighbors", R), V("--retro-num-retrieved-chunks", R),
    V("--retro-attention-gate", R),
    S("--retro-no-verify-neighbor-count", R, "retro_verify_neighbor_count"),
};

// What validate_args, the data and the training loop add to the Namespace.
constexpr const char* kDerived[] = {
    "rank", "world_size", "data_parallel_size", "transformer_pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "params_dtype", "padded_vocab_size",
    "consumed_train_samples", "skipped_train_samples", "consumed_valid_samples",
    "consumed_train_bins", "variable_seq_lengths", "use_dist_ckpt", "iteration",
    "num_floating_point_operations_so_far", "num_floating_point_operations_since_last_log_event",
    "do_train", "do_valid", "do_test", "curr_iteration", "grpo_samples_per_iteration",
    "use_custom_fsdp", "cpu_offloading", "inference_cuda_graph_scope", "model_parallel_size",
    "batch_size", "warmup", "checkpoint_activations", "recompute_activations",
    "use_mcore_models", "train_iters_from_samples", "valid_iters", "test_iters",
    "use_rotary_position_embeddings", "add_bias_linear", "encoder_num_layers",
    "encoder_seq_length", "layernorm_epsilon", "moe_router_topk_limited_devices",
};

std::string default_dest(const char* flag) {
  std::string d(flag);
  if (const size_t comma = d.find(','); comma != std::string::npos) d.resize(comma);
  d.erase(0, 2);
  std::replace(d.begin(), d.end(), '-', '_');
  return d;
}

}  // namespace

const std::vector<MegatronArgument>& megatron_arguments() {
  static const std::vector<MegatronArgument> table(std::begin(kArguments), std::end(kArguments));
  return table;
}

std::string argument_dest(const MegatronArgument& a) {
  return *a.dest != '\0' ? std::string(a.dest) : default_dest(a.flag);
}

const MegatronArgument* find_argument_by_dest(std::string_view dest) {
  static const std::map<std::string, const MegatronArgument*, std::less<>> by_dest = [] {
    std::map<std::string, const MegatronArgument*, std::less<>> m;
    for (const MegatronArgument& a : megatron_arguments()) m.emplace(argument_dest(a), &a);
    return m;
  }();
  const auto it = by_dest.find(dest);
  return it == by_dest.end() ? nullptr : it->second;
}

bool is_derived_argument(std::string_view dest) {
  return std::any_of(std::begin(kDerived), std::end(kDerived),
                     [&](const char* d) { return dest == d; });
}

}  // namespace megatron::training
