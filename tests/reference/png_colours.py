#!/usr/bin/python3
"""Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what headless Chromium's --screenshot writes)
with the standard library only (zlib and the five PNG row filters) and prints
"WIDTH HEIGHT DISTINCT_COLOURS NON_WHITE_FRACTION", so a test can tell a rendered page from a
blank one. Usage: png_colours.py FILE.png
"""
import struct
import sys
import zlib


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def main(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit("not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, depth, ctype, _, _, interlace = header
    if depth != 8 or ctype not in (2, 6) or interlace:
        raise SystemExit("unsupported PNG: depth %d colour type %d interlace %d" % (depth, ctype, interlace))
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    prev, colours, non_white = bytearray(stride), set(), 0
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
            line[x] = (line[x] + (0, a, b, (a + b) // 2, paeth(a, b, c))[f]) & 0xFF
        for x in range(0, stride, bpp):
            px = bytes(line[x:x + 3])
            colours.add(px)
            non_white += px != b"\xff\xff\xff"
        prev = line
    print(width, height, len(colours), non_white / (width * height))


if __name__ == "__main__":
    main(sys.argv[1])
