// Single-rank pretraining loop; see trainer.h.
#include "training/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "optim/grad_scaler.h"
#include "training/checkpoint.h"
#include "training/metrics.h"

namespace megatron::training {

namespace {

std::atomic<bool> g_exit_signal{false};
extern "C" void on_exit_signal(int) { g_exit_signal.store(true); }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

model::GPTInputs to_inputs(const data::GPTBatch& b) {
  return model::GPTInputs{b.tokens, b.position_ids, b.attention_start, b.labels, b.loss_mask};
}

double mask_sum(const Tensor& mask) {
  double s = 0;
  const float* p = mask.data<float>();
  for (int64_t i = 0; i < mask.numel(); ++i) s += p[i];
  return s;
}

}  // namespace

void validate_args(const TrainingArgs& a) {
  MG_REQUIRE(a.micro_batch_size > 0, "--micro-batch-size is required and must be > 0");
  const int64_t gbs = a.global_batch_size > 0 ? a.global_batch_size : a.micro_batch_size;
  MG_REQUIRE(gbs % a.micro_batch_size == 0, "--global-batch-size (", gbs,
             ") must be divisible by --micro-batch-size (", a.micro_batch_size,
             ") x data-parallel size (1)");
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
  MG_REQUIRE((a.train_iters > 0) != (a.train_samples > 0),
             "give exactly one of --train-iters and --train-samples");
  if (a.train_iters > 0) {
    MG_REQUIRE(a.lr_decay_samples == 0 && a.lr_warmup_samples == 0 && a.lr_wsd_decay_samples == 0,
               "iteration-based training (--train-iters) cannot use --lr-decay-samples, "
               "--lr-warmup-samples or --lr-wsd-decay-samples; use the -iters flags");
  } else {
    MG_REQUIRE(a.lr_decay_iters == 0 && a.lr_warmup_iters == 0 && a.lr_wsd_decay_iters == 0,
               "sample-based training (--train-samples) cannot use --lr-decay-iters, "
               "--lr-warmup-iters or --lr-wsd-decay-iters; use the -samples flags");
  }
  MG_REQUIRE(a.lr >= 0 || (a.use_checkpoint_opt_param_scheduler && !a.load.empty()),
             "--lr is required (unless --load with --use-checkpoint-opt_param-scheduler)");
  MG_REQUIRE(a.lr < 0 || a.min_lr <= a.lr, "--min-lr (", a.min_lr, ") must be <= --lr (", a.lr, ")");
  MG_REQUIRE(a.lr_warmup_fraction < 0 || (a.lr_warmup_iters == 0 && a.lr_warmup_samples == 0),
             "--lr-warmup-fraction cannot be combined with --lr-warmup-iters/--lr-warmup-samples");
  MG_REQUIRE(a.lr_warmup_fraction < 0 || a.lr_warmup_fraction <= 1.0,
             "--lr-warmup-fraction must be in [0, 1]");
  MG_REQUIRE(!a.data.data_path.empty() || !a.data.train_data_path.empty(),
             "--data-path (or --train-data-path) is required");
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
}

TrainingSummary pretrain_gpt(TrainingArgs a) {
  validate_args(a);
  const auto t_start = Clock::now();
  const int64_t mbs = a.micro_batch_size;
  const int64_t gbs = a.global_batch_size > 0 ? a.global_batch_size : mbs;
  const int64_t num_micro = gbs / mbs;

  auto tokenizer = data::build_tokenizer(a.tokenizer);
  a.model.padded_vocab_size =
      data::padded_vocab_size(tokenizer->vocab_size(), a.make_vocab_size_divisible_by, 1);
  a.model.params_dtype = a.bf16 ? DType::BF16 : (a.fp16 ? DType::F16 : DType::F32);
  a.data.seq_length = a.model.seq_length;
  a.data.seed = uint32_t(a.seed);
  a.data.tokenizer = tokenizer->type();
  a.data.eod_id = tokenizer->eod_or_throw();

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
      log_print(str("WARNING: --load ", a.load, why,
                    "; no checkpoint is loaded and training starts from random initialization"));
    }
  }
  // A resume continues iteration, samples, optimizer, scheduler and RNG; --finetune (and a
  // "release" checkpoint) loads the weights only.
  const bool resume = ckpt && !ckpt->release && !a.finetune;
  const bool load_optim = resume && !a.no_load_optim;
  const bool load_rng = resume && !a.no_load_rng;
  if (ckpt) {
    log_print(str("loading checkpoint from ", a.load, " at iteration ", ckpt->state.iteration));
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

  const int64_t train_iters = a.train_iters > 0 ? a.train_iters : (a.train_samples + gbs - 1) / gbs;
  const int64_t train_samples = a.train_samples > 0 ? a.train_samples : a.train_iters * gbs;
  auto num_samples = data::train_valid_test_num_samples(a.train_samples > 0 ? a.train_samples : -1,
                                                        a.train_iters, gbs, a.eval_interval,
                                                        a.eval_iters);
  data::GPTDatasets ds = data::build_gpt_datasets(a.data, num_samples);
  MG_REQUIRE(ds.train != nullptr, "the training split is empty; check --split / --data-path");
  const data::GPTBatchOptions bopt = data::batch_options(a.data);

  // LR schedule in samples (iteration flags x global batch).
  optim::LRSchedulerConfig sc;
  sc.max_lr = a.lr;
  sc.min_lr = a.min_lr;
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
  model::GPTModel gpt(a.model, rng_seed);
  if (ckpt) load_model_weights(*ckpt, gpt.parameters(), /*allow_dtype_conversion=*/!resume);
  a.optimizer.type = optim::parse_optimizer_type(a.optimizer_name);
  optim::Optimizer opt(gpt.parameters(), a.optimizer);  // fp32 main copies of the loaded weights
  optim::GradScaler scaler =
      a.fp16 ? (a.loss_scale > 0 ? optim::GradScaler::constant(a.loss_scale)
                                 : optim::GradScaler::dynamic(a.initial_loss_scale, a.min_loss_scale,
                                                              a.loss_scale_window, a.hysteresis))
             : optim::GradScaler::constant(a.loss_scale > 0 && !a.bf16 ? a.loss_scale : 1.0);
  if (load_optim) {  // Megatron restores loss scaler and LR schedule together with the optimizer
    load_optimizer_state(*ckpt, opt);
    if (scaler.is_dynamic() && ckpt->state.grad_scaler_dynamic) scaler.load_state(ckpt->state.grad_scaler);
    sc = resolve_scheduler_config(sc, *ckpt, a.override_opt_param_scheduler,
                                  a.use_checkpoint_opt_param_scheduler);
  }
  MG_REQUIRE(sc.max_lr >= 0, "--lr is required (no LR schedule was loaded from a checkpoint)");
  optim::LRScheduler scheduler(sc);
  if (load_optim) scheduler.set_num_steps(ckpt->state.scheduler_num_steps);
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
    log_print(str("successfully loaded checkpoint from ", a.load, " at iteration ",
                  ckpt->state.iteration, " (", what, ")"));
  }

  if (a.exit_signal_handler) {
    std::signal(SIGTERM, on_exit_signal);
    std::signal(SIGINT, on_exit_signal);
  }
  std::ofstream jsonl;
  if (!a.metrics_jsonl.empty()) {
    jsonl.open(a.metrics_jsonl, std::ios::app);
    MG_REQUIRE(jsonl.good(), "--log-metrics-jsonl: cannot open ", a.metrics_jsonl, " for writing");
    jsonl << std::setprecision(17);  // round-trip exact: resumed runs compare bitwise
  }
  FlopsModel fm{a.model.num_layers, a.model.hidden_size, a.model.num_attention_heads,
                a.model.kv_channels, a.model.num_query_groups, a.model.ffn(), a.model.seq_length,
                a.model.padded_vocab_size, false};
  const double flops_iter = flops_per_iteration(fm, gbs);
  TrainingTensorBoard tensorboard(a.tensorboard);

  TrainingSummary sum;
  sum.start_iteration = sum.iterations = start_iteration;
  sum.consumed_samples = consumed;
  int64_t interval_iters = 0, interval_advanced = 0, interval_skipped = 0, interval_nan = 0;
  double interval_loss = 0, interval_gn = std::nan("");
  auto interval_t0 = Clock::now();
  const auto loop_t0 = Clock::now();

  int64_t last_saved = -1;
  auto save = [&](int64_t it) {
    if (a.save.empty() || last_saved == it) return;
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
    const auto dir = save_checkpoint(a.save, st, gpt.parameters(), a.no_save_optim ? nullptr : &opt);
    log_print(str("saved checkpoint at iteration ", it, " to ", dir.string()));
    last_saved = it;
  };

  if (start_iteration >= train_iters)
    log_print(str("the checkpoint is at iteration ", start_iteration, ", at or past the ",
                  train_iters, " training iterations asked for: nothing to train"));
  for (int64_t it = start_iteration + 1; it <= train_iters; ++it) {
    opt.zero_grad();
    std::vector<data::GPTBatch> batches;
    double tokens = 0;
    for (int64_t m = 0; m < num_micro; ++m) {
      batches.push_back(data::make_batch(*ds.train, consumed + m * mbs, mbs, 0, 1, bopt));
      tokens += mask_sum(batches.back().loss_mask);
    }
    const float grad_scale = float(scaler.scale() / std::max(tokens, 1.0));
    double loss_sum = 0;
    for (int64_t m = 0; m < num_micro; ++m) {
      model::LossResult r = gpt.forward_backward(to_inputs(batches[size_t(m)]), grad_scale,
                                                 dropout_offset + uint64_t(m));
      loss_sum += r.loss_sum;
    }
    dropout_offset += uint64_t(num_micro);
    const double loss = loss_sum / std::max(tokens, 1.0);
    optim::StepResult step = opt.step(scheduler.lr(), scheduler.weight_decay(), scaler);
    const double used_lr = scheduler.lr();
    consumed += gbs;
    ++interval_iters;
    if (step.skipped) {
      ++interval_skipped;
      ++sum.skipped_iterations;
      if (!std::isfinite(loss)) ++interval_nan;
      if (!a.fp16 && !std::isfinite(loss))
        MG_THROW("loss is ", loss, " at iteration ", it,
                 " (NaN/Inf); lower --lr or check the data");
    } else {
      scheduler.step(gbs);
      ++interval_advanced;
      interval_loss += loss;
      interval_gn = step.grad_norm;
    }
    sum.last_loss = loss;
    sum.iterations = it;
    sum.consumed_samples = consumed;
    tensorboard.log_iteration({it, consumed, used_lr, gbs,
                               step.skipped ? std::nullopt : std::optional<double>(loss),
                               scaler.scale(),
                               step.skipped ? std::nullopt : std::optional<double>(step.grad_norm)});

    if (it % a.log_interval == 0 || it == train_iters) {
      const double secs = seconds_since(interval_t0);
      IntervalStats s;
      s.iteration = it;
      s.train_iters = train_iters;
      s.consumed_samples = consumed;
      s.elapsed_ms_per_iter = secs * 1000.0 / double(interval_iters);
      s.log_throughput = a.log_throughput;
      s.tflops_per_device = flops_iter / (secs / double(interval_iters)) / 1e12;
      s.learning_rate = used_lr;
      s.global_batch_size = gbs;
      s.lm_loss = interval_advanced > 0 ? interval_loss / double(interval_advanced) : loss;
      s.loss_scale = scaler.scale();
      s.grad_norm = interval_gn;
      s.skipped_iterations = interval_skipped;
      s.nan_iterations = interval_nan;
      s.tokens_per_second = double(interval_iters * gbs * a.model.seq_length) / secs;
      log_print(format_log_line(s));
      if (jsonl.is_open()) {
        jsonl << "{\"iteration\": " << it << ", \"consumed_samples\": " << consumed
              << ", \"lm_loss\": " << s.lm_loss << ", \"learning_rate\": " << used_lr
              << ", \"loss_scale\": " << s.loss_scale << ", \"grad_norm\": "
              << (std::isnan(interval_gn) ? std::string("null") : str(std::setprecision(17), interval_gn))
              << ", \"ms_per_iteration\": " << s.elapsed_ms_per_iter
              << ", \"tokens_per_second\": " << s.tokens_per_second
              << ", \"skipped_iterations\": " << interval_skipped << "}\n";
        jsonl.flush();
      }
      tensorboard.log_interval(it, secs / double(interval_iters),
                               a.log_throughput ? std::optional<double>(s.tflops_per_device)
                                                : std::nullopt);
      interval_iters = interval_advanced = interval_skipped = interval_nan = 0;
      interval_loss = 0;
      interval_gn = std::nan("");
      interval_t0 = Clock::now();
    }
    if (ds.valid && a.eval_iters > 0 && (it % a.eval_interval == 0 || it == train_iters)) {
      double vloss = 0, vtokens = 0;
      for (int64_t e = 0; e < a.eval_iters * num_micro; ++e) {
        if (consumed_valid + mbs > ds.valid->size()) break;
        data::GPTBatch b = data::make_batch(*ds.valid, consumed_valid, mbs, 0, 1, bopt);
        consumed_valid += mbs;
        model::LossResult r = gpt.forward_loss(to_inputs(b));
        vloss += r.loss_sum;
        vtokens += r.num_tokens;
      }
      if (vtokens > 0) {
        const std::string line = format_validation_line(it, vloss / vtokens);
        const std::string dashes(line.size(), '-');
        log_print(dashes);
        log_print(line);
        log_print(dashes);
        tensorboard.log_validation(it, consumed, vloss / vtokens);
      }
      interval_t0 = Clock::now();
    }
    if (a.save_interval > 0 && it % a.save_interval == 0) save(it);
    if (a.exit_interval > 0 && it % a.exit_interval == 0) {
      log_print(str("exiting program at iteration ", it, " (--exit-interval)"));
      break;
    }
    if (a.exit_duration_in_mins > 0 && seconds_since(t_start) / 60.0 > a.exit_duration_in_mins) {
      log_print(str("exiting program after ", a.exit_duration_in_mins,
                    " minutes at iteration ", it, " (--exit-duration-in-mins)"));
      break;
    }
    if (g_exit_signal.load()) {
      log_print(str("exiting program at iteration ", it, " on a termination signal"));
      break;
    }
  }
  const int64_t ran = sum.iterations - start_iteration;
  if (ran > 0) save(sum.iterations);  // also after --exit-interval/-duration and a signal
  const double total = seconds_since(loop_t0);
  sum.seconds_per_iteration = ran > 0 ? total / double(ran) : 0;
  sum.tokens_per_second = total > 0 ? double(ran * gbs * a.model.seq_length) / total : 0;
  return sum;
}

}  // namespace megatron::training
