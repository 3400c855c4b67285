#!/usr/bin/python3
"""Writes safetensors fixtures from the format's specification, independently of lockstep.

The format: an 8-byte little-endian unsigned header length N, N bytes of UTF-8 JSON mapping each
tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the byte buffer
after the header) plus an optional "__metadata__" object of strings, then the buffer. Only the
Python standard library is used, so this is a second implementation to read lockstep against.

Run from this directory: ./make_fixtures.py  (the outputs are committed).
"""

import json
import struct


def bf16(value):
    """The bfloat16 bytes of a float32-exact value that bfloat16 holds exactly."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    assert bits & 0xFFFF == 0, value
    return struct.pack("<H", bits >> 16)


def write(path, tensors, metadata=None):
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    buffer = b""
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(buffer), len(buffer) + len(data)]}
        buffer += data
    text = json.dumps(header).encode("utf-8")
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text + buffer)


write("mixed.safetensors", [
    ("f32", "F32", [2, 3], struct.pack("<6f", 1.5, -2.0, 0.25, 3.0, -0.0, 1e-3)),
    ("f64_scalar", "F64", [], struct.pack("<d", 3.141592653589793)),
    ("bf16", "BF16", [4], b"".join(bf16(v) for v in (1.5, -2.0, 0.25, 3.0))),
    ("f16", "F16", [2, 2], struct.pack("<4e", 0.5, -1.0, 65504.0, 2.0 ** -24)),
    ("i64", "I64", [3], struct.pack("<3q", -(2 ** 62), 0, 2 ** 53 + 1)),
    ("i32", "I32", [2], struct.pack("<2i", -7, 2 ** 31 - 1)),
    ("i16", "I16", [2], struct.pack("<2h", -300, 300)),
    ("i8", "I8", [2], struct.pack("<2b", -128, 127)),
    ("u8", "U8", [3], bytes([0, 128, 255])),
    ("flags", "BOOL", [2, 2], bytes([1, 0, 0, 1])),
    ("empty", "F32", [0, 4], b""),
], metadata={"format": "pt", "written_by": "numerics/testdata/make_fixtures.py"})
