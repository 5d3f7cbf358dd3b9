"""NumPy reader/writer for Megatron's MMIDIDX v1 indexed dataset, structured like
megatron/core/datasets/indexed_dataset.py (_IndexWriter, _IndexReader, IndexedDatasetBuilder),
used to cross-check the C++ implementation: files each side writes must load in the other.

Usage:
  megatron_indexed.py read PREFIX
      prints JSON {"dtype": name, "sequence_lengths": [...], "sequence_pointers": [...],
                   "document_indices": [...], "sequences": [[ids...], ...]}
  megatron_indexed.py write PREFIX DTYPE   (documents as JSON on stdin: [[[ids], [ids]], ...],
                                            each document a list of sequences)
  megatron_indexed.py merge OUT_PREFIX PREFIX...   (add_index in the given order)
"""
import json
import struct
import sys

import numpy

_INDEX_HEADER = b"MMIDIDX\x00\x00"

DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


def code_from_dtype(dtype):
    for k, v in DTYPES.items():
        if numpy.dtype(v) == numpy.dtype(dtype):
            return k
    raise ValueError(dtype)


def data_file_path(prefix):
    return prefix + ".bin"


def index_file_path(prefix):
    return prefix + ".idx"


class _IndexWriter:
    def __init__(self, idx_path, dtype):
        self.idx_path = idx_path
        self.dtype = dtype

    def __enter__(self):
        self.idx_writer = open(self.idx_path, "wb")
        self.idx_writer.write(_INDEX_HEADER)
        self.idx_writer.write(struct.pack("<Q", 1))
        self.idx_writer.write(struct.pack("<B", code_from_dtype(self.dtype)))
        return self

    def __exit__(self, *args):
        self.idx_writer.close()

    def write(self, sequence_lengths, document_indices):
        sequence_pointers = self._sequence_pointers(sequence_lengths)
        self.idx_writer.write(struct.pack("<Q", len(sequence_lengths)))
        self.idx_writer.write(struct.pack("<Q", len(document_indices)))
        self.idx_writer.write(numpy.array(sequence_lengths, dtype=numpy.int32).tobytes(order="C"))
        self.idx_writer.write(numpy.array(sequence_pointers, dtype=numpy.int64).tobytes(order="C"))
        self.idx_writer.write(numpy.array(document_indices, dtype=numpy.int64).tobytes(order="C"))

    def _sequence_pointers(self, sequence_lengths):
        itemsize = numpy.int64(numpy.dtype(self.dtype).itemsize)
        curr = numpy.int64(0)
        out = []
        for length in sequence_lengths:
            out.append(curr)
            curr += length * itemsize
        return out


class _IndexReader:
    def __init__(self, idx_path):
        with open(idx_path, "rb") as stream:
            header = stream.read(9)
            assert header == _INDEX_HEADER, f"bad header in {idx_path}"
            version = struct.unpack("<Q", stream.read(8))[0]
            assert version == 1
            code = struct.unpack("<B", stream.read(1))[0]
            self.dtype = DTYPES[code]
            self.sequence_count = struct.unpack("<Q", stream.read(8))[0]
            self.document_count = struct.unpack("<Q", stream.read(8))[0]
            offset = stream.tell()
        self.bin_buffer_mmap = numpy.memmap(idx_path, mode="r", order="C")
        self.bin_buffer = memoryview(self.bin_buffer_mmap)
        self.sequence_lengths = numpy.frombuffer(
            self.bin_buffer, dtype=numpy.int32, count=self.sequence_count, offset=offset)
        self.sequence_pointers = numpy.frombuffer(
            self.bin_buffer, dtype=numpy.int64, count=self.sequence_count,
            offset=offset + self.sequence_lengths.nbytes)
        self.document_indices = numpy.frombuffer(
            self.bin_buffer, dtype=numpy.int64, count=self.document_count,
            offset=offset + self.sequence_lengths.nbytes + self.sequence_pointers.nbytes)
        assert self.sequence_lengths.shape[0] == len(self)
        assert self.sequence_lengths.shape[0] == self.document_indices[-1]

    def __len__(self):
        return self.sequence_count


class IndexedDataset:
    def __init__(self, path_prefix):
        self.index = _IndexReader(index_file_path(path_prefix))
        self.bin_buffer_mmap = numpy.memmap(data_file_path(path_prefix), mode="r", order="C")
        self.bin_buffer = memoryview(self.bin_buffer_mmap)

    def __len__(self):
        return len(self.index)

    def __getitem__(self, idx):
        pointer = self.index.sequence_pointers[idx]
        length = self.index.sequence_lengths[idx]
        return numpy.frombuffer(self.bin_buffer, dtype=self.index.dtype, count=length,
                                offset=pointer)


class IndexedDatasetBuilder:
    def __init__(self, bin_path, dtype=numpy.int32):
        self.data_file = open(bin_path, "wb")
        self.dtype = dtype
        self.sequence_lengths = []
        self.document_indices = [0]

    def add_item(self, tokens):
        np_array = numpy.array(tokens, dtype=self.dtype)
        self.data_file.write(np_array.tobytes(order="C"))
        self.sequence_lengths.append(np_array.size)

    def add_document(self, tokens, lengths):
        np_array = numpy.array(tokens, dtype=self.dtype)
        self.data_file.write(np_array.tobytes(order="C"))
        self.sequence_lengths.extend(lengths)
        self.document_indices.append(len(self.sequence_lengths))

    def end_document(self):
        self.document_indices.append(len(self.sequence_lengths))

    def add_index(self, path_prefix):
        index = _IndexReader(index_file_path(path_prefix))
        assert index.dtype == self.dtype
        offset = len(self.sequence_lengths)
        self.sequence_lengths.extend(index.sequence_lengths)
        self.document_indices.extend((offset + index.document_indices)[1:])
        with open(data_file_path(path_prefix), "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                self.data_file.write(chunk)

    def finalize(self, idx_path):
        self.data_file.close()
        with _IndexWriter(idx_path, self.dtype) as writer:
            writer.write(self.sequence_lengths, self.document_indices)


def main():
    cmd = sys.argv[1]
    if cmd == "read":
        ds = IndexedDataset(sys.argv[2])
        print(json.dumps({
            "dtype": numpy.dtype(ds.index.dtype).name,
            "sequence_lengths": [int(x) for x in ds.index.sequence_lengths],
            "sequence_pointers": [int(x) for x in ds.index.sequence_pointers],
            "document_indices": [int(x) for x in ds.index.document_indices],
            "sequences": [[int(t) for t in ds[i]] for i in range(len(ds))],
        }))
    elif cmd == "write":
        prefix, dtype = sys.argv[2], numpy.dtype(sys.argv[3]).type
        docs = json.load(sys.stdin)
        builder = IndexedDatasetBuilder(data_file_path(prefix), dtype=dtype)
        for doc in docs:
            tokens = [t for seq in doc for t in seq]
            builder.add_document(tokens, [len(seq) for seq in doc])
        builder.finalize(index_file_path(prefix))
    elif cmd == "merge":
        out = sys.argv[2]
        first = _IndexReader(index_file_path(sys.argv[3]))
        builder = IndexedDatasetBuilder(data_file_path(out), dtype=first.dtype)
        for p in sys.argv[3:]:
            builder.add_index(p)
        builder.finalize(index_file_path(out))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
