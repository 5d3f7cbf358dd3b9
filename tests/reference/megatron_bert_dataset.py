#!/usr/bin/python3
"""Reference for the BERT masked dataset: Megatron-LM's algorithm transcribed to Python with NumPy,
from megatron/core/datasets/bert_dataset.py (__getitem__, _get_token_mask), masked_dataset.py
(_build_sample_index, _create_masked_lm_predictions), helpers.cpp (build_mapping,
get_target_sample_len, the mt19937_64 shuffle, build_blending_indices),
blended_megatron_dataset_builder.py (splits, blends), megatron/training/tokenizer/tokenizer.py
(_BertWordPieceTokenizer's vocabulary: [BOS], [EOS], <extra_id_k> appended) and pretrain_bert.py
(masking_max_ngram 3, whole words, no permutation, no longer n-grams, no geometric lengths).
Per-sample randomness is numpy.random.RandomState, as Megatron uses it; the mapping's
std::mt19937 stream is NumPy's MT19937 with the same legacy seeding (raw 32-bit outputs) and
std::mt19937_64 is written out below from the C++ standard's parameters.

Reads one JSON request per line on stdin, writes one JSON answer per line:
  {"op": "samples", "vocab_file": F, "vocab_extra_ids": 0, "seq_length": S, "seed": s,
   "mask_prob": p, "short_seq_prob": q, "binary_head": true, "num_samples": [tr, va, te],
   "data_path": [...] | "train_data_path"/"valid_data_path"/"test_data_path": [...],
   "split": "969,30,1", "surplus": 0.005, "split_name": "train", "count": k}
      -> {"size": n, "samples": [dict, ...]}   the first k samples of that split
  {"op": "mapping", "prefix": P, "documents": [lo, hi], "num_samples": n | null,
   "max_length": L, "short_seq_prob": q, "seed": s, "min_sentences": m}
      -> {"rows": [[first, end, target], ...]}
  {"op": "cdf", "max_ngram": n}  -> {"cdf": [float.hex, ...]}   (RandomState.choice's bins)
  {"op": "draws", "seed": s, "calls": [["random"] | ["randint", lo, hi], ...]} -> {"values": [...]}
  {"op": "vocab", "vocab_file": F, "vocab_extra_ids": k}
      -> {"size": n, "cls": .., "sep": .., "pad": .., "mask": .., "bos": .., "eos": ..,
          "token_lookup": [...], "continuation": [ids whose token starts with "##"]}
  {"op": "time_mapping", ...mapping fields..., "repeat": r} -> {"seconds": best, "rows": n}
  {"op": "time_samples", "prefix": P, "documents": [lo, hi], "num_samples": n, "vocab_file": F,
   "seq_length": S, "seed": s, "mask_prob": p, "short_seq_prob": q, "binary_head": b, "count": k}
      -> {"seconds": t, "masked": m}   __getitem__ of samples 0 .. k-1 (the mapping not timed)
"""
import json
import math
import os
import re
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_indexed import IndexedDataset  # noqa: E402

LONG_SENTENCE_LEN = 512


class MT19937_64:
    """std::mt19937_64 (C++ [rand.predef]: w=64 n=312 m=156 r=31 a=0xb5026f5aa96619e9 u=29
    d=0x5555555555555555 s=17 b=0x71d67fffeda60000 t=37 c=0xfff7eee000000000 l=43
    f=6364136223846793005)."""
    N, M = 312, 156
    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.mt = [0] * self.N
        self.mt[0] = seed & self.MASK
        for i in range(1, self.N):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & self.MASK
        self.index = self.N

    def _twist(self):
        mt = self.mt
        upper, lower = 0xFFFFFFFF80000000, 0x7FFFFFFF
        for i in range(self.N):
            y = (mt[i] & upper) | (mt[(i + 1) % self.N] & lower)
            v = mt[(i + self.M) % self.N] ^ (y >> 1)
            if y & 1:
                v ^= 0xB5026F5AA96619E9
            mt[i] = v
        self.index = 0

    def __call__(self):
        if self.index >= self.N:
            self._twist()
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & self.MASK


class MT19937:
    """std::mt19937(seed): NumPy's legacy-seeded MT19937, raw 32-bit outputs (randint over the
    full uint32 range returns them unchanged)."""

    def __init__(self, seed):
        self.rs = numpy.random.RandomState(seed)
        self.buf, self.pos = [], 0

    def __call__(self):
        if self.pos == len(self.buf):
            self.buf = self.rs.randint(0, 2 ** 32, size=4096, dtype=numpy.uint64).tolist()
            self.pos = 0
        self.pos += 1
        return self.buf[self.pos - 1]


def c_round(x):
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def get_target_sample_len(short_seq_ratio, max_length, gen):
    if short_seq_ratio == 0:
        return max_length
    r = gen()
    if r % short_seq_ratio == 0:
        return 2 + r % (max_length - 1)
    return max_length


def build_mapping(docs, sizes, num_epochs, max_num_samples, max_seq_length, short_seq_prob, seed,
                  min_num_sent):
    short_seq_ratio = c_round(1.0 / short_seq_prob) if short_seq_prob > 0 else 0
    gen = MT19937(seed)
    maps = []
    for epoch in range(num_epochs):
        if len(maps) >= max_num_samples:
            break
        for doc in range(len(docs) - 1):
            first, last = int(docs[doc]), int(docs[doc + 1])
            prev_start = first
            remain = last - first
            long_sentence = False
            if remain > 1:
                for s in range(first, last):
                    if sizes[s] > LONG_SENTENCE_LEN:
                        long_sentence = True
                        break
            if remain >= min_num_sent and not long_sentence:
                seq_len = 0
                num_sent = 0
                target = get_target_sample_len(short_seq_ratio, max_seq_length, gen)
                for s in range(first, last):
                    seq_len += int(sizes[s])
                    num_sent += 1
                    remain -= 1
                    if (seq_len >= target and remain > 1 and num_sent >= min_num_sent) or remain == 0:
                        maps.append([prev_start, s + 1, target])
                        prev_start = s + 1
                        target = get_target_sample_len(short_seq_ratio, max_seq_length, gen)
                        seq_len = 0
                        num_sent = 0
        if epoch == 0 and not maps and max_num_samples > 0 and num_epochs > 1:
            raise ValueError("no document gives a sample")
    rng = MT19937_64(seed + 1)
    for i in range(len(maps) - 1, 0, -1):
        j = rng() % (i + 1)
        maps[i], maps[j] = maps[j], maps[i]
    return numpy.array(maps, dtype=numpy.uint32).reshape(-1, 3)


def mapping_for(dataset, documents, num_samples, max_length, short_seq_prob, seed, min_sentences):
    lo, hi = documents
    indices = numpy.arange(lo, hi, dtype=numpy.int32)
    indices = numpy.append(indices, indices[-1] + 1)
    # MaskedWordPieceDataset._build_sample_index: all epochs it takes, or one without a count.
    num_epochs = numpy.iinfo(numpy.int32).max - 1 if num_samples is not None else 1
    max_num_samples = num_samples if num_samples is not None else 2 ** 64 - 1
    return build_mapping(dataset.index.document_indices[indices], dataset.index.sequence_lengths,
                         num_epochs, max_num_samples, max_length, short_seq_prob, seed, min_sentences)


class BertTokenizerVocab:
    """The vocabulary parts of _BertWordPieceTokenizer the dataset reads."""

    def __init__(self, vocab_file, vocab_extra_ids):
        # bert_tokenization.load_vocab
        self.vocab = {}
        index = 0
        with open(vocab_file, "r", encoding="utf-8") as reader:
            while True:
                token = reader.readline()
                if not token:
                    break
                self.vocab[token.strip()] = index
                index += 1
        self.inv_vocab = {v: k for k, v in self.vocab.items()}
        self.cls = self.vocab["[CLS]"]
        self.sep = self.vocab["[SEP]"]
        self.pad = self.vocab["[PAD]"]
        self.mask = self.vocab["[MASK]"]
        for token in ["[BOS]", "[EOS]"] + ["<extra_id_{}>".format(i) for i in range(vocab_extra_ids)]:
            if token not in self.vocab:
                self.inv_vocab[len(self.vocab)] = token
                self.vocab[token] = len(self.vocab)


class BertDataset:
    def __init__(self, dataset, documents, num_samples, config, tokenizer):
        self.dataset = dataset
        self.config = config
        self.tokenizer = tokenizer
        self.token_lookup = list(tokenizer.inv_vocab.keys())
        self.sample_index = mapping_for(dataset, documents, num_samples, config["seq_length"] - 3,
                                        config["short_seq_prob"], config["seed"],
                                        2 if config["binary_head"] else 1)

    def __len__(self):
        return self.sample_index.shape[0]

    def _get_token_mask(self, rs):
        if rs.random() < 0.8:
            return self.tokenizer.mask
        if rs.random() >= 0.5:
            return self.token_lookup[rs.randint(0, len(self.token_lookup))]
        return None

    def _create_masked_lm_predictions(self, token_ids, target_sequence_length, rs):
        candidates = []
        for i, token_id in enumerate(token_ids):
            if token_id == self.tokenizer.cls or token_id == self.tokenizer.sep:
                continue
            if not self.tokenizer.inv_vocab[token_id].startswith("##"):
                candidates.append([i])
            elif len(candidates) > 0:  # masking_do_full_word
                candidates[-1].append(i)
            else:
                candidates.append([i])
        n_maskings = min(self.config["mask_prob"] * target_sequence_length,
                         max(1, int(round(len(token_ids) * self.config["mask_prob"]))))
        # BERT: masking_max_ngram 3, p ∝ 1/n; T5: masking_max_ngram 10, geometric lengths.
        max_ngram = self.config.get("masking_max_ngram", 3)
        geometric = self.config.get("masking_use_geometric_distribution", False)
        ngram_nvals = numpy.arange(max_ngram, dtype=numpy.int64) + 1
        nprobs = 1.0 / ngram_nvals
        nprobs = nprobs / nprobs.sum(keepdims=True)
        candidate_ngrams = [[candidates[idx:idx + n] for n in ngram_nvals] for idx in range(len(candidates))]
        rs.shuffle(candidate_ngrams)
        masked_token_ids = list(token_ids)
        masked = []
        masked_spans = []
        masked_indices = set()
        for candidate_idx in range(len(candidate_ngrams)):
            n_ngrams = len(candidate_ngrams[candidate_idx])
            if len(masked) >= n_maskings:
                break
            if not candidate_ngrams[candidate_idx]:
                continue
            if geometric:
                n = min(rs.geometric(0.2), max_ngram)
            else:
                p = nprobs[:n_ngrams] / nprobs[:n_ngrams].sum(keepdims=True)
                n = rs.choice(ngram_nvals[:n_ngrams], p=p)
            while True:
                ngram_indices = sum(candidate_ngrams[candidate_idx][n - 1], [])
                n = n - 1
                if n_maskings >= len(masked) + len(ngram_indices):
                    skip = False
                    break
                if n == 0:
                    skip = True
                    break
            if skip:
                continue
            if any(idx in masked_indices for idx in ngram_indices):
                continue
            for index in ngram_indices:
                masked_indices.add(index)
                mask = self._get_token_mask(rs)
                masked_token_ids[index] = token_ids[index] if mask is None else mask
                masked.append((index, token_ids[index]))
            masked_spans.append((ngram_indices, [token_ids[index] for index in ngram_indices]))
        assert len(masked) <= n_maskings
        rs.shuffle(candidate_ngrams)
        masked = sorted(masked, key=lambda x: x[0])
        masked_spans = sorted(masked_spans, key=lambda x: x[0][0])
        return masked_token_ids, [m[0] for m in masked], [m[1] for m in masked], masked_spans

    def __getitem__(self, idx):
        idx_beg, idx_end, target_sequence_length = self.sample_index[idx]
        sample = [self.dataset[i] for i in range(idx_beg, idx_end)]
        rs = numpy.random.RandomState(seed=(self.config["seed"] + idx) % 2 ** 32)
        pivot = len(sample)
        is_next_random = False
        if self.config["binary_head"]:
            assert len(sample) > 1
            pivot = 1
            if len(sample) >= 3:
                pivot = rs.randint(low=1, high=len(sample))
            is_next_random = rs.random() < 0.5
        split_a = []
        for s in sample[:pivot]:
            split_a.extend(s)
        split_b = []
        for s in sample[pivot:]:
            split_b.extend(s)
        if is_next_random:
            split_a, split_b = split_b, split_a
        if len(split_a) + len(split_b) <= target_sequence_length:
            truncated = False
        else:
            while len(split_a) + len(split_b) > target_sequence_length:
                split = split_a if len(split_a) > len(split_b) else split_b
                if rs.random() < 0.5:
                    del split[0]
                else:
                    del split[-1]
            truncated = True
        tokens = [self.tokenizer.cls, *[int(t) for t in split_a], self.tokenizer.sep]
        assignments = [0 for _ in range(1 + len(split_a) + 1)]
        if split_b:
            tokens += [*[int(t) for t in split_b], self.tokenizer.sep]
            assignments += [1 for _ in range(len(split_b) + 1)]
        tokens, positions, labels, _ = self._create_masked_lm_predictions(tokens, target_sequence_length, rs)
        seq_length = self.config["seq_length"]
        length_toks = len(tokens)
        length_pads = seq_length - length_toks
        pad = self.tokenizer.pad
        tokens = numpy.pad(numpy.array(tokens, dtype=numpy.int64), (0, length_pads), constant_values=pad)
        assignments = numpy.pad(numpy.array(assignments, dtype=numpy.int64), (0, length_pads), constant_values=pad)
        mask_pads = numpy.pad(numpy.ones(length_toks, dtype=numpy.int64), (0, length_pads), constant_values=pad)
        label_arr = numpy.zeros(seq_length, dtype=numpy.int64) - 1
        label_arr[positions] = labels
        mask_loss = numpy.zeros(seq_length, dtype=numpy.int64)
        mask_loss[positions] = 1
        return {"text": tokens.tolist(), "types": assignments.tolist(), "labels": label_arr.tolist(),
                "is_random": int(is_next_random), "padding_mask": mask_pads.tolist(),
                "loss_mask": mask_loss.tolist(), "truncated": int(truncated)}


# ---- blended_megatron_dataset_builder.py, blended_dataset.py, utils.py ----

def parse_split(split):
    values = [float(s) for s in re.findall(r"[.0-9]+", split)]
    values = values + [0.0] * (3 - len(values))
    total = sum(values)
    return [v / total for v in values]


def split_matrix(fractions):
    out, lo = [], 0.0
    for f in fractions:
        hi = lo + f
        out.append(None if f == 0 else (lo, hi))
        lo = hi
    return out


def blend_from_list(blend):
    if len(blend) % 2 == 1:
        return blend, None
    try:
        weights = [float(blend[i]) for i in range(0, len(blend), 2)]
    except ValueError:
        return blend, None
    total = sum(weights)
    return [blend[i + 1] for i in range(0, len(blend), 2)], [w / total for w in weights]


def blending_indices(weights, size):
    dataset_index, dataset_sample_index = [], []
    current = [0] * len(weights)
    for t in range(size):
        td = max(float(t), 1.0)
        best, best_err = 0, weights[0] * td - current[0]
        for d in range(1, len(weights)):
            err = weights[d] * td - current[d]
            if err > best_err:
                best, best_err = d, err
        dataset_index.append(best)
        dataset_sample_index.append(current[best])
        current[best] += 1
    return dataset_index, dataset_sample_index


class Blended:
    def __init__(self, parts, weights, size):
        self.parts = parts
        self.index, self.sample_index = blending_indices(weights, size)

    def __len__(self):
        return len(self.index)

    def __getitem__(self, k):
        d = self.index[k]
        return {"dataset_id": d, **self.parts[d][self.sample_index[k]]}


def build_split(req, tokenizer, prefixes, weights, bookends, n, dataset_class=None):
    def make(prefix, num_samples):
        ds = IndexedDataset(prefix)
        num_docs = ds.index.document_indices.shape[0] - 1
        lo = int(round(bookends[0] * float(num_docs)))
        hi = int(round(bookends[1] * float(num_docs)))
        return (dataset_class or BertDataset)(ds, (lo, hi), num_samples, req, tokenizer)

    if weights is None:
        assert len(prefixes) == 1, "unweighted blends are not part of the reference"
        return make(prefixes[0], n)
    targets = [int(math.ceil(n * w)) for w in weights]
    parts = [make(p, int(math.ceil(t * (1 + req.get("surplus", 0.005))))) for p, t in zip(prefixes, targets)]
    return Blended(parts, weights, sum(targets))


def samples(req, tokenizer=None, dataset_class=None):
    """The first samples of a split; the T5 reference passes its tokenizer and dataset class."""
    tokenizer = tokenizer or BertTokenizerVocab(req["vocab_file"], req.get("vocab_extra_ids", 0))
    k = ["train", "valid", "test"].index(req["split_name"])
    n = req["num_samples"][k]
    if req.get("data_path"):
        prefixes, weights = blend_from_list(req["data_path"])
        bookends = split_matrix(parse_split(req["split"]))[k]
    else:
        prefixes, weights = blend_from_list(req[req["split_name"] + "_data_path"])
        bookends = (0.0, 1.0)
    ds = build_split(req, tokenizer, prefixes, weights, bookends, n, dataset_class)
    return {"size": len(ds), "samples": [ds[i] for i in range(req["count"])]}


def mapping(req):
    ds = IndexedDataset(req["prefix"])
    return mapping_for(ds, req["documents"], req["num_samples"], req["max_length"], req["short_seq_prob"],
                       req["seed"], req["min_sentences"])


def main():
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "samples":
            out = samples(req)
        elif op == "mapping":
            out = {"rows": mapping(req).tolist()}
        elif op == "cdf":
            v = numpy.arange(req["max_ngram"], dtype=numpy.int64) + 1
            p = 1.0 / v
            p = p / p.sum(keepdims=True)
            p = p / p.sum(keepdims=True)
            cdf = p.cumsum()
            cdf /= cdf[-1]
            out = {"cdf": [float(x).hex() for x in cdf]}
        elif op == "draws":
            rs = numpy.random.RandomState(req["seed"])
            out = {"values": [rs.random() if c[0] == "random" else int(rs.randint(c[1], c[2]))
                              for c in req["calls"]]}
        elif op == "vocab":
            t = BertTokenizerVocab(req["vocab_file"], req.get("vocab_extra_ids", 0))
            out = {"size": len(t.vocab), "cls": t.cls, "sep": t.sep, "pad": t.pad, "mask": t.mask,
                   "bos": t.vocab["[BOS]"], "eos": t.vocab["[EOS]"], "token_lookup": list(t.inv_vocab.keys()),
                   "continuation": [i for i, tok in t.inv_vocab.items() if tok.startswith("##")]}
        elif op == "time_samples":
            ds = BertDataset(IndexedDataset(req["prefix"]), req["documents"], req["num_samples"], req,
                             BertTokenizerVocab(req["vocab_file"], 0))
            t0 = time.perf_counter()
            masked = sum(sum(ds[i]["loss_mask"]) for i in range(req["count"]))
            out = {"seconds": time.perf_counter() - t0, "masked": masked}
        elif op == "time_mapping":
            best, rows = None, 0
            for _ in range(req.get("repeat", 1)):
                t0 = time.perf_counter()
                rows = mapping(req).shape[0]
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
            out = {"seconds": best, "rows": rows}
        else:
            raise ValueError(op)
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
