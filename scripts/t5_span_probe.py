#!/usr/bin/env python3
"""What a T5 checkpoint of `megatron pretrain-t5` does with the first word of each span, read into
the independent PyTorch T5 of tests/reference/t5_reference.py (float64, one process, no dropout).

  t5_span_probe.py CKPT_ITER_DIR VOCAB SAMPLES [DATA_PREFIX]

CKPT_ITER_DIR: iter_N of a one-rank checkpoint (metadata.json, mp_rank_00/model.safetensors);
VOCAB: the WordPiece vocabulary it was trained with; SAMPLES: `megatron inspect-data --dataset-type
t5 --format json` lines (the validation split, say). Prints, over the spans of the samples:
- teacher-forced, how often the decoder's most likely token after a sentinel is the span's first
  word, beside always predicting the most frequent first word and, given DATA_PREFIX (the
  `_text_sentence` dataset it was trained on, uint16 tokens), beside predicting the token that
  most often follows the one left of the span in the whole dataset (what a bigram model knows);
- for each decoder layer and head, the share of its cross-attention that a sentinel input puts on
  the encoder's same sentinel and on the token left of it (uniform would be 1 / encoder length);
- for each encoder layer and head, the share of a sentinel's self-attention on its left neighbour.
Needs PyTorch (Debian's python3-torch: run it with /usr/bin/python3)."""
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import t5_reference  # noqa: E402
from megatron_t5_checkpoint import read_safetensors  # noqa: E402


class RecordingTorch:
    """torch, with every softmax's result kept: t5_reference's attention probabilities, in call
    order (each encoder layer's self-attention, then each decoder layer's self- and cross-)."""

    def __init__(self):
        self.probs = []

    def softmax(self, x, dim):
        p = torch.softmax(x, dim=dim)
        self.probs.append(p)
        return p

    def __getattr__(self, name):
        return getattr(torch, name)


def bigram_guesses(prefix, vocab):
    """For each token, the token that most often follows it in PREFIX.bin, read in the dtype its
    Megatron index PREFIX.idx names."""
    import numpy as np
    dtypes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
    try:
        with open(prefix + ".idx", "rb") as f:
            header = f.read(18)
    except OSError as e:
        sys.exit(f"error: DATA_PREFIX {prefix}: {e}")
    if len(header) < 18 or not header.startswith(b"MMIDIDX") or header[17] not in dtypes:
        sys.exit(f"error: {prefix}.idx is not a Megatron indexed dataset of integer tokens")
    tokens = np.fromfile(prefix + ".bin", dtype=dtypes[header[17]]).astype(np.int64)
    if tokens.size and tokens.max() >= vocab:
        sys.exit(f"error: {prefix}.bin holds token {tokens.max()}, past the vocabulary ({vocab})")
    pairs = np.bincount(tokens[:-1] * vocab + tokens[1:], minlength=vocab * vocab)
    return pairs.reshape(vocab, vocab).argmax(axis=1)


def main(ckpt, vocab_path, samples_path, data_prefix=None):
    try:
        with open(os.path.join(ckpt, "metadata.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {ckpt} is not an iteration folder of a megatron checkpoint: {e}")
    cfg = dict(meta["args"]["model"])
    if cfg.get("model_family") != "t5":
        sys.exit(f"error: {ckpt} holds a {cfg.get('model_family')} model, not a T5")
    if meta["parallel"]["tensor_model_parallel_size"] != 1:
        sys.exit(f"error: {ckpt} is split over tensor-parallel ranks; merge it first with "
                 "`megatron checkpoint convert --target-tensor-parallel-size 1`")
    cfg.setdefault("kv_channels", 0)
    params = {k: v.to(torch.float64) for k, v in
              read_safetensors(os.path.join(ckpt, "mp_rank_00", "model.safetensors")).items()}
    with open(vocab_path, encoding="utf-8") as f:
        vocab = sum(1 for line in f if line.rstrip("\n"))
    first_sentinel = vocab + 2  # then [BOS], [EOS], <extra_id_0>, ... (BertWordPieceTokenizer)
    with open(samples_path) as f:
        samples = [json.loads(line) for line in f if line.startswith("{")]
    if not samples:
        sys.exit(f"error: no samples in {samples_path}")
    enc = torch.tensor([s["text_enc"] for s in samples])
    enc_mask = torch.tensor([s["enc_mask"] for s in samples])
    dec = torch.tensor([s["text_dec"] for s in samples])

    rec = RecordingTorch()
    t5_reference.torch = rec
    try:
        with torch.no_grad():
            logits = t5_reference.t5_logits(params, cfg, enc, enc_mask, dec)
    finally:
        t5_reference.torch = torch
    enc_layers = cfg["num_layers"]
    dec_layers = cfg["decoder_num_layers"] or enc_layers
    enc_att = rec.probs[:enc_layers]
    cross = [rec.probs[enc_layers + 2 * i + 1] for i in range(dec_layers)]

    pred = logits.argmax(-1)
    follower = bigram_guesses(data_prefix, vocab + 2) if data_prefix else None
    right = spans = bigram_right = 0
    firsts, predicted = collections.Counter(), collections.Counter()
    for i, s in enumerate(samples):
        labels, mask = s["labels"], s["loss_mask"]
        for j in range(len(labels) - 1):
            if mask[j] and mask[j + 1] and labels[j] >= first_sentinel and 0 <= labels[j + 1] < vocab:
                spans += 1
                right += int(pred[i, j + 1]) == labels[j + 1]
                firsts[labels[j + 1]] += 1
                left = s["text_enc"].index(labels[j]) - 1 if labels[j] in s["text_enc"] else -1
                if follower is not None and left >= 0 and s["text_enc"][left] < vocab:
                    bigram_right += int(follower[s["text_enc"][left]]) == labels[j + 1]
                predicted[int(pred[i, j + 1])] += 1
    if not spans:
        sys.exit(f"error: no spans in {samples_path} (samples of another vocabulary?)")
    print(f"teacher-forced first word of {spans} spans: right {100 * right / spans:.1f}% (always the "
          f"most frequent first word: {100 * firsts.most_common(1)[0][1] / spans:.1f}%); "
          f"{len(predicted)} distinct words predicted" +
          (f"; the most frequent follower of the token left of the span: "
           f"{100 * bigram_right / spans:.1f}%" if follower is not None else ""))

    def share(att, rows):  # mean attention per head over (sample, query row, key column) triples
        total = torch.zeros(att.shape[1], dtype=torch.float64)
        for i, q, k in rows:
            total += att[i, :, q, k]
        return ", ".join(f"{v:.2f}" for v in (total / max(len(rows), 1)).tolist())

    same, left, enc_left = [], [], []
    for i, s in enumerate(samples):
        text_enc = s["text_enc"]
        for q, t in enumerate(s["text_dec"]):
            if t >= first_sentinel and t in text_enc:
                p = text_enc.index(t)
                same.append((i, q, p))
                if p > 0:
                    left.append((i, q, p - 1))
        enc_left += [(i, p, p - 1) for p, t in enumerate(text_enc) if t >= first_sentinel and p > 0]
    for li, att in enumerate(cross):
        print(f"decoder layer {li + 1} cross-attention from a sentinel, per head: on the same "
              f"sentinel {share(att, same)}; on the token left of it {share(att, left)}")
    for li, att in enumerate(enc_att):
        print(f"encoder layer {li + 1} self-attention from a sentinel to its left neighbour, per "
              f"head: {share(att, enc_left)}")


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(*sys.argv[1:])
