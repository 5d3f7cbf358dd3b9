#!/usr/bin/python3
"""Reference for the GPT dataset indices, written the way Megatron-LM's Python builds them
(megatron/core/datasets/gpt_dataset.py, helpers.cpp's loops transcribed to Python) with
numpy.random.RandomState. Reads one JSON request per line on stdin, writes one JSON answer per line.

Requests:
  {"op": "shuffle", "seed": s, "n": n}                  -> RandomState(s).shuffle(arange(n))
  {"op": "gpt", "lengths": [...], "split": [lo, hi], "num_samples": N|null, "seq_length": S, "seed": s}
  {"op": "blend", "weights": [...], "size": n}  /  {"op": "blend_exhaustive", "sizes": [...]}
  {"op": "mock", "split": 0|1|2, "num_samples": N, "seq_length": S, "seed": s, "eod": e, "count": k}
      -> {"lengths_head": [...], "lengths_sum": n, "range": [lo, hi], "samples": [[S+1 ids] x k]}:
         --mock-data as Megatron builds it (MockGPTLowLevelDataset: numpy.random.default_rng(0)
         lengths, documents 1 .. L-1 EOD; split "1,1,1"; GPTDataset indices; the first k samples)
"""
import json
import sys

import numpy


def document_index(documents, num_epochs, rng, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        doc_idx = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        doc_idx[:] = documents
        doc_idx = doc_idx.reshape(-1).astype(numpy.int32)
        rng.shuffle(doc_idx)
        return doc_idx
    first = document_index(documents, num_epochs - 1, rng, False)
    last = document_index(documents, 1, rng, False)
    return numpy.concatenate((first, last))


def sample_index(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, extra=1):
    num_samples = (num_epochs * tokens_per_epoch - extra) // seq_length
    out = numpy.zeros((num_samples + 1, 2), dtype=numpy.int64)
    s, d, offset = 1, 0, 0
    while s <= num_samples:
        remaining = seq_length + extra
        while remaining != 0:
            doc_len = int(sizes[doc_idx[d]]) - offset
            remaining -= doc_len
            if remaining <= 0:
                offset += remaining + doc_len - extra
                remaining = 0
            else:
                if d == len(doc_idx) - 1:
                    assert s == num_samples
                    offset = int(sizes[doc_idx[d]]) - extra
                    break
                d += 1
                offset = 0
        out[s] = (d, offset)
        s += 1
    return out


def shuffle_index(num_samples, total_size, rng):
    dtype = numpy.uint32 if total_size < numpy.iinfo(numpy.uint32).max - 1 else numpy.int64
    first = numpy.arange(0, num_samples, 1, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = numpy.arange(num_samples, total_size, 1, dtype=dtype)
    rng.shuffle(last)
    return numpy.concatenate((first, last))


def gpt(req):
    sizes = numpy.array(req["lengths"], dtype=numpy.int32)
    indices = numpy.arange(req["split"][0], req["split"][1], 1, dtype=numpy.int32)
    S, N = req["seq_length"], req["num_samples"]
    T = int(numpy.sum(sizes[indices]))
    E = 1
    if N is not None:
        tokens = T
        while tokens < N * S + 1:
            tokens += T
            E += 1
    separate = False
    before_last = 0
    if E > 1:
        before_last = ((E - 1) * T - 1) // S
        from_last = N - before_last
        per_epoch = (T - 1) // S
        assert 0 <= from_last <= per_epoch + 1
        separate = from_last < int(0.80 * per_epoch)
    rng = numpy.random.RandomState(req["seed"])
    doc_idx = document_index(indices, E, rng, separate)
    smp_idx = sample_index(sizes, doc_idx, S, E, T)
    n = smp_idx.shape[0] - 1
    shf_idx = shuffle_index(before_last if separate else n, n, rng)
    return {"epochs": E, "separate": separate, "document_index": doc_idx.tolist(),
            "sample_index": smp_idx.reshape(-1).tolist(), "shuffle_index": shf_idx.tolist()}


def mock(req):
    # MockGPTLowLevelDataset
    lengths = numpy.random.default_rng(seed=0).integers(low=1, high=4096, size=100000, dtype=numpy.int32)

    def doc(i):
        return numpy.int64(numpy.concatenate([numpy.arange(lengths[i] - 1) + 1, [req["eod"]]]))

    # BlendedMegatronDatasetConfig: split "1,1,1" -> book-ends; _build_megatron_dataset_splits
    vec = (numpy.array([1.0, 1.0, 1.0]) / 3.0).tolist()  # utils.normalize([1, 1, 1])
    expansion = [0.0]
    for x in vec:
        expansion.append(expansion[-1] + x)
    k = req["split"]
    lo = int(round(expansion[k] * float(len(lengths))))
    hi = int(round(expansion[k + 1] * float(len(lengths))))
    idx = gpt({"lengths": lengths.tolist(), "split": [lo, hi], "num_samples": req["num_samples"],
               "seq_length": req["seq_length"], "seed": req["seed"]})
    doc_idx = idx["document_index"]
    smp = numpy.array(idx["sample_index"]).reshape(-1, 2)
    shf = idx["shuffle_index"]
    S = req["seq_length"]
    samples = []
    for i in range(req["count"]):
        j = shf[i]
        (b, bo), (e, eo) = smp[j], smp[j + 1]
        if b == e:
            part = [doc(doc_idx[b])[bo:eo + 1]]
        else:
            part = []
            for d in range(b, e + 1):
                off = 0 if d > b else bo
                t = doc(doc_idx[d])
                part.append(t[off:] if d < e else t[off:eo + 1])
        samples.append(numpy.concatenate(part).tolist()[: S + 1])
    return {"lengths_head": lengths[:5].tolist(), "lengths_sum": int(lengths.sum()),
            "range": [lo, hi], "samples": samples}


def blend(weights, size):
    weights = numpy.array(weights, dtype=numpy.float64)
    weights = weights / numpy.sum(weights)
    counts = [0] * len(weights)
    di, dsi = [], []
    for t in range(size):
        td = max(float(t), 1.0)
        errs = [weights[d] * td - counts[d] for d in range(len(weights))]
        best = 0
        for d in range(1, len(errs)):
            if errs[d] > errs[best]:
                best = d
        di.append(best)
        dsi.append(counts[best])
        counts[best] += 1
    return {"dataset_index": di, "dataset_sample_index": dsi}


def blend_exhaustive(sizes):
    total = sum(sizes)
    w = [s / total for s in sizes]
    unspent = [d for d in range(len(sizes)) if sizes[d] > 0]
    counts = [0] * len(sizes)
    di, dsi = [], []
    t = 0
    while unspent:
        td = max(float(t), 1.0)
        best, best_err = None, None
        for d in unspent:
            e = w[d] * td - counts[d]
            if best is None or e > best_err:
                best, best_err = d, e
        di.append(best)
        dsi.append(counts[best])
        counts[best] += 1
        if counts[best] == sizes[best]:
            unspent.remove(best)
        t += 1
    return {"dataset_index": di, "dataset_sample_index": dsi}


for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "shuffle":
        a = numpy.arange(req["n"], dtype=numpy.int64)
        numpy.random.RandomState(req["seed"]).shuffle(a)
        ans = a.tolist()
    elif req["op"] == "gpt":
        ans = gpt(req)
    elif req["op"] == "mock":
        ans = mock(req)
    elif req["op"] == "blend":
        ans = blend(req["weights"], req["size"])
    else:
        ans = blend_exhaustive(req["sizes"])
    print(json.dumps(ans))
