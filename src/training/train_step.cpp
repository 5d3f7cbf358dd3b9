// One training iteration, evaluation and the checkpoint save of pretrain_gpt (training_run.h).
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "kernels/ops.h"
#include "pipeline/forward_backward.h"
#include "training/metrics.h"
#include "training/torch_checkpoint.h"
#include "training/training_run.h"

namespace megatron::training {

namespace {

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

double mask_sum(const Tensor& mask) { return ops::sum(mask); }  // on the model's device

}  // namespace

StepOutcome train_step(TrainingRun& r, int64_t iteration, int64_t micro_batches) {
  const TrainingArgs& a = r.a;
  const int dp = r.dp(), dp_rank = r.ps.dp_rank();
  r.optimizer->zero_grad();
  // This DP rank's micro-batches: global micro-batch m * DP + dp_rank of the iteration.
  std::vector<model::GPTInputs> batches;
  std::vector<double> microbatch_tokens;  // loss tokens of each micro-batch (this CP slice)
  double local_tokens = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    batches.push_back(r.slice(data::make_batch(*r.ds.train, r.consumed + m * r.mbs * dp, r.mbs,
                                               dp_rank, dp, r.bopt)));
    microbatch_tokens.push_back(mask_sum(batches.back().loss_mask));
    local_tokens += microbatch_tokens.back();
  }
  const double tokens = r.dp_cp_sum({local_tokens})[0];  // loss tokens of the global batch
  // The loss whose gradient the step takes (trainer.h), times the loss scale:
  // --calculate-per-token-loss: sum of loss over the global batch / its loss tokens (Megatron's
  // finalize_model_grads divides by the tokens summed over DP x CP); default: each micro-batch's
  // loss sum / max(its loss tokens, 1) / micro-batches (Megatron's forward_step), and
  // 1 / (DP x CP) as Megatron's gradient_scaling_factor before the sum.
  const double scale = r.scaler.scale();
  pipeline::ForwardBackwardOptions fb;
  if (!a.calculate_per_token_loss)
    for (double t : microbatch_tokens)
      fb.microbatch_grad_scale.push_back(
          float(scale / (std::max(t, 1.0) * double(micro_batches) * double(r.dp_cp))));
  fb.grad_scale = float(scale / std::max(tokens, 1.0));
  // Megatron's forward_backward_func: the schedule over this DP rank's micro-batches, whose
  // dropout keys are m * DP + dp_rank; it finalises the model-parallel grads (partial sums over
  // TP, tied embedding over the embedding group) and gives every stage the loss. With overlap it
  // hands each chunk's parameters to the buffer during the chunk's last micro-batch backward
  // (their TP sums done), the tied embedding after the flush.
  fb.dropout_offset = r.dropout_offset + uint64_t(dp_rank);
  fb.dropout_offset_stride = uint64_t(dp);
  StepOutcome out;
  optim::ParamAndGradBuffer* buffer = r.buffer.get();
  if (a.parallel.overlap_grad_reduce && buffer != nullptr) {
    fb.grad_ready = [buffer](const model::ParameterList& ready) { buffer->register_grads_ready(ready); };
    fb.progress = [buffer, &out] {  // after every pass: MPI advances the launched reductions
      buffer->progress();
      out.buckets_launched_in_backward = buffer->launched_buckets();
    };
  }
  maybe_inject_fault(r.ps.world_rank(), iteration);
  double loss_sum = pipeline::forward_backward(*r.model, batches, fb).loss_sum;
  r.dropout_offset += uint64_t(micro_batches * dp);
  if (buffer != nullptr) {
    buffer->finish_grad_sync();
  } else if (a.bf16 && a.grad_reduce_in_bf16) {
    // One rank, no reduction: Megatron's bf16 main-grad buffer still holds bf16 values.
    for (const model::Parameter* p : r.params) {
      Tensor h = Tensor::empty(p->grad.shape(), DType::BF16, p->grad.device());
      ops::cast(h, p->grad);
      ops::cast(p->grad, h);
    }
  }
  loss_sum = r.dp_cp_sum({loss_sum})[0];
  out.loss = loss_sum / std::max(tokens, 1.0);
  const optim::LRScheduler& s = *r.scheduler;
  out.step = r.optimizer->step(s.lr(), s.weight_decay(), r.scaler,
                               s.config().has_decoupled_lr() ? s.decoupled_lr() : std::nan(""));
  return out;
}

std::pair<double, double> evaluate(TrainingRun& r, const data::SampleDataset& d,
                                   int64_t& consumed_eval) {
  // Under PP the forward-only schedule per evaluation iteration (the loss comes from the last
  // stage to every stage); interleaved, only whole iterations (M stays a multiple of PP).
  r.finish_param_sync();
  const int dp = r.dp();
  double vloss = 0, vtokens = 0;
  for (int64_t e = 0; e < r.a.eval_iters; ++e) {
    if (r.pipeline_layout.num_chunks > 1 && consumed_eval + r.num_micro * r.mbs * dp > d.size()) break;
    std::vector<model::GPTInputs> group;
    for (int64_t m = 0; m < r.num_micro; ++m) {
      if (consumed_eval + r.mbs * dp > d.size()) break;
      group.push_back(r.slice(data::make_batch(d, consumed_eval, r.mbs, r.ps.dp_rank(), dp, r.bopt)));
      consumed_eval += r.mbs * dp;
    }
    if (!group.empty()) {
      pipeline::ForwardBackwardOptions fb;
      fb.forward_only = true;
      const pipeline::ForwardBackwardResult res = pipeline::forward_backward(*r.model, group, fb);
      vloss += res.loss_sum;
      vtokens += res.num_tokens;
    }
    if (int64_t(group.size()) < r.num_micro) break;  // the split ran out
  }
  const std::vector<double> v = r.dp_cp_sum({vloss, vtokens});
  return {v[0], v[1]};
}

void print_evaluation(const TrainingRun& r, const std::string& line) {
  const std::string dashes(line.size(), '-');
  r.say(dashes);
  r.say(line);
  r.say(dashes);
}

void final_evaluation(TrainingRun& r, int64_t iteration, int64_t valid_from, TrainingSummary& sum) {
  if (r.a.eval_iters <= 0) return;
  if (r.ds.valid) {
    const auto [l, t] = evaluate(r, *r.ds.valid, valid_from);
    if (t > 0) {
      print_evaluation(r, format_evaluation_line(str("iteration ", iteration, " on validation set"), l / t));
      sum.valid_losses.push_back(l / t);
    }
  }
  if (r.ds.test) {
    int64_t from = 0;
    const auto [l, t] = evaluate(r, *r.ds.test, from);
    if (t > 0) {
      print_evaluation(r, format_evaluation_line(str("iteration ", iteration, " on test set"), l / t));
      sum.test_loss = l / t;
    }
  }
}

void save_checkpoint_at(TrainingRun& r, int64_t it) {
  const TrainingArgs& a = r.a;
  if (a.save.empty() || r.last_saved == it) return;
  r.finish_param_sync();  // the parameters of the last step are complete on every rank
  CheckpointState st;
  st.iteration = it;
  st.consumed_train_samples = r.consumed;
  st.consumed_valid_samples = r.consumed_valid;
  st.grad_scaler = r.scaler.state();
  st.grad_scaler_dynamic = r.scaler.is_dynamic();
  st.scheduler = r.scheduler->config();
  st.scheduler_num_steps = r.scheduler->num_steps();
  if (!a.no_save_rng) st.rng = RngState{r.rng_seed, r.dropout_offset};
  st.args = training_args_to_json(a);
  optim::MegatronOptimizer* saved = a.no_save_optim ? nullptr : r.optimizer.get();
  std::filesystem::path dir;
  if (a.ckpt_format == "torch") {
    TorchSaveOptions to;
    to.transformer_impl = a.transformer_impl;
    dir = save_torch_checkpoint(a.save, st, r.params, saved, r.crank, to);
  } else {
    dir = save_checkpoint(a.save, st, r.params, saved, r.crank);
  }
  r.say(str("saved checkpoint at iteration ", it, " to ", dir.string()));
  r.last_saved = it;
}

}  // namespace megatron::training
