#!/usr/bin/python3
"""PyTorch reference for `megatron evaluate` (tests/inference/evaluate_test.cpp).

Megatron-LM's zero-shot GPT evaluation (tasks/zeroshot_gpt: LAMBADA cloze accuracy, WikiText-103
perplexity) computed independently: the samples are built as Megatron's datasets build them
(padded to seq-length + 1 with the EOD id, the pad mask shifted to the labels, overlapping
windows), the text detokenized with Python's re, tokenized by tiktoken's GPT-2 encoding (node,
tiktoken_gpt2.mjs), and scored with the float64 GPT forward of generate_reference.py on the
weights of a megatron.cpp checkpoint (single-rank safetensors).

Usage: zeroshot_reference.py CKPT_DIR --task LAMBADA|WIKITEXT103 --file F --seq-length S
                             [--strict-lambada] [--overlapping-eval K]
Prints JSON {"correct", "total", "loss_sum", "num_tokenized_tokens", "num_original_tokens"}.
       zeroshot_reference.py --detokenize FILE
Prints JSON {"wiki", "ptb", "strip", "split"} of FILE's text (the detokenizers, str.strip and
str.split alone).
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

EOD = 50256  # GPT-2's <|endoftext|>


def read_checkpoint(load):
    import torch
    tracker = open(os.path.join(load, "latest_checkpointed_iteration.txt")).read().strip()
    folder = os.path.join(load, "release" if tracker == "release" else "iter_%07d" % int(tracker))
    args = json.load(open(os.path.join(folder, "metadata.json")))["args"]
    raw = open(os.path.join(folder, "mp_rank_00", "model.safetensors"), "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    weights = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", t["dtype"]
        a, b = t["data_offsets"]
        data = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(t["shape"])
        weights[name] = torch.from_numpy(data.astype(np.float64))
    m = args["model"]
    assert m.get("normalization", "LayerNorm") == "LayerNorm" and \
        m.get("position_embedding_type", "learned_absolute") == "learned_absolute", \
        "the zero-shot reference scores GPT-2-style models"
    heads = m["num_attention_heads"]
    cfg = {
        "num_layers": m["num_layers"],
        "num_attention_heads": heads,
        "num_query_groups": m.get("num_query_groups") or heads,
        "kv_channels": m.get("kv_channels") or m["hidden_size"] // heads,
        "layernorm_epsilon": m["layernorm_epsilon"],
        "normalization": "LayerNorm",
        "position_embedding_type": "LearnedAbsolute",
        "activation": {"gelu_tanh": "GeluTanh", "gelu": "Gelu"}[m["activation"]],
    }
    return cfg, weights


def tokenize(texts):
    """GPT-2 ids of each text (tiktoken through node)."""
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "in.jsonl"), os.path.join(d, "ids.bin")
        with open(src, "w") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        subprocess.run(["node", os.path.join(HERE, "tiktoken_gpt2.mjs"), "--out", out, src], check=True)
        raw = np.fromfile(out, dtype=np.uint32)
    ids, i = [], 0
    while i < raw.size:
        n = int(raw[i])
        ids.append([int(x) for x in raw[i + 1:i + 1 + n]])
        i += 1 + n
    assert len(ids) == len(texts)
    return ids


def wikitext_detokenizer(s):
    # The replacements of Megatron's tasks/zeroshot_gpt/detokenizer.py, in its order.
    s = s.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)
    for a, b in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", ".")):
        s = s.replace(a, b)
    for p in ":;.!?,":
        s = s.replace(" %s " % p, "%s " % p)
    for o, c in (("\\(", "\\)"), ("\\[", "\\]"), ("{", "}"), ('"', '"'), ("'", "'")):
        s = re.sub(o + r"\s*([^" + c + r"]*?)\s*" + c, o.replace("\\", "") + r"\1" + c.replace("\\", ""), s)
    for a, b in (("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" \u00b0 ", "\u00b0"),
                 (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        s = s.replace(a, b)
    return s


def ptb_detokenizer(s):
    for a, b in ((" '", "'"), (" \n", "\n"), ("\n ", "\n"), (" n't", "n't"), (" N ", "1 "),
                 ("$ 1", "$1"), ("# 1", "#1")):
        s = s.replace(a, b)
    return s


def lambada_samples(path, seq, strict):
    texts = [json.loads(line)["text"] for line in open(path, encoding="utf-8") if line.strip()]
    if strict:
        parts = []
        for t in texts:
            last = t.split()[-1]
            parts += [t[:t.rfind(last)].strip(), " " + last]
        ids = tokenize(parts)
        pairs = [(ids[2 * i], ids[2 * i + 1]) for i in range(len(texts))]
    else:
        pairs = [(t[:-1], [t[-1]]) for t in tokenize(texts)]
    samples = []
    for context, labels in pairs:
        tokens = context + labels
        mask = [0] * len(context) + [1] * len(labels)
        pad = seq + 1 - len(tokens)
        samples.append((tokens + [EOD] * pad, (mask + [0] * pad)[1:]))
    return samples


def wikitext_samples(path, seq, overlap):
    text = open(path, "rb").read().decode("utf-8")
    original = len(text.strip().split(" "))
    detok = ptb_detokenizer if "ptb" in path else wikitext_detokenizer
    tokens = tokenize([detok(text)])[0]
    overlap = max(1, overlap)
    count = max(math.ceil(max(len(tokens) - 1 - overlap, 0) / overlap) + 1, 1)
    samples = []
    for idx in range(count):
        window = tokens[idx * overlap:idx * overlap + seq + 1]
        mask = [1] * len(window) + [0] * (seq + 1 - len(window))
        window = window + [EOD] * (seq + 1 - len(window))
        mask = np.array(mask[1:])
        if overlap != seq and idx != 0:
            mask[:-overlap] = 0
        samples.append((window, list(mask)))
    return samples, len(tokens), original


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--detokenize":
        text = open(sys.argv[2], "rb").read().decode("utf-8")
        json.dump({"wiki": wikitext_detokenizer(text), "ptb": ptb_detokenizer(text),
                   "strip": text.strip(), "split": text.split()}, sys.stdout)
        return
    import torch
    import torch.nn.functional as F
    from generate_reference import forward
    torch.set_num_threads(1)
    p = argparse.ArgumentParser()
    p.add_argument("load")
    p.add_argument("--task", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--strict-lambada", action="store_true")
    p.add_argument("--overlapping-eval", type=int, default=32)
    a = p.parse_args()
    cfg, weights = read_checkpoint(a.load)
    ntok = norig = 0
    if a.task == "LAMBADA":
        samples = lambada_samples(a.file, a.seq_length, a.strict_lambada)
    else:
        samples, ntok, norig = wikitext_samples(a.file, a.seq_length, a.overlapping_eval)
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for tokens, mask in samples:
            t = torch.tensor([tokens], dtype=torch.long)
            logits = forward(cfg, weights, t[:, :-1])[0]
            labels, m = t[0, 1:], torch.tensor(mask, dtype=torch.bool)
            losses = F.cross_entropy(logits, labels, reduction="none")
            loss_sum += float(losses[m].sum())
            correct += int(bool((logits.argmax(-1)[m] == labels[m]).all()))
    json.dump({"correct": correct, "total": len(samples), "loss_sum": loss_sum,
               "num_tokenized_tokens": ntok, "num_original_tokens": norig}, sys.stdout)


if __name__ == "__main__":
    main()
