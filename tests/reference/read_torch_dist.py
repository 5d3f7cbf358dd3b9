#!/usr/bin/env python3
"""An independent reader of Megatron-LM's torch_dist checkpoints (the inverse of
write_torch_dist.py, with its stand-ins for torch.distributed.checkpoint's classes, which Debian's
torch lacks), to check what training/torch_dist_write.h writes:

  read_torch_dist.py check NAME ITER_DIR FIXTURE_ITER_DIR [--local]
      Reads ITER_DIR as PyTorch's FileSystemReader and Megatron-Core's loader would: .metadata by
      pickle.load (every global it names recorded), each item at its (file, offset, length) by
      torch.load of those bytes, checked against its chunk (dtype, shape), the chunks placed at
      their offsets into each key's global tensor (every element exactly once). Then compares:
      - the classes and globals the .metadata pickle names, and each object's fields, with those of
        FIXTURE_ITER_DIR/.metadata (written by the stand-ins as PyTorch's classes pickle);
      - every tensor key, global shape, dtype and value (bit for bit) with the checkpoint of model
        NAME that write_torch_dist.py makes (its weights and, for gpt2, its optimizer state in the
        distributed optimizer's fully_reshardable keys), with the layer axis of Megatron-Core's keys;
        --local: a run of the local layer spec, else of Transformer Engine's (the layers' norms
        keyed alike: write_torch_dist.megatron_key);
      - common.pt (iteration, checkpoint_version, args, the optimizer's step and sharding type),
        metadata.json, and the bytes items (RNG states and _extra_state objects load).
      Prints "ok" and a summary, or fails with what differs.
"""
import io
import json
import os
import pickle
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import write_torch_dist as w  # noqa: E402  (registers the stand-in classes' modules)


class Recorder(pickle.Unpickler):
    def __init__(self, f):
        super().__init__(f)
        self.globals = set()

    def find_class(self, module, name):
        self.globals.add((module, name))
        return super().find_class(module, name)


def load_metadata(path):
    with open(path, "rb") as f:
        r = Recorder(f)
        meta = r.load()
    return meta, r.globals


def fields(obj, out):
    """Class name -> set of field-name tuples of every object reachable from obj."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            fields(k, out)
            fields(v, out)
    elif isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        for v in obj:
            fields(v, out)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("torch.distributed"):
        out.setdefault(type(obj).__name__, set()).add(tuple(sorted(vars(obj))))
        for v in vars(obj).values():
            fields(v, out)


def read(it):
    meta, globs = load_metadata(os.path.join(it, ".metadata"))
    assert type(meta).__name__ == "Metadata", type(meta)
    tensors, objects = {}, {}
    files = {}
    for idx, info in meta.storage_data.items():
        assert type(idx).__name__ == "MetadataIndex" and type(info).__name__ == "_StorageInfo"
        name = info.relative_path
        if name not in files:
            with open(os.path.join(it, name), "rb") as f:
                files[name] = f.read()
        data = files[name]
        assert 0 <= info.offset and info.offset + info.length <= len(data), (idx.fqn, info)
        raw = data[info.offset:info.offset + info.length]
        md = meta.state_dict_metadata[idx.fqn]
        if type(md).__name__ == "BytesStorageMetadata":
            assert idx.offset is None
            objects[idx.fqn] = torch.load(io.BytesIO(raw))
            continue
        assert type(md).__name__ == "TensorStorageMetadata", md
        chunk = md.chunks[idx.index]
        assert tuple(chunk.offsets) == tuple(idx.offset), (idx, chunk)
        t = torch.load(io.BytesIO(raw))
        assert t.dtype == md.properties.dtype and tuple(t.shape) == tuple(chunk.sizes), (idx.fqn, t.shape, chunk)
        if idx.fqn not in tensors:
            tensors[idx.fqn] = (torch.zeros(tuple(md.size), dtype=t.dtype), torch.zeros(tuple(md.size), dtype=torch.int32))
        g, seen = tensors[idx.fqn]
        region = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))
        g[region] = t
        seen[region] += 1
    for key, md in meta.state_dict_metadata.items():
        if type(md).__name__ == "TensorStorageMetadata":
            assert key in tensors, key
            assert bool((tensors[key][1] == 1).all()), key + ": chunks overlap or leave a gap"
        else:
            assert key in objects, key
    return meta, globs, {k: v[0] for k, v in tensors.items()}, objects


def expected(name, local):
    m = dict(w.MODELS[name], te=not local)
    i = list(w.MODELS).index(name)
    weights = w.full_weights(m, 100 + i)
    states = [("", weights)]
    if m.get("optimizer"):
        opt = w.optimizer_state(m, weights, 200 + i)
        states += [("optimizer.state.%s." % k, opt[k]) for k in ("param", "exp_avg", "exp_avg_sq")]
    out = {}
    for prefix, src in states:
        layered = {}
        for n, t in src.items():
            if n.startswith("decoder.layers."):
                rest = n[len("decoder.layers."):]
                layer, sub = int(rest.split(".", 1)[0]), rest.split(".", 1)[1]
                layered.setdefault(prefix + "decoder.layers." + w.megatron_key(m, sub), {})[layer] = t
            else:
                out[prefix + n] = t
        for k, per in layered.items():
            out[k] = torch.stack([per[j] for j in range(m["L"])])
    return out


def check(name, it, fixture_it, local):
    meta, globs, tensors, objects = read(it)
    _, fixture_globs = load_metadata(os.path.join(fixture_it, ".metadata"))
    assert globs == fixture_globs, ("globals differ", sorted(globs ^ fixture_globs))
    ours_fields, fixture_fields = {}, {}
    fields(meta, ours_fields)
    fields(load_metadata(os.path.join(fixture_it, ".metadata"))[0], fixture_fields)
    assert ours_fields == fixture_fields, ("object fields differ", ours_fields, fixture_fields)
    want = expected(name, local)
    assert set(tensors) == set(want), ("keys differ", sorted(set(tensors) ^ set(want)))
    for k, t in want.items():
        got = tensors[k]
        assert got.dtype == t.dtype and got.shape == t.shape, (k, got.dtype, got.shape, t.dtype, t.shape)
        assert torch.equal(got, t), k + ": values differ"
    common = torch.load(os.path.join(it, "common.pt"))
    assert common["iteration"] == w.ITERATION and common["checkpoint_version"] == 3.0, common
    args = common["args"]
    assert args.num_layers == w.MODELS[name]["L"] and args.hidden_size == w.MODELS[name]["H"], args
    if w.MODELS[name].get("optimizer"):
        o = common["optimizer"]
        assert o["param_state_sharding_type"] == "fully_reshardable", o
        assert all(g["step"] == w.OPTIMIZER_STEP for g in o["optimizer"]["param_groups"]), o
    with open(os.path.join(it, "metadata.json")) as f:
        marker = json.load(f)
    assert marker["sharded_backend"] == "torch_dist" and marker["sharded_backend_version"] == 1, marker
    rng = [k for k in objects if k.startswith("rng_state/shard_")]
    extra = [k for k in objects if "._extra_state/shard_" in k]
    assert rng and all(isinstance(objects[k], list) and "random_rng_state" in objects[k][0] for k in rng), rng
    assert extra and all(objects[k] == [None] for k in extra), extra
    print("ok: %d tensor keys, %d bytes items, %d files" % (len(tensors), len(objects),
                                                             len({i.relative_path for i in meta.storage_data.values()})))


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], "--local" in sys.argv[5:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
