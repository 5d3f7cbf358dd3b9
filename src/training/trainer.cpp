// The pretraining loop over data, tensor and sequence parallel ranks; see trainer.h.
#include "training/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <optional>

#include "comm/parallel_state.h"
#include "comm/timed_communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/ops.h"
#include "model/gpt_stage.h"
#include "model/layer_spec.h"
#include "model/tensor_parallel.h"
#include "optim/distributed_optimizer.h"
#include "optim/grad_buffer.h"
#include "optim/grad_scaler.h"
#include "pipeline/forward_backward.h"
#include "training/batch_size_schedule.h"
#include "training/checkpoint.h"
#include "training/metrics.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {

namespace {

std::atomic<bool> g_exit_signal{false};
extern "C" void on_exit_signal(int) { g_exit_signal.store(true); }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

model::GPTInputs to_inputs(const data::GPTBatch& b) {
  return model::GPTInputs{b.tokens, b.position_ids, b.attention_start, b.labels, b.loss_mask, Tensor()};
}

// Test hook for fault-tolerance tests: MEGATRON_TEST_FAULT="kill:RANK:ITER" (or "hang:...") makes
// world rank RANK die by SIGKILL (or stop by SIGSTOP, a hang) at the start of iteration ITER's
// forward/backward, while its peers are mid-step. The job must then end with an error (the
// launcher's, or the distributed timeout's MPI_Abort) instead of hanging. Unset: nothing happens.
void maybe_inject_fault(int world_rank, int64_t iteration) {
  static const char* spec = std::getenv("MEGATRON_TEST_FAULT");
  if (spec == nullptr) return;
  char mode[8] = {};
  int rank = -1;
  long long it = -1;
  if (std::sscanf(spec, "%7[a-z]:%d:%lld", mode, &rank, &it) != 3 || rank != world_rank ||
      it != iteration)
    return;
  const bool hang = std::string(mode) == "hang";
  std::fprintf(stderr, "MEGATRON_TEST_FAULT: world rank %d %s at iteration %lld\n", world_rank,
               hang ? "hangs (SIGSTOP)" : "dies (SIGKILL)", it);
  std::fflush(stderr);
  std::raise(hang ? SIGSTOP : SIGKILL);
}

double mask_sum(const Tensor& mask) {
  double s = 0;
  const float* p = mask.data<float>();
  for (int64_t i = 0; i < mask.numel(); ++i) s += p[i];
  return s;
}

}  // namespace

TrainingSummary pretrain_gpt(TrainingArgs a) {
  auto world = world_communicator(
      CommOptions::from_timeout_minutes(a.parallel.distributed_timeout_minutes));
  return pretrain_gpt(std::move(a), world);
}

TrainingSummary pretrain_gpt(TrainingArgs a, std::shared_ptr<Communicator> world_in) {
  validate_args(a);
  validate_parallel_args(a, world_in->size());
  const auto t_start = Clock::now();
  // Every collective runs through the timed world: the communication share of the step time.
  auto comm_stats = std::make_shared<CommStats>();
  ParallelConfig pc;
  pc.tensor_model_parallel_size = a.parallel.tensor_model_parallel_size;
  pc.pipeline_model_parallel_size = a.parallel.pipeline_model_parallel_size;
  pc.context_parallel_size = a.parallel.context_parallel_size;
  const ParallelState ps = ParallelState::create(make_timed_communicator(world_in, comm_stats), pc);
  Communicator& world = ps.world();
  const bool distributed = world.size() > 1;
  const int dp = ps.dp_size(), dp_rank = ps.dp_rank(), tp = ps.tp_size();
  const int pp = ps.pp_size();
  CheckpointRank crank = CheckpointRank::from(ps);
  const model::PipelineLayout pipeline_layout = model::PipelineLayout::make(
      int(a.model.num_layers), pp, a.parallel.num_layers_per_virtual_pipeline_stage);
  crank.vp_size = pipeline_layout.num_chunks;
  const int dp_cp = dp * ps.cp_size();  // ranks whose gradients and losses are summed
  // Context parallelism: every CP rank loads its DP rank's micro-batch and keeps its zig-zag slice.
  auto cp_slice = [&](const data::GPTBatch& b) {
    return model::slice_for_context_parallel(to_inputs(b), ps.cp_rank(), ps.cp_size());
  };
  // Megatron's print_rank_last: the last rank prints the log lines and writes the metrics.
  const bool log_rank = ps.world_rank() == ps.world_size() - 1;
  auto say = [&](const std::string& line) {
    if (log_rank) log_print(line);
  };
  const int64_t mbs = a.micro_batch_size;
  // The global batch size per iteration: constant, --rampup-batch-size or
  // --step-batch-size-schedule (batch_size_schedule.h). gbs is the final one (evaluation's).
  const BatchSizeSchedule batch_schedule =
      !a.rampup_batch_size.empty()
          ? BatchSizeSchedule::rampup(a.rampup_batch_size[0], a.rampup_batch_size[1],
                                      a.rampup_batch_size[2], a.global_batch_size)
      : !a.step_batch_size_schedule.empty()
          ? BatchSizeSchedule::step(a.step_batch_size_schedule, a.model.seq_length)
          : BatchSizeSchedule::constant(a.global_batch_size > 0 ? a.global_batch_size : mbs * dp);
  const int64_t gbs = batch_schedule.final_global_batch_size();
  MG_REQUIRE(gbs % (mbs * dp) == 0, "the global batch size (", gbs, ") is not divisible by "
             "--micro-batch-size (", mbs, ") times data parallel size (", dp, ")");
  const int64_t num_micro = gbs / (mbs * dp);  // per data-parallel rank, of the final batch
  a.global_batch_size = gbs;
  const bool use_dist_opt = a.parallel.use_distributed_optimizer;
  const bool overlap = a.parallel.overlap_grad_reduce;
  // Requires the two above (validate_parallel_args).
  const bool overlap_param_gather = a.parallel.overlap_param_gather;
  if (distributed)
    say(str("parallel layout: world ", world.size(), " = TP ", tp, " x PP ", pp, " x CP ",
            ps.cp_size(), " x DP ", dp,
            pipeline_layout.num_chunks > 1
                ? str(", ", pipeline_layout.num_chunks, " virtual stages per pipeline rank (interleaved 1F1B)")
                : std::string(pp > 1 ? ", 1F1B pipeline schedule" : ""),
            a.model.sequence_parallel && tp > 1 ? ", sequence parallel" : "",
            use_dist_opt ? ", distributed optimizer" : "",
            overlap ? (pp > 1 ? ", gradient reduction overlapped with each model chunk's last "
                                "micro-batch backward (tied embedding after the pipeline flush)"
                              : ", gradient reduction overlapped with backward")
                    : "",
            overlap_param_gather ? ", parameter all-gather overlapped with forward" : "",
            "; ", num_micro, " micro-batches of ", mbs, " per rank and iteration"));

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

  // --load: find the checkpoint first, so that flag mismatches fail before any work.
  std::optional<CheckpointOnDisk> ckpt;
  if (!a.load.empty()) {
    ckpt = find_checkpoint(a.load, a.ckpt_step >= 0 ? std::optional<int64_t>(a.ckpt_step) : std::nullopt);
    if (!ckpt) {
      const std::string why = std::filesystem::exists(a.load)
                                  ? " has no latest_checkpointed_iteration.txt"
                                  : " does not exist";
      MG_REQUIRE(!a.exit_on_missing_checkpoint, "--load ", a.load, why,
                 " and --exit-on-missing-checkpoint is set");
      say(str("WARNING: --load ", a.load, why,
              "; no checkpoint is loaded and training starts from random initialization"));
    }
  }
  // A resume continues iteration, samples, optimizer, scheduler and RNG; --finetune (and a
  // "release" checkpoint) loads the weights only.
  const bool resume = ckpt && !ckpt->release && !a.finetune;
  const bool load_optim = resume && !a.no_load_optim;
  const bool load_rng = resume && !a.no_load_rng;
  if (ckpt) {
    say(str("loading checkpoint from ", a.load, " at iteration ", ckpt->state.iteration));
    check_checkpoint_layout(*ckpt, crank);
    check_checkpoint_args(*ckpt, a, !resume);
    MG_REQUIRE(!load_rng || ckpt->state.rng, "checkpoint ", ckpt->dir.string(),
               " has no RNG state (saved with --no-save-rng); pass --no-load-rng or --finetune");
  }
  int64_t start_iteration = 0, consumed = 0, consumed_valid = 0;
  if (resume) {
    start_iteration = ckpt->state.iteration;
    consumed = ckpt->state.consumed_train_samples;
    consumed_valid = ckpt->state.consumed_valid_samples;
  }
  const uint64_t rng_seed = load_rng ? ckpt->state.rng->seed : a.seed;
  uint64_t dropout_offset = load_rng ? ckpt->state.rng->dropout_offset : 0;

  // Sample-based training: Megatron's update_train_iters under a batch-size schedule.
  const int64_t train_iters =
      a.train_iters > 0    ? a.train_iters
      : a.train_samples <= 0 ? 0  // --skip-train without a training length
      : batch_schedule.train_iters_for_samples(a.train_samples);  // a partial last batch: dropped
  MG_REQUIRE(a.train_samples <= 0 || a.train_iters > 0 || train_iters > 0, "--train-samples ",
             a.train_samples, " is less than one global batch (", gbs, " samples): nothing to train");
  const int64_t train_samples = a.train_samples > 0 ? a.train_samples : a.train_iters * gbs;
  auto num_samples = data::train_valid_test_num_samples(a.train_samples > 0 ? a.train_samples : -1,
                                                        a.train_iters, gbs, a.eval_interval,
                                                        a.eval_iters);
  // Megatron sizes the validation split by the iteration count (update_train_iters' under a schedule).
  if (!batch_schedule.is_constant())
    num_samples[1] = (train_iters / a.eval_interval + 1) * a.eval_iters * gbs;
  if (train_iters == 0) num_samples[0] = -1;  // --skip-train: the training split is not read
  if (!batch_schedule.is_constant()) {
    batch_schedule.validate_against(consumed, start_iteration, train_iters, mbs, dp,
                                    pipeline_layout.num_chunks > 1 ? pipeline_layout.pipeline_size : 1);
    say(str("will use ", batch_schedule.describe(), "; ", train_iters, " iterations for --train-samples ",
            a.train_samples));
  }
  a.data.mock = a.mock_data;
  // Rank 0 builds (and caches) the sample indices first; the others then load them.
  data::GPTDatasets ds;
  if (ps.world_rank() == 0) ds = data::build_gpt_datasets(a.data, num_samples);
  if (distributed) world.barrier();
  if (ps.world_rank() != 0) ds = data::build_gpt_datasets(a.data, num_samples);
  MG_REQUIRE(ds.train != nullptr || a.skip_train, "the training split is empty; check --split / --data-path");
  const data::GPTBatchOptions bopt = data::batch_options(a.data);

  // LR schedule in samples (iteration flags x global batch).
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
  } else {
    MG_REQUIRE(a.start_weight_decay >= 0 && a.end_weight_decay >= 0,
               "--weight-decay-incr-style ", a.weight_decay_incr_style,
               " needs --start-weight-decay and --end-weight-decay");
    sc.start_wd = a.start_weight_decay;
    sc.end_wd = a.end_weight_decay;
    sc.wd_incr_steps = train_samples;
  }

  // The model is built with the (restored) RNG seed: dropout masks continue where they stopped.
  // Every rank draws the same master weights and keeps its tensor-parallel slice (of its
  // pipeline stage's layers under PP).
  // One path for every layout: the rank's pipeline stage (at PP = 1 one chunk, the whole model)
  // run by the schedule (at PP = 1 "no pipelining").
  auto stage = std::make_unique<model::GPTStageModel>(
      a.model, rng_seed, ps, a.parallel.num_layers_per_virtual_pipeline_stage);
  const model::ParameterList params = stage->parameters();
  if (ckpt) {
    load_model_weights(*ckpt, params, /*allow_dtype_conversion=*/!resume, crank);
    // The last stage's tied output_layer.weight is not in the checkpoint: the first stage's table.
    stage->sync_shared_embedding();
  }

  // Megatron's evaluate(): up to --eval-iters iterations of the final global batch's micro-batches
  // from sample `consumed_eval` of `d` on (which it advances), the same samples as one rank would
  // see, split over DP. Under PP the forward-only schedule per evaluation iteration (the loss comes
  // from the last stage to every stage); interleaved, only whole iterations (M stays a multiple of
  // PP). Returns {loss sum, loss tokens}, summed over DP x CP.
  auto evaluate = [&](const data::SampleDataset& d, int64_t& consumed_eval) {
    double vloss = 0, vtokens = 0;
    for (int64_t e = 0; e < a.eval_iters; ++e) {
      if (pipeline_layout.num_chunks > 1 && consumed_eval + num_micro * mbs * dp > d.size()) break;
      std::vector<model::GPTInputs> group;
      for (int64_t m = 0; m < num_micro; ++m) {
        if (consumed_eval + mbs * dp > d.size()) break;
        group.push_back(cp_slice(data::make_batch(d, consumed_eval, mbs, dp_rank, dp, bopt)));
        consumed_eval += mbs * dp;
      }
      if (!group.empty()) {
        pipeline::ForwardBackwardOptions fb;
        fb.forward_only = true;
        const pipeline::ForwardBackwardResult r = pipeline::forward_backward(*stage, group, fb);
        vloss += r.loss_sum;
        vtokens += r.num_tokens;
      }
      if (int64_t(group.size()) < num_micro) break;  // the split ran out
    }
    if (dp_cp > 1) {
      Tensor t = Tensor::from_vector(std::vector<double>{vloss, vtokens}, {2});
      ps.dp_cp().all_reduce(t, ReduceOp::Sum);
      vloss = t.data<double>()[0];
      vtokens = t.data<double>()[1];
    }
    return std::pair<double, double>(vloss, vtokens);
  };
  auto print_evaluation = [&](const std::string& line) {
    const std::string dashes(line.size(), '-');
    say(dashes);
    say(line);
    say(dashes);
  };

  // Megatron's pretrain() after the training loop, or instead of it with --skip-train: the
  // validation split from sample `valid_from` (where the loop's evaluations stopped) and the test
  // split from its first sample, printed as "iteration N on validation set" / "... on test set".
  auto final_evaluation = [&](int64_t iteration, int64_t valid_from, TrainingSummary& sum) {
    if (a.eval_iters <= 0) return;
    if (ds.valid) {
      const auto [l, t] = evaluate(*ds.valid, valid_from);
      if (t > 0) {
        print_evaluation(
            format_evaluation_line(str("iteration ", iteration, " on validation set"), l / t));
        sum.valid_losses.push_back(l / t);
      }
    }
    if (ds.test) {
      int64_t from = 0;
      const auto [l, t] = evaluate(*ds.test, from);
      if (t > 0) {
        print_evaluation(format_evaluation_line(str("iteration ", iteration, " on test set"), l / t));
        sum.test_loss = l / t;
      }
    }
  };

  if (a.skip_train) {
    // Megatron's pretrain() with --skip-train: no training loop; the validation split from its
    // first sample and the test split, at the loaded iteration (0 without a checkpoint).
    say("skipping training (--skip-train is on) ...");
    MG_REQUIRE((ds.valid || ds.test) && a.eval_iters > 0, "--skip-train: nothing to evaluate: ",
               a.eval_iters == 0 ? "--eval-iters is 0"
                                 : "the validation and test splits are empty (check --split, "
                                   "--valid-data-path, --test-data-path)");
    TrainingSummary sum;
    sum.start_iteration = sum.iterations = start_iteration;
    sum.consumed_samples = consumed;
    sum.world_size = world.size();
    final_evaluation(start_iteration, 0, sum);
    sum.comm_seconds = comm_stats->seconds;
    return sum;
  }
  a.optimizer.type = optim::parse_optimizer_type(a.optimizer_name);
  // Data parallelism: one flat gradient buffer in buckets (Megatron: buckets only when
  // overlapping, of max(40M, 1M x DP) elements by default; one bucket otherwise).
  // Gradients are summed over data x context parallel ranks (every CP rank holds the partial
  // gradient of its tokens; Megatron's data_parallel_group_with_cp); the distributed optimizer
  // shards over that group.
  std::unique_ptr<optim::ParamAndGradBuffer> buffer;
  if (dp_cp > 1 || use_dist_opt) {
    optim::GradBufferConfig bc;
    bc.bucket_size = overlap ? (a.parallel.ddp_bucket_size > 0 ? a.parallel.ddp_bucket_size
                                                               : std::max<int64_t>(40000000, 1000000 * dp_cp))
                             : 0;
    bc.pad_for_sharding = use_dist_opt;
    bc.overlap_param_gather = overlap_param_gather;
    bc.reduce_in_bf16 = a.bf16 && a.grad_reduce_in_bf16;
    buffer = std::make_unique<optim::ParamAndGradBuffer>(params, ps.group_ptr(GroupKind::DP_CP), bc);
  }
  // --overlap-param-gather: the optimizer step only launches the parameter all-gathers; the
  // forward waits for each bucket just before the first layer that reads it (and polls the
  // others so they advance during compute). Every other reader of the parameters (evaluation,
  // checkpoint save, the end of training) calls buffer->finish_param_sync() first.
  if (overlap_param_gather) {
    stage->set_forward_pre_hook(
        [b = buffer.get()](const model::ParameterList& ps) { b->wait_params(ps); });
  }
  auto finish_param_sync = [&] {
    if (buffer && use_dist_opt) buffer->finish_param_sync();
  };
  // fp32 main copies of the (loaded) weights: all of them, or this rank's shard.
  std::unique_ptr<optim::Optimizer> plain_opt;
  std::unique_ptr<optim::DistributedOptimizer> dist_opt;
  if (use_dist_opt) {
    dist_opt = std::make_unique<optim::DistributedOptimizer>(*buffer, a.optimizer, world, ps.tp_rank());
  } else {
    plain_opt = std::make_unique<optim::Optimizer>(params, a.optimizer);
    if (ps.mp().size() > 1) plain_opt->set_grad_stats_group(&ps.mp(), ps.tp_rank());
  }
  const OptimizerRef opt = use_dist_opt ? OptimizerRef(dist_opt.get()) : OptimizerRef(plain_opt.get());
  optim::GradScaler scaler =
      a.fp16 ? (a.loss_scale > 0 ? optim::GradScaler::constant(a.loss_scale)
                                 : optim::GradScaler::dynamic(a.initial_loss_scale, a.min_loss_scale,
                                                              a.loss_scale_window, a.hysteresis))
             : optim::GradScaler::constant(a.loss_scale > 0 && !a.bf16 ? a.loss_scale : 1.0);
  if (load_optim) {  // Megatron restores loss scaler and LR schedule together with the optimizer
    load_optimizer_state(*ckpt, opt, crank);
    if (scaler.is_dynamic() && ckpt->state.grad_scaler_dynamic) scaler.load_state(ckpt->state.grad_scaler);
    sc = resolve_scheduler_config(sc, *ckpt, a.override_opt_param_scheduler,
                                  a.use_checkpoint_opt_param_scheduler);
  }
  MG_REQUIRE(sc.max_lr >= 0, "--lr is required (no LR schedule was loaded from a checkpoint)");
  optim::LRScheduler scheduler(sc);
  if (load_optim) scheduler.set_num_steps(ckpt->state.scheduler_num_steps);
  // --decoupled-lr: Megatron's is_embedding_or_output_parameter (the word embedding on the first
  // stage, output_layer.weight on the last, the tied copy included; not the position embedding).
  if (sc.has_decoupled_lr()) {
    std::vector<bool> flags;
    for (const model::Parameter* p : params)
      flags.push_back(p->name == "embedding.word_embeddings.weight" || p->name == "output_layer.weight");
    if (dist_opt)
      dist_opt->set_decoupled_lr_params(flags);
    else
      plain_opt->set_decoupled_lr_params(flags);
  }
  if (ckpt) {
    std::string what;
    if (!resume) {
      what = str(a.finetune ? "--finetune" : "release checkpoint",
                 ": weights only; iteration, consumed samples, optimizer and LR schedule start from zero");
    } else {
      what = str("consumed samples: ", consumed,
                 load_optim ? "; optimizer, loss scaler and LR schedule restored"
                            : "; --no-load-optim: optimizer, loss scaler and LR schedule start fresh",
                 load_rng ? "; RNG restored" : "; --no-load-rng: RNG from --seed");
    }
    say(str("successfully loaded checkpoint from ", a.load, " at iteration ",
            ckpt->state.iteration, " (", what, ")"));
  }

  if (a.exit_signal_handler) {
    std::signal(SIGTERM, on_exit_signal);
    std::signal(SIGINT, on_exit_signal);
  }
  std::ofstream jsonl;
  if (!a.metrics_jsonl.empty() && log_rank) {
    jsonl.open(a.metrics_jsonl, std::ios::app);
    MG_REQUIRE(jsonl.good(), "--log-metrics-jsonl: cannot open ", a.metrics_jsonl, " for writing");
    jsonl << std::setprecision(17);  // round-trip exact: resumed runs compare bitwise
  }
  FlopsModel fm{a.model.num_layers, a.model.hidden_size, a.model.num_attention_heads,
                a.model.kv_channels, a.model.num_query_groups, a.model.ffn(), a.model.seq_length,
                a.model.padded_vocab_size, model::activation_kind(a.model.activation).gated};
  double interval_flops = 0;  // the batch size may change between iterations
  TensorBoardOptions tb_options = a.tensorboard;
  if (!log_rank) tb_options.dir.clear();
  TrainingTensorBoard tensorboard(tb_options);

  TrainingSummary sum;
  sum.start_iteration = sum.iterations = start_iteration;
  sum.consumed_samples = consumed;
  sum.world_size = world.size();
  double interval_comm0 = comm_stats->seconds;
  int64_t interval_iters = 0, interval_advanced = 0, interval_skipped = 0, interval_nan = 0;
  int64_t interval_samples = 0;
  const int64_t consumed_at_start = consumed;
  double interval_loss = 0, interval_gn = std::nan("");
  auto interval_t0 = Clock::now();
  const auto loop_t0 = Clock::now();

  int64_t last_saved = -1;
  auto save = [&](int64_t it) {
    if (a.save.empty() || last_saved == it) return;
    finish_param_sync();  // the parameters of the last step are complete on every rank
    CheckpointState st;
    st.iteration = it;
    st.consumed_train_samples = consumed;
    st.consumed_valid_samples = consumed_valid;
    st.grad_scaler = scaler.state();
    st.grad_scaler_dynamic = scaler.is_dynamic();
    st.scheduler = scheduler.config();
    st.scheduler_num_steps = scheduler.num_steps();
    if (!a.no_save_rng) st.rng = RngState{rng_seed, dropout_offset};
    st.args = training_args_to_json(a);
    const OptimizerRef saved_opt = a.no_save_optim ? OptimizerRef() : opt;
    std::filesystem::path dir;
    if (a.ckpt_format == "torch") {
      TorchSaveOptions to;
      to.transformer_impl = a.transformer_impl;
      dir = save_torch_checkpoint(a.save, st, params, saved_opt, crank, to);
    } else {
      dir = save_checkpoint(a.save, st, params, saved_opt, crank);
    }
    say(str("saved checkpoint at iteration ", it, " to ", dir.string()));
    last_saved = it;
  };

  // Sums over the data x context parallel group (token counts, losses); a no-op on one rank.
  auto dp_sum = [&](std::vector<double> v) {
    if (dp_cp > 1) {
      Tensor t = Tensor::from_vector(v, {int64_t(v.size())});
      ps.dp_cp().all_reduce(t, ReduceOp::Sum);
      for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<double>()[i];
    }
    return v;
  };
  const bool hook_reduction = overlap && buffer != nullptr;
  // Buckets launched by the end of the backward passes (before finish_grad_sync; under PP before
  // the tied embedding's all-reduce), the fewest over the iterations: tests check the overlap.
  int launched_in_backward = -1;

  if (start_iteration >= train_iters)
    say(str("the checkpoint is at iteration ", start_iteration, ", at or past the ", train_iters,
            " training iterations asked for: nothing to train"));
  // Megatron's get_num_microbatches() of the previous iteration (the schedule's at the start).
  int64_t prev_num_micro = batch_schedule.global_batch_size(consumed) / (mbs * dp);
  bool exited_early = false;  // --exit-interval, --exit-duration-in-mins or a signal
  for (int64_t it = start_iteration + 1; it <= train_iters; ++it) {
    // This iteration's global batch (batch_size_schedule.h; checked up front by validate_against).
    const int64_t iter_gbs = batch_schedule.global_batch_size(consumed);
    const int64_t iter_micro = iter_gbs / (mbs * dp);
    if (iter_micro != prev_num_micro) {
      // Megatron saves a checkpoint (with --save) before the number of micro-batches changes.
      say(str(batch_schedule.kind() == BatchSizeSchedule::Kind::Step ? "stepping" : "ramping up",
              " batch size from ", prev_num_micro * mbs * dp, " to ", iter_gbs, " at ", consumed,
              " consumed samples"));
      save(it - 1);
      prev_num_micro = iter_micro;
    }
    if (buffer)
      buffer->zero_grad();
    else
      plain_opt->zero_grad();
    // This DP rank's micro-batches: global micro-batch m * DP + dp_rank of the iteration.
    std::vector<model::GPTInputs> batches;
    std::vector<double> microbatch_tokens;  // loss tokens of each micro-batch (this CP slice)
    double local_tokens = 0;
    for (int64_t m = 0; m < iter_micro; ++m) {
      batches.push_back(cp_slice(data::make_batch(*ds.train, consumed + m * mbs * dp, mbs, dp_rank, dp, bopt)));
      microbatch_tokens.push_back(mask_sum(batches.back().loss_mask));
      local_tokens += microbatch_tokens.back();
    }
    const double tokens = dp_sum({local_tokens})[0];  // loss tokens of the global batch
    // The loss whose gradient the step takes (trainer.h), times the loss scale:
    // --calculate-per-token-loss: sum of loss over the global batch / its loss tokens
    // (Megatron's finalize_model_grads divides by the tokens summed over DP x CP);
    // default: each micro-batch's loss sum / max(its loss tokens, 1) / micro-batches (Megatron's
    // forward_step), and 1 / (DP x CP) as Megatron's gradient_scaling_factor before the sum.
    std::vector<float> microbatch_grad_scale;
    if (!a.calculate_per_token_loss)
      for (double t : microbatch_tokens)
        microbatch_grad_scale.push_back(
            float(scaler.scale() / (std::max(t, 1.0) * double(iter_micro) * double(dp_cp))));
    const float grad_scale = float(scaler.scale() / std::max(tokens, 1.0));
    double loss_sum = 0;
    int launched = 0;  // buckets launched by the end of the backward passes
    maybe_inject_fault(ps.world_rank(), it);
    {
      // Megatron's forward_backward_func: the schedule over this DP rank's micro-batches, whose
      // dropout keys are m * DP + dp_rank; it finalises the model-parallel grads (partial sums
      // over TP, tied embedding over the embedding group) and gives every stage the loss. With
      // overlap it hands each chunk's parameters to the buffer during the chunk's last
      // micro-batch backward (their TP sums done), the tied embedding after the flush.
      pipeline::ForwardBackwardOptions fb;
      fb.grad_scale = grad_scale;
      fb.microbatch_grad_scale = std::move(microbatch_grad_scale);
      fb.dropout_offset = dropout_offset + uint64_t(dp_rank);
      fb.dropout_offset_stride = uint64_t(dp);
      if (hook_reduction) {
        fb.grad_ready = [&](const model::ParameterList& ready) { buffer->register_grads_ready(ready); };
        fb.progress = [&] {  // after every pass: MPI advances the launched reductions
          buffer->progress();
          launched = buffer->launched_buckets();
        };
      }
      loss_sum = pipeline::forward_backward(*stage, batches, fb).loss_sum;
    }
    if (buffer)
      launched_in_backward = launched_in_backward < 0 ? launched : std::min(launched_in_backward, launched);
    dropout_offset += uint64_t(iter_micro * dp);
    if (buffer) buffer->finish_grad_sync();
    if (a.bf16 && a.grad_reduce_in_bf16 && !buffer) {
      // One rank, no reduction: Megatron's bf16 main-grad buffer still holds bf16 values.
      for (const model::Parameter* p : params) {
        Tensor h = Tensor::empty(p->grad.shape(), DType::BF16, p->grad.device());
        ops::cast(h, p->grad);
        ops::cast(p->grad, h);
      }
    }
    loss_sum = dp_sum({loss_sum})[0];
    const double loss = loss_sum / std::max(tokens, 1.0);
    const double dec_lr = sc.has_decoupled_lr() ? scheduler.decoupled_lr() : std::nan("");
    optim::StepResult step =
        dist_opt ? dist_opt->step(scheduler.lr(), scheduler.weight_decay(), scaler, dec_lr)
                 : plain_opt->step(scheduler.lr(), scheduler.weight_decay(), scaler, dec_lr);
    consumed += iter_gbs;
    interval_samples += iter_gbs;
    interval_flops += flops_per_iteration(fm, iter_gbs);
    ++interval_iters;
    if (step.skipped) {
      ++interval_skipped;
      ++sum.skipped_iterations;
      if (!std::isfinite(loss)) ++interval_nan;
      if (!a.fp16 && !std::isfinite(loss))
        MG_THROW("loss is ", loss, " at iteration ", it,
                 " (NaN/Inf); lower --lr or check the data");
    } else {
      scheduler.step(iter_gbs);  // Megatron: num_microbatches x micro-batch x DP samples
      ++interval_advanced;
      interval_loss += loss;
      interval_gn = step.grad_norm;
    }
    // Megatron logs the optimizer's learning rate after the scheduler step: the rate of the next
    // iteration (the same one after a skipped step).
    const double logged_lr = scheduler.lr();
    const double logged_dec_lr = sc.has_decoupled_lr() ? scheduler.decoupled_lr() : std::nan("");
    sum.last_loss = loss;
    sum.iterations = it;
    sum.consumed_samples = consumed;
    sum.losses.push_back(loss);
    sum.grad_norms.push_back(step.skipped ? std::nan("") : step.grad_norm);
    tensorboard.log_iteration({it, consumed, logged_lr, iter_gbs,
                               step.skipped ? std::nullopt : std::optional<double>(loss),
                               scaler.scale(),
                               step.skipped ? std::nullopt : std::optional<double>(step.grad_norm),
                               world.size()});

    if (it % a.log_interval == 0 || it == train_iters) {
      const double secs = seconds_since(interval_t0);
      IntervalStats s;
      s.iteration = it;
      s.train_iters = train_iters;
      s.consumed_samples = consumed;
      s.elapsed_ms_per_iter = secs * 1000.0 / double(interval_iters);
      s.log_throughput = a.log_throughput;
      s.tflops_per_device = interval_flops / secs / 1e12 / world.size();
      s.learning_rate = logged_lr;
      if (sc.has_decoupled_lr()) s.decoupled_learning_rate = logged_dec_lr;
      s.global_batch_size = iter_gbs;
      s.lm_loss = interval_advanced > 0 ? interval_loss / double(interval_advanced) : loss;
      s.loss_scale = scaler.scale();
      s.grad_norm = interval_gn;
      s.skipped_iterations = interval_skipped;
      s.nan_iterations = interval_nan;
      s.tokens_per_second = double(interval_samples * a.model.seq_length) / secs;
      const double comm_ms = (comm_stats->seconds - interval_comm0) * 1000.0 / double(interval_iters);
      say(format_log_line(s));
      if (jsonl.is_open()) {
        jsonl << "{\"iteration\": " << it << ", \"consumed_samples\": " << consumed
              << ", \"lm_loss\": " << s.lm_loss << ", \"learning_rate\": " << logged_lr
              << ", \"loss_scale\": " << s.loss_scale << ", \"grad_norm\": "
              << (std::isnan(interval_gn) ? std::string("null") : str(std::setprecision(17), interval_gn))
              << ", \"ms_per_iteration\": " << s.elapsed_ms_per_iter
              << ", \"tokens_per_second\": " << s.tokens_per_second
              << ", \"comm_ms_per_iteration\": " << comm_ms << ", \"world_size\": " << world.size()
              << ", \"skipped_iterations\": " << interval_skipped << "}\n";
        jsonl.flush();
      }
      tensorboard.log_interval(it, secs / double(interval_iters),
                               a.log_throughput ? std::optional<double>(s.tflops_per_device)
                                                : std::nullopt);
      interval_iters = interval_advanced = interval_skipped = interval_nan = interval_samples = 0;
      interval_flops = 0;
      interval_loss = 0;
      interval_gn = std::nan("");
      interval_t0 = Clock::now();
      interval_comm0 = comm_stats->seconds;
    }
    if (ds.valid && a.eval_iters > 0 && it % a.eval_interval == 0) {
      finish_param_sync();
      const auto [vloss, vtokens] = evaluate(*ds.valid, consumed_valid);
      if (vtokens > 0) {
        print_evaluation(format_validation_line(it, vloss / vtokens));
        tensorboard.log_validation(it, consumed, vloss / vtokens);
        sum.valid_losses.push_back(vloss / vtokens);
      }
      interval_t0 = Clock::now();
    }
    if (a.save_interval > 0 && it % a.save_interval == 0) save(it);
    if (a.exit_interval > 0 && it % a.exit_interval == 0) {
      say(str("exiting program at iteration ", it, " (--exit-interval)"));
      exited_early = true;
      break;
    }
    // Time and signals differ between ranks: MAX over the world, so all stop together.
    float stop[2] = {
        a.exit_duration_in_mins > 0 && seconds_since(t_start) / 60.0 > a.exit_duration_in_mins ? 1.f : 0.f,
        g_exit_signal.load() ? 1.f : 0.f};
    if (distributed && (a.exit_duration_in_mins > 0 || a.exit_signal_handler)) {
      Tensor t = Tensor::from_vector(std::vector<float>{stop[0], stop[1]}, {2});
      world.all_reduce(t, ReduceOp::Max);
      stop[0] = t.data<float>()[0];
      stop[1] = t.data<float>()[1];
    }
    if (stop[0] > 0) {
      say(str("exiting program after ", a.exit_duration_in_mins, " minutes at iteration ", it,
              " (--exit-duration-in-mins)"));
      exited_early = true;
      break;
    }
    if (stop[1] > 0) {
      say(str("exiting program at iteration ", it, " on a termination signal"));
      exited_early = true;
      break;
    }
  }
  finish_param_sync();  // no gather outlives the loop: the caller may read the parameters
  const int64_t ran = sum.iterations - start_iteration;
  if (ran > 0) save(sum.iterations);  // also after --exit-interval/-duration and a signal
  const double total = seconds_since(loop_t0);
  sum.seconds_per_iteration = ran > 0 ? total / double(ran) : 0;
  sum.tokens_per_second = total > 0 ? double((consumed - consumed_at_start) * a.model.seq_length) / total : 0;
  sum.comm_seconds = comm_stats->seconds;
  if (buffer) {
    sum.grad_buckets = int(buffer->layout().buckets.size());
    sum.grad_buckets_launched_in_backward = std::max(launched_in_backward, 0);
  }
  // Megatron exits without the final evaluation when the loop was stopped early.
  if (!exited_early) final_evaluation(sum.iterations, consumed_valid, sum);
  return sum;
}

}  // namespace megatron::training
