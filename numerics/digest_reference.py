#!/usr/bin/python3
"""Reference implementation of the lockstep state digest (numerics/DIGEST.md), version 1.

Reads a safetensors file with the standard library and hashes it with Debian's python3-xxhash,
independently of lockstep's C++ code. Prints JSON: {"state_digest": hex, "tensors": {name: hex}}.

Usage: digest_reference.py FILE.safetensors
"""

import json
import struct
import sys

import xxhash

CHUNK = 16384
ITEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def h(data):
    return xxhash.xxh3_128(data).digest()


def tensor_digest(dtype, shape, data):
    record = bytearray(b"lockstep-tensor-v1\0")
    name = dtype.encode("ascii")
    record += struct.pack("<B", len(name)) + name
    record += struct.pack("<Q", len(shape))
    for dim in shape:
        record += struct.pack("<Q", dim)
    record += struct.pack("<Q", len(data))
    for begin in range(0, len(data), CHUNK):
        chunk = data[begin:begin + CHUNK]
        record += h(chunk + bytes(CHUNK - len(chunk)))
    return h(bytes(record))


def state_digest(named_digests):
    record = bytearray(b"lockstep-state-v1\0")
    record += struct.pack("<Q", len(named_digests))
    for name in sorted(named_digests, key=lambda n: n.encode("utf-8")):
        encoded = name.encode("utf-8")
        record += struct.pack("<Q", len(encoded)) + encoded + named_digests[name]
    return h(bytes(record))


def main(path):
    with open(path, "rb") as f:
        raw = f.read()
    (header_size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_size])
    buffer = raw[8 + header_size:]
    digests = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        count = 1
        for dim in entry["shape"]:
            count *= dim
        assert end - begin == count * ITEM_SIZE[entry["dtype"]], name
        digests[name] = tensor_digest(entry["dtype"], entry["shape"], buffer[begin:end])
    print(json.dumps({"state_digest": state_digest(digests).hex(),
                      "tensors": {n: d.hex() for n, d in sorted(digests.items())}}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: digest_reference.py FILE.safetensors")
    main(sys.argv[1])
