#!/usr/bin/python3
"""NumPy side of bench/dataset_index_bench.cpp: RandomState shuffles of a document index of D
int32 entries and a shuffle index of N uint32 entries (the RNG work Megatron does in Python).
Usage: numpy_index_bench.py D N"""
import sys
import time

import numpy

D, N = int(sys.argv[1]), int(sys.argv[2])
rng = numpy.random.RandomState(1234)
doc = numpy.arange(D, dtype=numpy.int32)
shf = numpy.arange(N, dtype=numpy.uint32)
t0 = time.perf_counter()
rng.shuffle(doc)
rng.shuffle(shf)
print(f"numpy shuffles of {D} + {N} entries: {time.perf_counter() - t0:.3f} s")
