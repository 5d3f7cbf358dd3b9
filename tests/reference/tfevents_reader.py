"""Independent reader for TensorBoard event files (standard library only), used to check the C++
writer (src/training/tensorboard.cpp). It parses the TFRecord frames, verifies both masked
CRC-32C checksums of every record, decodes each tensorflow.Event with a generic protobuf wire
format decoder and prints one JSON document:

  {"records": N, "file_version": "brain.Event:2",
   "scalars": [{"tag": ..., "step": ..., "value": ..., "wall_time": ...}, ...]}

Any framing, checksum or protobuf error exits with status 1 and a message on stderr.
Usage: tfevents_reader.py EVENT_FILE
"""
import json
import struct
import sys


def crc32c(data: bytes) -> int:
    # Bit by bit (no table), so that it shares nothing with the C++ implementation.
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class DecodeError(Exception):
    pass


def read_varint(buf: bytes, pos: int):
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def decode_message(buf: bytes):
    """Returns {field_number: [(wire_type, value), ...]}; value is int or bytes."""
    fields = {}
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise DecodeError("truncated fixed64")
            value = buf[pos:pos + 8]
            pos += 8
        elif wire == 2:
            n, pos = read_varint(buf, pos)
            if pos + n > len(buf):
                raise DecodeError("truncated length-delimited field %d" % field)
            value = buf[pos:pos + n]
            pos += n
        elif wire == 5:
            if pos + 4 > len(buf):
                raise DecodeError("truncated fixed32")
            value = buf[pos:pos + 4]
            pos += 4
        else:
            raise DecodeError("unsupported wire type %d (field %d)" % (wire, field))
        fields.setdefault(field, []).append((wire, value))
    return fields


def one(fields, number, wire):
    values = fields.get(number, [])
    if not values:
        return None
    w, v = values[-1]
    if w != wire:
        raise DecodeError("field %d has wire type %d, expected %d" % (number, w, wire))
    return v


def read_records(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise DecodeError("truncated record header at byte %d" % pos)
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if len_crc != masked_crc32c(header):
            raise DecodeError("length CRC mismatch at byte %d" % pos)
        start = pos + 12
        if start + length + 4 > len(data):
            raise DecodeError("truncated record at byte %d" % pos)
        payload = data[start:start + length]
        (data_crc,) = struct.unpack("<I", data[start + length:start + length + 4])
        if data_crc != masked_crc32c(payload):
            raise DecodeError("data CRC mismatch at byte %d" % pos)
        yield payload
        pos = start + length + 4


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tfevents_reader.py EVENT_FILE")
    out = {"records": 0, "file_version": None, "scalars": []}
    try:
        for payload in read_records(sys.argv[1]):
            out["records"] += 1
            event = decode_message(payload)
            wall = one(event, 1, 1)
            wall_time = struct.unpack("<d", wall)[0] if wall is not None else 0.0
            step = one(event, 2, 0) or 0
            if step >= 1 << 63:
                step -= 1 << 64
            version = one(event, 3, 2)
            if version is not None:
                out["file_version"] = version.decode("utf-8")
            summary = one(event, 5, 2)
            if summary is None:
                continue
            for wire, value_bytes in decode_message(summary).get(1, []):
                if wire != 2:
                    raise DecodeError("Summary.value has wire type %d" % wire)
                value = decode_message(value_bytes)
                tag = one(value, 1, 2)
                simple = one(value, 2, 5)
                if tag is None or simple is None:
                    raise DecodeError("Summary.Value without tag or simple_value")
                out["scalars"].append({
                    "tag": tag.decode("utf-8"),
                    "step": step,
                    "value": struct.unpack("<f", simple)[0],
                    "wall_time": wall_time,
                })
    except DecodeError as e:
        print("tfevents_reader: %s: %s" % (sys.argv[1], e), file=sys.stderr)
        sys.exit(1)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
