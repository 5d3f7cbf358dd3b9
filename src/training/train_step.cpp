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
#include "training/torch_dist_write.h"
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
  std::vector<model::Batch> batches;
  std::vector<double> microbatch_tokens;  // loss tokens of each micro-batch (this CP slice)
  double local_tokens = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    batches.push_back(r.micro_batch(DataSplit::train, r.consumed + m * r.mbs * dp));
    microbatch_tokens.push_back(mask_sum(batches.back().loss_mask));
    local_tokens += microbatch_tokens.back();
  }
  // The loss whose gradient the step takes (trainer.h), times the loss scale:
  // --calculate-per-token-loss: sum of loss over the global batch / its loss tokens (Megatron's
  // finalize_model_grads divides by the tokens summed over DP x CP); default: each micro-batch's
  // loss sum / max(its loss tokens, 1) / micro-batches (Megatron's forward_step), and
  // 1 / (DP x CP) as Megatron's gradient_scaling_factor before the sum. A family whose loss is
  // already a mean per micro-batch (LossReduction::microbatch_mean, BERT's) is divided by the
  // micro-batches and DP x CP only, as Megatron's forward_step does with a scalar loss.
  const double scale = r.scaler.scale();
  pipeline::ForwardBackwardOptions fb;
  if (r.loss_reduction() == model::LossReduction::microbatch_mean) {
    fb.grad_scale = float(scale / (double(micro_batches) * double(r.dp_cp)));
  } else {
    const double tokens = r.dp_cp_sum({local_tokens})[0];  // loss tokens of the global batch
    if (!a.calculate_per_token_loss)
      for (double t : microbatch_tokens)
        fb.microbatch_grad_scale.push_back(
            float(scale / (std::max(t, 1.0) * double(micro_batches) * double(r.dp_cp))));
    fb.grad_scale = float(scale / std::max(tokens, 1.0));
  }
  // The MoE auxiliary losses' gradient factor (Megatron's MoEAuxLossAutoScaler): loss scale x CP /
  // micro-batches (forward_step_calc_loss's cp_size_for_scaling: each context-parallel rank's loss
  // is its tokens' share), then the 1 / (DP x CP) of the gradient average; under
  // --calculate-per-token-loss the router scales the loss by its micro-batch's tokens and the
  // gradients are divided by the global batch's loss tokens.
  if (a.model.num_moe_experts > 0) {
    const double tokens = a.calculate_per_token_loss ? r.dp_cp_sum({local_tokens})[0] : 0;
    for (const model::Batch& b : batches)
      fb.moe_aux_grad_scale.push_back(
          a.calculate_per_token_loss
              ? scale * double(b.tokens.numel()) / std::max(tokens, 1.0)
              : scale * double(r.ps.cp_size()) / (double(micro_batches) * double(r.dp_cp)));
  }
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
    fb.grad_ready = [buffer](const model::ParameterList& ready) {
      model::ParameterList mine;  // the expert buffer's are reduced after the backward
      for (model::Parameter* p : ready)
        if (buffer->holds(p)) mine.push_back(p);
      buffer->register_grads_ready(mine);
    };
    fb.progress = [buffer, &out] {  // after every pass: MPI advances the launched reductions
      buffer->progress();
      out.buckets_launched_in_backward = buffer->launched_buckets();
    };
  }
  maybe_inject_fault(r.ps.world_rank(), iteration);
  moe_step_begin(r);
  const pipeline::ForwardBackwardResult res = pipeline::forward_backward(*r.model, batches, fb);
  r.dropout_offset += uint64_t(micro_batches * dp);
  if (buffer != nullptr) {
    buffer->finish_grad_sync();
    if (r.expert_buffer) r.expert_buffer->finish_grad_sync();
  } else if (a.bf16 && a.grad_reduce_in_bf16) {
    // One rank, no reduction: Megatron's bf16 main-grad buffer still holds bf16 values.
    for (const model::Parameter* p : r.params) {
      Tensor h = Tensor::empty(p->grad.shape(), DType::BF16, p->grad.device());
      ops::cast(h, p->grad);
      ops::cast(p->grad, h);
    }
  }
  // The logged losses: each name's sum over micro-batches and DP x CP over its count.
  std::vector<double> sums = {res.loss_sum, res.num_tokens};
  for (const model::LossTerm& t : res.more) sums.insert(sums.end(), {t.sum, t.count});
  sums = r.dp_cp_sum(std::move(sums));
  out.loss = sums[0] / std::max(sums[1], 1.0);
  for (size_t k = 2; k + 1 < sums.size(); k += 2)
    out.more_losses.push_back(sums[k] / std::max(sums[k + 1], 1.0));
  MoeStepMetrics moe = moe_step_metrics(r, micro_batches);
  for (double v : moe.logged) out.more_losses.push_back(v);
  out.tensorboard_scalars = std::move(moe.per_layer);
  out.moe_tokens_per_expert = std::move(moe.tokens_per_expert);
  const optim::LRScheduler& s = *r.scheduler;
  out.step = r.optimizer->step(s.lr(), s.weight_decay(), r.scaler,
                               s.config().has_decoupled_lr() ? s.decoupled_lr() : std::nan(""));
  return out;
}

model::LossResult evaluate(TrainingRun& r, DataSplit split, int64_t& consumed_eval) {
  // Under PP the forward-only schedule per evaluation iteration (the loss comes from the last
  // stage to every stage); interleaved, only whole iterations (M stays a multiple of PP).
  r.finish_param_sync();
  const int dp = r.dp();
  const int64_t size = r.data->size(split);
  model::LossResult total;
  for (int64_t e = 0; e < r.a.eval_iters; ++e) {
    if (r.pipeline_layout.num_chunks > 1 && consumed_eval + r.num_micro * r.mbs * dp > size) break;
    std::vector<model::Batch> group;
    for (int64_t m = 0; m < r.num_micro; ++m) {
      if (consumed_eval + r.mbs * dp > size) break;
      group.push_back(r.micro_batch(split, consumed_eval));
      consumed_eval += r.mbs * dp;
    }
    if (!group.empty()) {
      pipeline::ForwardBackwardOptions fb;
      fb.forward_only = true;
      const pipeline::ForwardBackwardResult res = pipeline::forward_backward(*r.model, group, fb);
      total += model::LossResult{res.loss_sum, res.num_tokens, res.more};
    }
    if (int64_t(group.size()) < r.num_micro) break;  // the split ran out
  }
  total.more.resize(r.loss_names().size() - 1);
  std::vector<double> v = {total.loss_sum, total.num_tokens};
  for (const model::LossTerm& t : total.more) v.insert(v.end(), {t.sum, t.count});
  v = r.dp_cp_sum(std::move(v));
  total.loss_sum = v[0];
  total.num_tokens = v[1];
  for (size_t k = 0; k < total.more.size(); ++k) total.more[k] = {v[2 + 2 * k], v[3 + 2 * k]};
  return total;
}

void print_evaluation(const TrainingRun& r, const std::string& line) {
  const std::string dashes(line.size(), '-');
  r.say(dashes);
  r.say(line);
  r.say(dashes);
}

void final_evaluation(TrainingRun& r, int64_t iteration, int64_t valid_from, TrainingSummary& sum) {
  if (r.a.eval_iters <= 0) return;
  if (r.data->has(DataSplit::valid)) {
    const model::LossResult l = evaluate(r, DataSplit::valid, valid_from);
    if (l.num_tokens > 0) {
      print_evaluation(r, format_evaluation_line(str("iteration ", iteration, " on validation set"),
                                                 named_losses(r.loss_names(), l)));
      sum.valid_losses.push_back(l.loss_sum / l.num_tokens);
    }
  }
  if (r.data->has(DataSplit::test)) {
    int64_t from = 0;
    const model::LossResult l = evaluate(r, DataSplit::test, from);
    if (l.num_tokens > 0) {
      print_evaluation(r, format_evaluation_line(str("iteration ", iteration, " on test set"),
                                                 named_losses(r.loss_names(), l)));
      sum.test_loss = l.loss_sum / l.num_tokens;
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
  model::ParameterList params = r.params;
  for (model::Parameter* p : moe_checkpoint_buffers(r)) params.push_back(p);
  if (a.ckpt_format == "torch") {
    TorchSaveOptions to;
    to.transformer_impl = a.transformer_impl;
    to.distributed_optimizer = a.parallel.use_distributed_optimizer;
    dir = save_torch_checkpoint(a.save, st, params, saved, r.crank, to);
  } else if (a.ckpt_format == "torch_dist") {  // Megatron's format, given by name
    TorchSaveOptions to;
    to.transformer_impl = a.transformer_impl;
    dir = save_torch_dist_checkpoint(a.save, st, params, saved, r.crank, to);
  } else {
    dir = save_checkpoint(a.save, st, params, saved, r.crank);
  }
  r.say(str("saved checkpoint at iteration ", it, " to ", dir.string()));
  r.last_saved = it;
}

}  // namespace megatron::training
