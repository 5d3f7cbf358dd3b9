# Reference for tests/optim/optim_test.cpp: torch.optim.AdamW / SGD on a deterministic problem.
# Parameters p_i = sin(i) (two tensors, the second without weight decay); the gradient at step t
# (1-based) is g_i = 0.1 * cos(0.37 * i * t + 1). Prints the final parameters, one per line.
import math
import sys

import torch

kind = sys.argv[1]
steps = int(sys.argv[2])
n0, n1 = 7, 5
p0 = torch.tensor([math.sin(i) for i in range(n0)], dtype=torch.float32, requires_grad=True)
p1 = torch.tensor([math.sin(i + n0) for i in range(n1)], dtype=torch.float32, requires_grad=True)
groups = [{"params": [p0], "weight_decay": 0.1}, {"params": [p1], "weight_decay": 0.0}]
if kind == "adam":
    opt = torch.optim.AdamW(groups, lr=0.01, betas=(0.9, 0.95), eps=1e-8)
else:
    opt = torch.optim.SGD(groups, lr=0.01, momentum=0.9)
for t in range(1, steps + 1):
    p0.grad = torch.tensor([0.1 * math.cos(0.37 * i * t + 1) for i in range(n0)], dtype=torch.float32)
    p1.grad = torch.tensor([0.1 * math.cos(0.37 * (i + n0) * t + 1) for i in range(n1)],
                           dtype=torch.float32)
    opt.step()
for v in torch.cat([p0.detach(), p1.detach()]).tolist():
    print(repr(v))
