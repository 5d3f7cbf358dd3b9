// pretrain_gpt's setup (training_run.h): what Megatron's initialize_megatron,
// setup_model_and_optimizer and build_train_valid_test_data_iterators do, in the order that makes
// flag and checkpoint mismatches fail before any work.
#include <filesystem>

#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/device_select.h"
#include "kernels/ops.h"
#include "model/layer_spec.h"
#include "model/tensor_parallel.h"
#include "optim/distributed_optimizer.h"
#include "optim/optimizer.h"
#include "training/run_log_lines.h"
#include "training/training_run.h"

namespace megatron::training {

void TrainingRun::say(const std::string& line) const {
  if (log_rank) log_print(line);
}

model::Batch TrainingRun::micro_batch(DataSplit split, int64_t first) const {
  model::Batch out = model::slice_for_context_parallel(
      data->micro_batch(split, first, mbs, ps.dp_rank(), dp()), ps.cp_rank(), ps.cp_size());
  if (!device.is_cpu())  // the batch is made on the host: one copy of each tensor to the model
    for (Tensor* t : {&out.tokens, &out.position_ids, &out.attention_start, &out.labels,
                      &out.loss_mask, &out.padding_mask, &out.token_types, &out.sequence_labels,
                      &out.encoder_tokens, &out.encoder_padding_mask})
      if (t->defined()) *t = t->contiguous().to(device);
  return out;
}

std::vector<double> TrainingRun::dp_cp_sum(std::vector<double> v) const {
  if (dp_cp > 1) {
    Tensor t = Tensor::from_vector(v, {int64_t(v.size())});
    ps.dp_cp().all_reduce(t, ReduceOp::Sum);
    for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<double>()[i];
  }
  return v;
}

namespace {

// The parallel layout line at start-up (a distributed run only).
std::string layout_line(const TrainingRun& r) {
  const ParallelState& ps = r.ps;
  const ParallelArgs& p = r.a.parallel;
  const int tp = ps.tp_size(), pp = ps.pp_size();
  return str("parallel layout: world ", ps.world_size(), " = TP ", tp, " x PP ", pp, " x CP ",
             ps.cp_size(), " x DP ", ps.dp_size(),
             r.pipeline_layout.num_chunks > 1
                 ? str(", ", r.pipeline_layout.num_chunks, " virtual stages per pipeline rank (interleaved 1F1B)")
                 : std::string(pp > 1 ? ", 1F1B pipeline schedule" : ""),
             r.a.model.sequence_parallel && tp > 1 ? ", sequence parallel" : "",
             ps.ep_size() > 1 || ps.layout().config.expert_tensor_parallel_size != tp
                 ? str("; experts: ETP ", ps.layout().config.expert_tensor_parallel_size, " x EP ",
                       ps.ep_size(), " x EDP ", ps.layout().expert_data_parallel_size, " (",
                       r.a.model.moe_token_dispatcher_type, " dispatcher)")
                 : std::string(),
             p.use_distributed_optimizer ? ", distributed optimizer" : "",
             p.overlap_grad_reduce
                 ? (pp > 1 ? ", gradient reduction overlapped with each model chunk's last "
                             "micro-batch backward (tied embedding after the pipeline flush)"
                           : ", gradient reduction overlapped with backward")
                 : "",
             p.overlap_param_gather ? ", parameter all-gather overlapped with forward" : "",
             "; ", r.num_micro, " micro-batches of ", r.mbs, " per rank and iteration");
}

// --load: the checkpoint and what it restores, checked against the flags before any work.
void find_load_checkpoint(TrainingRun& r) {
  const TrainingArgs& a = r.a;
  if (!a.load.empty()) {
    r.ckpt = find_checkpoint(a.load, a.ckpt_step >= 0 ? std::optional<int64_t>(a.ckpt_step) : std::nullopt);
    if (!r.ckpt) {
      const std::string why = std::filesystem::exists(a.load)
                                  ? " has no latest_checkpointed_iteration.txt"
                                  : " does not exist";
      MG_REQUIRE(!a.exit_on_missing_checkpoint, "--load ", a.load, why,
                 " and --exit-on-missing-checkpoint is set");
      r.say(str("WARNING: --load ", a.load, why,
                "; no checkpoint is loaded and training starts from random initialization"));
    }
  }
  // A resume continues iteration, samples, optimizer, scheduler and RNG; --finetune (and a
  // "release" checkpoint) loads the weights only.
  r.resume = r.ckpt && !r.ckpt->release && !a.finetune;
  r.load_optim = r.resume && !a.no_load_optim;
  r.load_rng = r.resume && !a.no_load_rng;
  if (r.ckpt) {
    r.say(str("loading checkpoint from ", a.load, " at iteration ", r.ckpt->state.iteration));
    check_checkpoint_layout(*r.ckpt, r.crank);
    check_checkpoint_args(*r.ckpt, a, !r.resume);
    MG_REQUIRE(!r.load_rng || r.ckpt->state.rng, "checkpoint ", r.ckpt->dir.string(),
               " has no RNG state (saved with --no-save-rng); pass --no-load-rng or --finetune");
  }
  if (r.resume) {
    r.start_iteration = r.ckpt->state.iteration;
    r.consumed = r.ckpt->state.consumed_train_samples;
    r.consumed_valid = r.ckpt->state.consumed_valid_samples;
  }
  r.rng_seed = r.load_rng ? r.ckpt->state.rng->seed : a.seed;
  r.dropout_offset = r.load_rng ? r.ckpt->state.rng->dropout_offset : 0;
}

// The training length and the train / validation / test datasets (rank 0 builds and caches the
// sample indices first; the others then load them).
void build_datasets(TrainingRun& r, const data::Tokenizer& tokenizer) {
  TrainingArgs& a = r.a;
  const int64_t gbs = a.global_batch_size;
  // Sample-based training: Megatron's update_train_iters under a batch-size schedule.
  r.train_iters = a.train_iters > 0     ? a.train_iters
                  : a.train_samples <= 0 ? 0  // --skip-train without a training length
                                         : r.batch_schedule.train_iters_for_samples(a.train_samples);
  MG_REQUIRE(a.train_samples <= 0 || a.train_iters > 0 || r.train_iters > 0, "--train-samples ",
             a.train_samples, " is less than one global batch (", gbs, " samples): nothing to train");
  auto num_samples = data::train_valid_test_num_samples(a.train_samples > 0 ? a.train_samples : -1,
                                                        a.train_iters, gbs, a.eval_interval,
                                                        a.eval_iters);
  // Megatron sizes the validation split by the iteration count (update_train_iters' under a schedule).
  if (!r.batch_schedule.is_constant())
    num_samples[1] = (r.train_iters / a.eval_interval + 1) * a.eval_iters * gbs;
  if (r.train_iters == 0) num_samples[0] = -1;  // --skip-train: the training split is not read
  if (!r.batch_schedule.is_constant()) {
    r.batch_schedule.validate_against(r.consumed, r.start_iteration, r.train_iters, r.mbs, r.dp(),
                                      r.pipeline_layout.num_chunks > 1 ? r.pipeline_layout.pipeline_size : 1);
    r.say(str("will use ", r.batch_schedule.describe(), "; ", r.train_iters, " iterations",
              a.train_iters > 0 ? std::string(" (--train-iters)")
                                : str(" for --train-samples ", a.train_samples)));
  }
  a.data.mock = a.mock_data;
  const bool distributed = r.ps.world_size() > 1;
  if (r.ps.world_rank() == 0) r.data = build_training_data(a, tokenizer, num_samples);
  if (distributed) r.ps.world().barrier();
  if (r.ps.world_rank() != 0) r.data = build_training_data(a, tokenizer, num_samples);
  MG_REQUIRE(r.data->has(DataSplit::train) || a.skip_train,
             "the training split is empty; check --split / --data-path");
}

// The LR and weight-decay schedule in samples (iteration flags x global batch).
optim::LRSchedulerConfig scheduler_config(const TrainingRun& r) {
  const TrainingArgs& a = r.a;
  const int64_t gbs = a.global_batch_size;
  optim::LRSchedulerConfig sc;
  sc.max_lr = a.lr;
  sc.min_lr = a.min_lr;
  if (a.decoupled_lr) {  // Megatron: decoupled_min_lr defaults to min_lr
    sc.decoupled_max_lr = *a.decoupled_lr;
    sc.decoupled_min_lr = a.decoupled_min_lr.value_or(a.min_lr);
  }
  sc.lr_warmup_init = a.lr_warmup_init;
  sc.decay_style = optim::parse_lr_decay_style(a.lr_decay_style);
  sc.lr_decay_steps = a.train_iters > 0 ? (a.lr_decay_iters > 0 ? a.lr_decay_iters : a.train_iters) * gbs
                                        : (a.lr_decay_samples > 0 ? a.lr_decay_samples : a.train_samples);
  sc.lr_warmup_steps = a.lr_warmup_fraction >= 0
                           ? int64_t(a.lr_warmup_fraction * double(sc.lr_decay_steps))
                           : (a.train_iters > 0 ? a.lr_warmup_iters * gbs : a.lr_warmup_samples);
  sc.wsd_decay_style = optim::parse_wsd_decay_style(a.lr_wsd_decay_style);
  sc.wsd_decay_steps = a.train_iters > 0 ? a.lr_wsd_decay_iters * gbs : a.lr_wsd_decay_samples;
  sc.wd_incr_style = optim::parse_wd_incr_style(a.weight_decay_incr_style);
  if (sc.wd_incr_style == optim::WDIncrStyle::Constant) {
    sc.start_wd = sc.end_wd = a.weight_decay;
  } else {  // validate_args: both are given
    sc.start_wd = a.start_weight_decay;
    sc.end_wd = a.end_weight_decay;
  }
  // Megatron's get_optimizer_param_scheduler sets it whatever the style (and saves it).
  sc.wd_incr_steps = a.train_samples > 0 ? a.train_samples : a.train_iters * gbs;
  return sc;
}

}  // namespace

TrainingRun setup_training(TrainingArgs a, std::shared_ptr<Communicator> world) {
  validate_args(a);
  validate_parallel_args(a, world->size());
  TrainingRun r;
  // The device first (one GPU per rank, by local rank): device tensors' collectives then run
  // over NCCL, bootstrapped over the host world.
  r.device = cuda::select_device(a.device, world->rank());
  if (r.device.is_cuda() && world->size() > 1) world = make_nccl_communicator(world, r.device);
  r.comm_stats = std::make_shared<CommStats>();
  ParallelConfig pc;
  pc.tensor_model_parallel_size = a.parallel.tensor_model_parallel_size;
  pc.pipeline_model_parallel_size = a.parallel.pipeline_model_parallel_size;
  pc.context_parallel_size = a.parallel.context_parallel_size;
  pc.expert_model_parallel_size = a.parallel.expert_model_parallel_size;
  pc.expert_tensor_parallel_size = a.parallel.expert_tensor_parallel_size;
  r.ps = ParallelState::create(make_timed_communicator(world, r.comm_stats), pc);
  const int etp = r.ps.layout().config.expert_tensor_parallel_size;
  // Checkpoints of experts sharded otherwise than the dense layers: TP rank t's folder holds
  // expert-tensor shard t % ETP, so ETP must divide TP; under EP each world rank writes the folder
  // of its TP and EP rank (a TP rank need not have a folder for every EP rank: readers take the
  // experts from another TP rank's folder of the same shard, training/checkpoint_expert.cpp). The
  // distributed optimizer's expert shards (over the expert data-parallel group, across TP ranks)
  // and Megatron's .pt files are not written that way. --ckpt-format torch_dist keys the experts
  // by their expert-tensor shards (any ETP).
  const bool checkpoints = !a.save.empty() || !a.load.empty();
  MG_REQUIRE(etp == r.ps.tp_size() || !checkpoints ||
                 ((r.ps.tp_size() % etp == 0 || a.ckpt_format == "torch_dist") &&
                  !a.parallel.use_distributed_optimizer && a.ckpt_format != "torch"),
             "--save/--load with --expert-tensor-parallel-size ", etp, " (tensor-parallel size ",
             r.ps.tp_size(), "): checkpoints hold experts sharded otherwise than the dense layers "
             "only with the plain optimizer (not --use-distributed-optimizer), in this build's "
             "format when the expert-tensor-parallel size divides the tensor-parallel size, or in "
             "--ckpt-format torch_dist (not --ckpt-format torch); train without them or leave "
             "--expert-tensor-parallel-size out");
  r.log_rank = r.ps.world_rank() == r.ps.world_size() - 1;
  const int dp = r.ps.dp_size(), tp = r.ps.tp_size();
  r.dp_cp = dp * r.ps.cp_size();
  r.crank = CheckpointRank::from(r.ps);
  r.pipeline_layout = model::PipelineLayout::make(int(a.model.num_layers), r.ps.pp_size(),
                                                  a.parallel.num_layers_per_virtual_pipeline_stage);
  r.crank.vp_size = r.pipeline_layout.num_chunks;
  r.mbs = a.micro_batch_size;
  // The global batch size per iteration: constant, --rampup-batch-size or
  // --step-batch-size-schedule (batch_size_schedule.h); the final one is evaluation's.
  r.batch_schedule =
      !a.rampup_batch_size.empty()
          ? BatchSizeSchedule::rampup(a.rampup_batch_size[0], a.rampup_batch_size[1],
                                      a.rampup_batch_size[2], a.global_batch_size)
      : !a.step_batch_size_schedule.empty()
          ? BatchSizeSchedule::step(a.step_batch_size_schedule, a.model.seq_length)
          : BatchSizeSchedule::constant(a.global_batch_size > 0 ? a.global_batch_size : r.mbs * dp);
  const int64_t gbs = r.batch_schedule.final_global_batch_size();
  MG_REQUIRE(gbs % (r.mbs * dp) == 0, "the global batch size (", gbs, ") is not divisible by "
             "--micro-batch-size (", r.mbs, ") times data parallel size (", dp, ")");
  r.num_micro = gbs / (r.mbs * dp);
  a.global_batch_size = gbs;
  if (r.ps.world_size() > 1) {
    r.a = a;
    r.say(layout_line(r));
  }
  if (r.log_rank) {  // what the CPU runs, picked from its flags (kernels/cpu/cpu_kernels.h)
    log_info(ops::cpu::cpu_kernel_summary());
    if (a.fp16 && !ops::gemm_computes_in(DType::F16, Device::cpu()))
      log_info("note: --fp16 computes in fp32 on this CPU (no AVX512-FP16 products): the weights "
               "are stored in fp16 and multiplied as fp32 copies");
  }

  auto tokenizer = data::build_tokenizer(a.tokenizer);
  a.model.padded_vocab_size =
      data::padded_vocab_size(tokenizer->vocab_size(), a.make_vocab_size_divisible_by, tp);
  a.model.validate_tensor_parallel(tp);
  a.model.params_dtype = a.bf16 ? DType::BF16 : (a.fp16 ? DType::F16 : DType::F32);
  a.data.seq_length = a.model.seq_length;
  a.data.seed = uint32_t(a.seed);
  a.data.tokenizer = tokenizer->type();
  a.data.eod_id = tokenizer->eod_or_throw();
  a.data.vocab_size = tokenizer->vocab_size();
  r.a = std::move(a);
  // Megatron's arguments block, with what the flags resolved to (padded vocabulary, precision).
  if (r.log_rank)
    for (const std::string& line : format_arguments_block(r.a)) log_print(line);

  find_load_checkpoint(r);
  build_datasets(r, *tokenizer);
  r.scheduler_config = scheduler_config(r);

  // The model is built with the (restored) RNG seed: dropout masks continue where they stopped.
  // Every rank draws the same master weights and keeps its tensor-parallel slice of its pipeline
  // stage's layers. One path for every layout: at PP = 1 the stage is one chunk, the whole model,
  // and the schedule is "no pipelining".
  if (!r.device.is_cpu()) r.say(str("device: ", cuda::describe_device(r.device)));
  r.model = std::make_unique<model::StageModel>(r.a.model, r.rng_seed, r.ps,
                                                r.a.parallel.num_layers_per_virtual_pipeline_stage,
                                                r.device);
  r.params = r.model->parameters();
  if (r.ckpt) {
    model::ParameterList params = r.params;
    for (model::Parameter* p : moe_checkpoint_buffers(r)) params.push_back(p);
    load_model_weights(*r.ckpt, params, /*allow_dtype_conversion=*/!r.resume, r.crank);
    moe_checkpoint_buffers_loaded(r);
    // The last stage's tied output_layer.weight is not in the checkpoint: the first stage's table.
    r.model->sync_shared_embedding();
  }
  return r;
}

namespace {
// The experts have a mesh of their own (expert parallelism, or an expert tensor-parallel size
// other than the tensor-parallel size): their gradients are reduced over the expert
// data-parallel group, which then differs from the data-parallel one.
bool separate_expert_mesh(const ParallelState& ps) {
  return ps.ep_size() > 1 || ps.layout().config.expert_tensor_parallel_size != ps.tp_size();
}

// Under expert parallelism the plain optimizer's inf check and grad norm are summed over the world
// with each distinct gradient counted once: dense weights on data x context parallel rank 0
// (their reduced gradients are the same on every such rank), expert weights on expert
// data-parallel rank 0, both by the tensor-parallel duplicate rule.
std::vector<bool> expert_parallel_norm_terms(const TrainingRun& r) {
  const int dp_cp_rank = r.ps.group(GroupKind::DP_CP).rank();
  const int edp_rank = r.ps.group(GroupKind::EXPERT_DP).rank();
  const int etp_rank = r.ps.group(GroupKind::EXPERT_TP).rank();
  std::vector<bool> counted;
  for (const model::Parameter* q : r.params)
    counted.push_back(q->expert >= 0
                          ? edp_rank == 0 && model::param_counts_in_grad_norm(*q, etp_rank)
                          : dp_cp_rank == 0 && model::param_counts_in_grad_norm(*q, r.ps.tp_rank()));
  return counted;
}
}  // namespace

void setup_optimizer(TrainingRun& r) {
  TrainingArgs& a = r.a;
  const ParallelArgs& p = a.parallel;
  a.optimizer.type = optim::parse_optimizer_type(a.optimizer_name);
  // Data parallelism: one flat gradient buffer in buckets (Megatron: buckets only when
  // overlapping, of max(40M, 1M x DP) elements by default; one bucket otherwise). Gradients are
  // summed over data x context parallel ranks (every CP rank holds the partial gradient of its
  // tokens; Megatron's data_parallel_group_with_cp); the distributed optimizer shards over them.
  const bool expert_mesh = separate_expert_mesh(r.ps);
  if (r.dp_cp > 1 || p.use_distributed_optimizer ||
      (expert_mesh && r.ps.layout().expert_data_parallel_size > 1)) {
    optim::GradBufferConfig bc;
    bc.bucket_size = p.overlap_grad_reduce
                         ? (p.ddp_bucket_size > 0 ? p.ddp_bucket_size
                                                  : std::max<int64_t>(40000000, 1000000 * int64_t(r.dp_cp)))
                         : 0;
    bc.pad_for_sharding = p.use_distributed_optimizer;
    bc.overlap_param_gather = p.overlap_param_gather;
    bc.reduce_in_bf16 = a.bf16 && a.grad_reduce_in_bf16;
    // Expert parallelism: the experts' weights are summed over the expert data-parallel group in
    // a buffer of their own, every other weight over data x context parallel as before.
    if (expert_mesh) {
      model::ParameterList dense, experts;
      for (model::Parameter* q : r.params) (q->expert >= 0 ? experts : dense).push_back(q);
      r.buffer = std::make_unique<optim::ParamAndGradBuffer>(dense, r.ps.group_ptr(GroupKind::DP_CP), bc);
      optim::GradBufferConfig ec = bc;
      ec.bucket_size = 0;
      if (!experts.empty())
        r.expert_buffer = std::make_unique<optim::ParamAndGradBuffer>(
            experts, r.ps.group_ptr(GroupKind::EXPERT_DP), ec);
    } else {
      r.buffer = std::make_unique<optim::ParamAndGradBuffer>(r.params, r.ps.group_ptr(GroupKind::DP_CP), bc);
    }
  }
  // --overlap-param-gather: the optimizer step only launches the parameter all-gathers; the
  // forward waits for each bucket just before the first layer that reads it (and polls the others
  // so they advance during compute). Every other reader of the parameters (evaluation,
  // checkpoint save, the end of training) calls optimizer->finish_param_sync() first.
  if (p.overlap_param_gather)
    r.model->set_forward_pre_hook([b = r.buffer.get(), e = r.expert_buffer.get()](
                                      const model::ParameterList& ps) {
      if (e == nullptr) return b->wait_params(ps);
      model::ParameterList dense, experts;  // expert parallelism: each buffer gathers its own
      for (model::Parameter* q : ps) (e->holds(q) ? experts : dense).push_back(q);
      b->wait_params(dense);
      e->wait_params(experts);
    });
  // fp32 main copies of the (loaded) weights: all of them, or this rank's shard.
  if (p.use_distributed_optimizer) {
    std::vector<optim::DistributedOptimizer::BufferPart> parts = {{r.buffer.get(), r.ps.tp_rank()}};
    if (r.expert_buffer)
      parts.push_back({r.expert_buffer.get(), r.ps.group(GroupKind::EXPERT_TP).rank()});
    r.optimizer = std::make_unique<optim::DistributedOptimizer>(r.params, std::move(parts),
                                                                a.optimizer, r.ps.world());
  } else {
    auto plain = std::make_unique<optim::Optimizer>(r.params, a.optimizer);
    if (expert_mesh) {
      plain->set_grad_stats_group(&r.ps.world(), expert_parallel_norm_terms(r));
    } else if (r.ps.mp().size() > 1) {
      plain->set_grad_stats_group(&r.ps.mp(), r.ps.tp_rank());
    }
    r.optimizer = std::move(plain);
  }
  r.scaler = a.fp16 ? (a.loss_scale > 0 ? optim::GradScaler::constant(a.loss_scale)
                                        : optim::GradScaler::dynamic(a.initial_loss_scale, a.min_loss_scale,
                                                                     a.loss_scale_window, a.hysteresis))
                    : optim::GradScaler::constant(a.loss_scale > 0 && !a.bf16 ? a.loss_scale : 1.0);
  optim::LRSchedulerConfig& sc = r.scheduler_config;
  if (r.load_optim) {  // Megatron restores loss scaler and LR schedule together with the optimizer
    load_optimizer_state(*r.ckpt, *r.optimizer, r.crank);
    if (r.scaler.is_dynamic() && r.ckpt->state.grad_scaler_dynamic)
      r.scaler.load_state(r.ckpt->state.grad_scaler);
    sc = resolve_scheduler_config(sc, *r.ckpt, a.override_opt_param_scheduler,
                                  a.use_checkpoint_opt_param_scheduler);
  }
  MG_REQUIRE(sc.max_lr >= 0, "--lr is required (no LR schedule was loaded from a checkpoint)");
  r.scheduler.emplace(sc);
  if (r.load_optim) r.scheduler->set_num_steps(r.ckpt->state.scheduler_num_steps);
  // --decoupled-lr: Megatron's is_embedding_or_output_parameter (the word embedding on the first
  // stage, output_layer.weight on the last, the tied copy included; not the position embedding).
  if (sc.has_decoupled_lr()) {
    std::vector<bool> flags;
    for (const model::Parameter* q : r.params)
      flags.push_back(q->name == "embedding.word_embeddings.weight" || q->name == "output_layer.weight");
    r.optimizer->set_decoupled_lr_params(flags);
  }
  if (r.ckpt) {
    std::string what;
    if (!r.resume) {
      what = str(a.finetune ? "--finetune" : "release checkpoint",
                 ": weights only; iteration, consumed samples, optimizer and LR schedule start from zero");
    } else {
      what = str("consumed samples: ", r.consumed,
                 r.load_optim ? "; optimizer, loss scaler and LR schedule restored"
                              : "; --no-load-optim: optimizer, loss scaler and LR schedule start fresh",
                 r.load_rng ? "; RNG restored" : "; --no-load-rng: RNG from --seed");
    }
    r.say(str("successfully loaded checkpoint from ", a.load, " at iteration ",
              r.ckpt->state.iteration, " (", what, ")"));
  }
}

}  // namespace megatron::training
