"""PyTorch files for the interop tests of the restricted unpickler (core/torch_file.h), written and
read by Debian's torch (python3-torch) as an independent reference.

  torch_files.py objects OUT        objects.pt (zip format), objects_legacy.pt (PyTorch's pre-1.6
                                    format) and objects.json (the expected tensors and values)
  torch_files.py forbidden OUT MARK files whose unpickling would run code that creates MARK:
                                    os.system, builtins.eval, getattr(__import__('os'), 'system'), a reduce
                                    hidden inside an argparse.Namespace
  torch_files.py check FILE JSON    torch.load(FILE) equals the tensors described in JSON (the
                                    shape a C++ writer test expects); prints "ok" or the mismatch
"""
import argparse
import collections
import json
import os
import random
import sys

import numpy as np
import torch


def flat(t):
    return [float(x) for x in t.detach().to(torch.float64).reshape(-1).tolist()]


def describe(t):
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "values": flat(t)}


def objects(out):
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    base = torch.randn(4, 6, generator=g)
    tensors = {
        "f32": torch.randn(3, 5, generator=g),
        "f16": torch.randn(2, 3, generator=g).half(),
        "bf16": torch.randn(7, generator=g).bfloat16(),
        "f64": torch.randn(2, 2, generator=g).double(),
        "i64": torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4),
        "i32": torch.arange(5, dtype=torch.int32),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        # views of one storage: transposed, sliced with an offset, strided
        "base": base,
        "transposed": base.t(),
        "slice": base[1:3, 2:5],
        "strided": base[:, ::2],
    }
    sd = torch.nn.Linear(3, 2).half().state_dict()  # OrderedDict with _metadata
    ns = argparse.Namespace(num_layers=2, hidden_size=64, lr=3e-4, fp16=True, name="gpt",
                            params_dtype=torch.float16, data_path=["a", "b"], none=None,
                            big=2 ** 70, neg=-5, ids={1, 2}, raw=b"\x00\xffxy")
    np.random.seed(5)
    random.seed(5)
    obj = {
        "tensors": tensors,
        "state_dict": sd,
        "args": ns,
        "numbers": (1, -1, 255, 256, 65535, 65536, -2 ** 31, 2 ** 31, 2 ** 62, 1.5, -0.0),
        "np_rng_state": np.random.get_state(),
        "random_rng_state": random.getstate(),
        "empty": {"list": [], "dict": {}, "tuple": ()},
        3: "int key",
    }
    torch.save(obj, os.path.join(out, "objects.pt"))
    torch.save(obj, os.path.join(out, "objects_legacy.pt"), _use_new_zipfile_serialization=False)
    expect = {
        "tensors": {k: describe(v) for k, v in tensors.items()},
        "state_dict": {k: describe(v) for k, v in sd.items()},
        "np_rng_keys": [int(x) for x in np.random.get_state()[1][:4]],
        "np_rng_pos": int(np.random.get_state()[2]),
    }
    with open(os.path.join(out, "objects.json"), "w") as f:
        json.dump(expect, f)


class Call:
    """Unpickles to f(*args): what a malicious file does."""

    def __init__(self, f, args):
        self.f, self.args = f, args

    def __call__(self, *args):  # so that a Call can be the callable of another Call
        raise RuntimeError("never called")

    def __reduce__(self):
        return (self.f, self.args)


def forbidden(out, marker):
    os.makedirs(out, exist_ok=True)
    cmd = "touch " + marker
    files = {
        "os_system.pt": {"model": Call(os.system, (cmd,))},
        "eval.pt": {"model": Call(eval, ("__import__('os').system(%r)" % cmd,))},
        "getattr.pt": {"x": Call(Call(getattr, (Call(__import__, ("os",)), "system")), (cmd,))},
        "namespace.pt": {"args": argparse.Namespace(a=1, b=Call(os.system, (cmd,)))},
    }
    for name, obj in files.items():
        torch.save(obj, os.path.join(out, name))


def check(path, expect_path):
    with open(expect_path) as f:
        expect = json.load(f)
    obj = torch.load(path, map_location="cpu")
    problems = []

    def walk(node, exp, where):
        if isinstance(exp, dict) and "__ndarray__" in exp:  # {"__ndarray__": [dtype, shape, first values]}
            dt, shape, first = exp["__ndarray__"]
            if not isinstance(node, np.ndarray) or str(node.dtype) != dt or list(node.shape) != shape or \
                    [int(x) for x in node.reshape(-1)[:len(first)]] != first:
                problems.append("%s: %r, expected ndarray %s %s %s" % (where, node, dt, shape, first))
        elif isinstance(exp, dict) and "__str__" in exp:  # objects compared by str(), e.g. torch dtypes
            if str(node) != exp["__str__"]:
                problems.append("%s: %s, expected %s" % (where, node, exp["__str__"]))
        elif isinstance(exp, dict) and "dtype" in exp and "shape" in exp:
            if not torch.is_tensor(node):
                problems.append("%s: not a tensor (%s)" % (where, type(node).__name__))
                return
            if str(node.dtype).replace("torch.", "") != exp["dtype"] or list(node.shape) != exp["shape"]:
                problems.append("%s: %s %s, expected %s %s" % (where, node.dtype, list(node.shape),
                                                               exp["dtype"], exp["shape"]))
            elif flat(node) != exp["values"]:
                problems.append("%s: values differ" % where)
        elif isinstance(exp, dict):
            for k, v in exp.items():
                child = getattr(node, k, None) if isinstance(node, argparse.Namespace) else (
                    node.get(k) if isinstance(node, dict) else None)
                walk(child, v, where + "." + k)
        elif isinstance(exp, list):
            if not isinstance(node, (list, tuple)) or len(node) != len(exp):
                problems.append("%s: %r, expected %d items" % (where, type(node).__name__, len(exp)))
                return
            for i, v in enumerate(exp):
                walk(node[i], v, "%s[%d]" % (where, i))
        elif node != exp:
            problems.append("%s: %r, expected %r" % (where, node, exp))

    walk(obj, expect, "root")
    print("ok" if not problems else "\n".join(problems[:20]))


def main():
    cmd = sys.argv[1]
    if cmd == "objects":
        objects(sys.argv[2])
    elif cmd == "forbidden":
        forbidden(sys.argv[2], sys.argv[3])
    elif cmd == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    main()
