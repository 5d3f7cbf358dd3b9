# An independent float64 PyTorch mixture-of-experts layer, written from Megatron-Core's
# megatron/core/transformer/moe/ definitions (router.py TopKRouter, moe_utils.py
# topk_routing_with_score_function / group_limited_topk / apply_router_token_dropping /
# switch_load_balancing_loss_func / z_loss_func / MoEAuxLossAutoScaler / permute / unpermute /
# sinkhorn, router.py's _apply_aux_loss / _apply_seq_aux_loss / _apply_global_aux_loss /
# sinkhorn_load_balancing, experts.py SequentialMLP, shared_experts.py with its gate),
# differentiated by autograd.
#
# Usage: moe_reference.py DIR. DIR/config.json holds the settings; DIR/in.bin the float64 arrays
# x [M*N, h] (M micro-batches of N tokens, each `sequences` sequences of N/sequences tokens, rows
# b*S + s), the output gradient g [M*N, h], the shared expert's gate [1, h] (when configured), the
# router weight [E, h], each expert's fc1 [F1, h] and fc2 [h, F], the shared expert's fc1 and fc2
# (when configured) and the expert bias [E] (when enabled). Writes DIR/out.bin: y [M*N, h], dx,
# d gate, d router weight, each expert's d fc1 and d fc2, the shared expert's, the logged
# load-balancing loss (of the configured type) and z_loss summed over the micro-batches, tokens
# per expert [E] summed over them.
#
# The loss differentiated is sum(y * g), with the auxiliary losses' gradients injected at
# aux_grad_scale as MoEAuxLossAutoScaler does (their values do not enter it). global_aux_loss
# accumulates the token counts over the micro-batches (one data-parallel rank) as the router's
# global_tokens_per_expert / ga_steps do.
# Ties: torch.topk's order among equal values is unspecified; the "position" drop policy keeps an
# expert's earliest tokens (the policy's meaning), here by a stable sort.
import json
import math
import os
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
D = sys.argv[1]
cfg = json.load(open(os.path.join(D, "config.json")))
N, h, E, k = cfg["tokens"], cfg["hidden"], cfg["experts"], cfg["topk"]
M, B = cfg["micro_batches"], cfg["sequences"]
S = N // B
balancing = cfg["balancing"]
F, Fs = cfg["ffn"], cfg["shared_ffn"]
gated = cfg["activation"] == "swiglu"
F1 = 2 * F if gated else F
flat = np.fromfile(os.path.join(D, "in.bin"), dtype=np.float64)
pos = 0


def take(*shape):
    global pos
    n = int(np.prod(shape))
    t = torch.tensor(flat[pos:pos + n].reshape(shape), requires_grad=True)
    pos += n
    return t


x_all = take(M * N, h)
g_all = take(M * N, h).detach()
gate_w = take(1, h) if cfg["shared_gate"] else None
router_w = take(E, h)
experts = [(take(F1, h), take(h, F)) for _ in range(E)]
shared = (take(2 * Fs if gated else Fs, h), take(h, Fs)) if Fs > 0 else None
expert_bias = take(E).detach() if cfg["expert_bias"] else None
assert pos == flat.size, (pos, flat.size)


class MoEAuxLossAutoScaler(torch.autograd.Function):
    scale = cfg["aux_grad_scale"]

    @staticmethod
    def forward(ctx, output, aux_loss):
        ctx.save_for_backward(aux_loss)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (aux_loss,) = ctx.saved_tensors
        return grad_output, torch.ones_like(aux_loss) * MoEAuxLossAutoScaler.scale


def sinkhorn(cost, tol=0.0001):
    cost = torch.exp(cost)
    d0 = torch.ones(cost.size(0), dtype=cost.dtype)
    d1 = torch.ones(cost.size(1), dtype=cost.dtype)
    eps = 0.00000001
    error = 1e9
    d1_old = d1
    while error > tol:
        d0 = (1 / d0.size(0)) * 1 / (torch.sum(d1 * cost, 1) + eps)
        d1 = (1 / d1.size(0)) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + eps)
        error = torch.mean(torch.abs(d1_old - d1))
        d1_old = d1
    return d1 * cost * d0.unsqueeze(1)


def sinkhorn_load_balancing(logits):
    # training: the choice from the Sinkhorn-normalised logits, the weights from the activation
    with torch.no_grad():
        _, indices = torch.topk(sinkhorn(logits), k=k, dim=1)
    act = torch.sigmoid(logits) if k == 1 else torch.softmax(logits, dim=-1)
    rmap = torch.zeros_like(logits).int().scatter(1, indices, 1).bool()
    return act * rmap, rmap


def group_limited_topk(scores, topk, num_groups, group_topk):
    group_scores = scores.view(N, num_groups, -1).topk(topk // group_topk, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(N, num_groups, E // num_groups).reshape(N, -1)
    masked = scores.masked_fill(~score_mask.bool(), float("-inf"))
    return torch.topk(masked, k=topk, dim=-1)


def compute_topk(scores):
    if cfg["group_topk"]:
        return group_limited_topk(scores, k, cfg["num_groups"], cfg["group_topk"])
    return torch.topk(scores, k=k, dim=1)


def topk_routing(logits):
    if cfg["score_function"] == "softmax":
        if cfg["pre_softmax"]:
            scores = torch.softmax(logits, dim=-1)
            probs, top = compute_topk(scores)
        else:
            scores, top = compute_topk(logits)
            probs = torch.softmax(scores, dim=-1)
    else:
        scores = torch.sigmoid(logits)
        if expert_bias is not None:
            _, top = compute_topk(scores + expert_bias)
            scores = torch.gather(scores, dim=1, index=top)
        else:
            scores, top = compute_topk(scores)
        probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else scores
    if cfg["scaling_factor"]:
        probs = probs * cfg["scaling_factor"]
    routing_probs = torch.zeros_like(logits).scatter(1, top, probs)
    routing_map = torch.zeros_like(logits).int().scatter(1, top, 1).bool()
    return routing_probs, routing_map


def token_dropping(probs, rmap):
    cap = math.ceil((N * k / E) * cfg["capacity_factor"])
    if cap > N:
        return probs, rmap
    if cfg["drop_policy"] == "probs":
        _, idx = torch.topk(probs, k=cap, dim=0, sorted=False)
    else:  # the earliest routed tokens of each expert
        idx = torch.argsort(rmap.int(), dim=0, descending=True, stable=True)[:cap]
    cap_mask = torch.zeros_like(probs).scatter(0, idx, 1).bool()
    final_map = cap_mask if cfg["pad_to_capacity"] else torch.logical_and(rmap, cap_mask)
    return probs * final_map, final_map


logged = {"load_balancing_loss": 0.0, "z_loss": 0.0}
global_tokens = torch.zeros(E)
ga_steps = 0


def switch_loss(scores, tokens_per_expert, total_num_tokens, coeff):
    return torch.sum(scores.sum(dim=0) * tokens_per_expert) * (
        E * coeff / (k * total_num_tokens * total_num_tokens))


def route(x):
    global ga_steps, global_tokens
    logits = x @ router_w.t()
    if cfg["z_loss_coeff"] > 0:
        z = torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * cfg["z_loss_coeff"]
        logits = MoEAuxLossAutoScaler.apply(logits, z)
        logged["z_loss"] += (z / cfg["z_loss_coeff"]).item()
    if balancing == "sinkhorn":
        probs, rmap = sinkhorn_load_balancing(logits)
    else:
        probs, rmap = topk_routing(logits)
    if cfg["capacity_factor"] > 0:
        probs, rmap = token_dropping(probs, rmap)
    coeff = cfg["aux_loss_coeff"]
    if coeff > 0 and balancing in ("aux_loss", "seq_aux_loss", "global_aux_loss"):
        if cfg["score_function"] == "softmax":
            scores = torch.softmax(logits, dim=-1)
        else:
            scores = torch.sigmoid(logits)
            scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
        _, top = torch.topk(scores, k=k, dim=1)
        loss_map = torch.zeros_like(logits).int().scatter(1, top, 1).bool()
        if balancing == "aux_loss":
            aux = switch_loss(scores, loss_map.sum(dim=0), N, coeff)
        elif balancing == "seq_aux_loss":
            # Megatron's tokens are [S, B]: reorder ours (rows b*S + s), then [S, B*E]
            sm = scores.view(B, S, E).transpose(0, 1).reshape(S, B * E)
            mm = loss_map.view(B, S, E).transpose(0, 1).reshape(S, B * E)
            aux = switch_loss(sm, mm.sum(dim=0), S, coeff) / B
        else:
            global_tokens = global_tokens + loss_map.sum(dim=0)
            ga_steps += 1
            aux = switch_loss(scores, global_tokens / ga_steps, N, coeff)
        probs = MoEAuxLossAutoScaler.apply(probs, aux)
        logged["load_balancing_loss"] += (aux / coeff).item()
    return probs, rmap


def act(hh):
    if gated:
        a, b = torch.chunk(hh, 2, dim=-1)
        return torch.nn.functional.silu(a) * b
    return torch.nn.functional.gelu(hh)


def mlp(inp, w1, w2):
    return act(inp @ w1.t()) @ w2.t()


# permute: expert-major, token order within an expert; unpermute: weighted scatter-add
ys, counts = [], torch.zeros(E)
for m in range(M):
    x = x_all[m * N:(m + 1) * N]
    probs, rmap = route(x)
    counts += rmap.sum(dim=0).double()
    y = torch.zeros(N, h)
    for e in range(E):
        rows = torch.nonzero(rmap[:, e]).flatten()
        if rows.numel() == 0:
            continue
        out = mlp(x[rows], *experts[e]) * probs[rows, e].unsqueeze(-1)
        y = y.index_add(0, rows, out)
    if shared is not None:
        sy = mlp(x, *shared)
        if gate_w is not None:
            sy = sy * torch.sigmoid(x @ gate_w.t())
        y = y + sy
    ys.append(y)
y = torch.cat(ys)
(y * g_all).sum().backward()

res = [y.detach().flatten(), x_all.grad.flatten()]
if gate_w is not None:
    res.append(gate_w.grad.flatten())
res.append(router_w.grad.flatten())
for w1, w2 in experts:
    for w in (w1, w2):
        res.append(w.grad.flatten() if w.grad is not None else torch.zeros(w.numel()))
if shared is not None:
    res += [shared[0].grad.flatten(), shared[1].grad.flatten()]
res.append(torch.tensor([logged["load_balancing_loss"], logged["z_loss"]]))
res.append(counts)
torch.cat(res).numpy().astype(np.float64).tofile(os.path.join(D, "out.bin"))
