#!/usr/bin/env python3
"""Continues a `megatron pretrain-t5` run in PyTorch, as an independent check of its training loop.

The model is t5_reference.py's transcription of Megatron-Core's T5Model (here in float32 unless
--float64); the step is Megatron-LM's: the loss of pretrain_t5.py (cross-entropy summed over the
loss mask, divided by the mask's sum in each micro-batch, averaged over the micro-batches by
schedules.forward_step; logged as all sums over all counts), the gradient clipped to 1.0
(--clip-grad 1.0) by its global L2 norm (clip_grad_norm_fp32: coefficient max_norm / (norm + 1e-6)
when below 1), Adam with decoupled weight decay (apex FusedAdam with adam_w_mode, betas 0.9 /
0.999, eps 1e-8; no weight decay on biases and 1-D parameters, as megatron/core/optimizer's
get_param_groups), and the learning rate of OptimizerParamScheduler.get_lr (linear warm-up from
lr_warmup_init, then linear or cosine decay to min_lr, counted in samples; iteration i uses the
rate of num_steps = (i - 1) * global batch, the scheduler stepping after the optimizer). A
checkpoint of iteration 1 whose rate was 0 (warm-up from 0) holds the initial weights: the run then
starts over at iteration 1.

Usage: t5_train_reference.py CKPT_ITER_DIR SAMPLES_JSONL ITERS [--float64]
  CKPT_ITER_DIR  a checkpoint of ours (iter_N: metadata.json, mp_rank_00/model.safetensors and
                 optimizer.safetensors), read for the weights, the Adam moments and step, the model
                 config and the LR schedule
  SAMPLES_JSONL  `megatron inspect-data --dataset-type t5 --format json --split-name train`
                 output, one training sample a line in the order training takes them
Prints one line per iteration N+1 .. ITERS: "iteration I lm loss L grad norm G learning rate R".
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from megatron_t5_checkpoint import read_safetensors  # noqa: E402
from t5_reference import t5_logits  # noqa: E402


def learning_rate(sched, num_steps):
    # OptimizerParamScheduler.get_lr for the constant-free styles the demo uses
    max_lr, min_lr = sched["max_lr"], sched["min_lr"]
    warmup, decay = sched["lr_warmup_steps"], sched["lr_decay_steps"]
    if warmup > 0 and num_steps <= warmup:
        init = sched["lr_warmup_init"]
        return init + (max_lr - init) * num_steps / warmup
    if num_steps > decay:
        return min_lr
    ratio = (num_steps - warmup) / (decay - warmup)
    style = sched["lr_decay_style"]
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    elif style == "constant":
        return max_lr
    else:
        sys.exit("unsupported --lr-decay-style %s" % style)
    return min_lr + coeff * (max_lr - min_lr)


def main(ckpt, samples_path, iters, dtype):
    meta = json.load(open(os.path.join(ckpt, "metadata.json")))
    args = meta["args"]
    cfg, sched = args["model"], meta["opt_param_scheduler"]
    gbs, mbs = args["global_batch_size"], args["micro_batch_size"]
    clip, wd = 1.0, sched["start_wd"]  # --clip-grad 1.0, Megatron's default
    model = read_safetensors(os.path.join(ckpt, "mp_rank_00", "model.safetensors"))
    optim = read_safetensors(os.path.join(ckpt, "mp_rank_00", "optimizer.safetensors"))
    names = [k for k in model if k != "output_layer.bias" or "output_layer.weight" not in model]
    P = {k: model[k].to(dtype).clone().requires_grad_(True) for k in names}
    decay = [P[k] for k in names if not (k.endswith(".bias") or P[k].dim() == 1)]
    no_decay = [P[k] for k in names if k.endswith(".bias") or P[k].dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=0.0, betas=(0.9, 0.999), eps=1e-8)
    start, step = meta["iteration"], int(optim["optimizer.step"])
    if start == 1 and learning_rate(sched, 0) == 0.0:
        # Iteration 1 ran at rate 0 (warm-up from 0): the weights are the initial ones, so the run
        # starts over from iteration 1 with Adam's moments of its own.
        start, step = 0, 0
    for k in names:
        if step > 0:
            opt.state[P[k]] = {
                "step": torch.tensor(float(step)),
                "exp_avg": optim["optimizer.state.exp_avg." + k].to(dtype).clone(),
                "exp_avg_sq": optim["optimizer.state.exp_avg_sq." + k].to(dtype).clone()}
    with open(samples_path) as f:
        samples = [json.loads(line) for _, line in zip(range(iters * gbs), f)]
    if len(samples) < iters * gbs:
        sys.exit("%s holds %d samples, %d iterations of %d need %d" %
                 (samples_path, len(samples), iters, gbs, iters * gbs))
    for it in range(start + 1, iters + 1):
        opt.zero_grad()
        loss_sum, tokens = 0.0, 0.0
        for mb in range((it - 1) * gbs, it * gbs, mbs):
            batch = samples[mb:mb + mbs]
            t = lambda key: torch.tensor([s[key] for s in batch], dtype=torch.int64)
            labels, loss_mask = t("labels"), t("loss_mask").to(dtype)
            logits = t5_logits(P, cfg, t("text_enc"), t("enc_mask"), t("text_dec"))
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                 labels.clamp(min=0).reshape(-1), reduction="none")
            mb_sum = torch.sum(ce * loss_mask.reshape(-1))
            # schedules.forward_step: each micro-batch's loss over its own tokens, averaged over
            # the micro-batches; the logged "lm loss" sums the sums and the token counts
            (mb_sum / loss_mask.sum() / (gbs // mbs)).backward()
            loss_sum, tokens = loss_sum + mb_sum.item(), tokens + loss_mask.sum().item()
        norm = torch.sqrt(sum(torch.sum(p.grad.double() ** 2) for p in P.values())).item()
        if clip > 0 and clip / (norm + 1e-6) < 1.0:
            for p in P.values():
                p.grad.mul_(clip / (norm + 1e-6))
        lr = learning_rate(sched, (it - 1) * gbs)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        print("iteration %d lm loss %.6e grad norm %.4f learning rate %.6e" %
              (it, loss_sum / tokens, norm, lr), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if len(sys.argv) not in (4, 5) or (len(sys.argv) == 5 and sys.argv[4] != "--float64"):
        sys.exit("usage: t5_train_reference.py CKPT_ITER_DIR SAMPLES_JSONL ITERS [--float64]")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
         torch.float64 if len(sys.argv) == 5 else torch.float32)
