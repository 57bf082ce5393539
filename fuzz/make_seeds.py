#!/usr/bin/python3
"""Writes small valid GGUF seeds for fuzz_gguf from real model files.

Fuzzing whole models wastes almost every mutation on tensor data the parser never looks at, so each
seed keeps a model's complete metadata (tokenizer arrays included) and tensor table (names, types, ranks)
but shrinks every tensor to one block, so the file is a few KiB to a few hundred KiB and still parses.
Usage: /usr/bin/python3 fuzz/make_seeds.py OUT_DIR MODEL.gguf...
"""
import os
import struct
import sys

# ggml type id -> (block size, bytes per block), for the types the seeds may contain.
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
          10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
          16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
          22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
          29: (256, 56), 30: (1, 2)}
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class Reader:
    def __init__(self, b):
        self.b, self.pos = b, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = self.b[self.pos:self.pos + n]
        self.pos += n
        return s

    def skip_value(self, t):
        if t in SCALAR:
            self.pos += SCALAR[t]
        elif t == 8:
            self.string()
        elif t == 9:
            et, n = self.take("IQ")
            if et in SCALAR:
                self.pos += SCALAR[et] * n
            else:
                for _ in range(n):
                    self.skip_value(et)
        else:
            raise ValueError(f"unknown value type {t}")


def shrink(path):
    b = open(path, "rb").read()
    r = Reader(b)
    magic, version, n_tensors, n_kv = r.take("4sIQQ")
    assert magic == b"GGUF" and version == 3, path
    kv_start = r.pos
    alignment = 32
    for _ in range(n_kv):
        key = r.string()
        t = r.take("I")
        if key == b"general.alignment":
            alignment = struct.unpack_from("<I", b, r.pos)[0]
        r.skip_value(t)
    out = bytearray(b[:kv_start])
    out[8:16] = struct.pack("<Q", n_tensors)
    out += b[kv_start:r.pos]
    data = bytearray()
    for i in range(n_tensors):
        name = r.string()
        n_dims = r.take("I")
        r.take(f"{n_dims}q")
        ttype, _ = r.take("IQ")
        blk, size = BLOCKS[ttype]
        out += struct.pack("<Q", len(name)) + name + struct.pack("<I", n_dims)
        out += struct.pack("<q", blk) + struct.pack("<q", 1) * (n_dims - 1) + struct.pack("<IQ", ttype, len(data))
        data += bytes((i * 31 + k) & 0xFF for k in range(size))
        data += b"\0" * ((-len(data)) % alignment)
    out += b"\0" * ((-len(out)) % alignment)
    return bytes(out + data)


def rich():
    """Every value type, nested arrays, alignment 64, tensors of several types and ranks."""
    def s(t):
        b = t.encode()
        return struct.pack("<Q", len(b)) + b

    def kv(key, t, payload):
        return s(key) + struct.pack("<I", t) + payload

    kvs = [
        kv("general.architecture", 8, s("llama")),
        kv("general.alignment", 4, struct.pack("<I", 64)),
        kv("u8", 0, b"\xff"), kv("i8", 1, b"\x80"), kv("u16", 2, b"\xff\xff"), kv("i16", 3, b"\x00\x80"),
        kv("u32", 4, struct.pack("<I", 7)), kv("i32", 5, struct.pack("<i", -7)), kv("f32", 6, struct.pack("<f", 1e-5)),
        kv("bool", 7, b"\x01"), kv("u64", 10, struct.pack("<Q", 1 << 63)), kv("i64", 11, struct.pack("<q", -(1 << 63))),
        kv("f64", 12, struct.pack("<d", 0.1)),
        kv("arr_str", 9, struct.pack("<IQ", 8, 3) + s("a") + s("") + s("\u0120the")),
        kv("arr_f32", 9, struct.pack("<IQ", 6, 2) + struct.pack("<2f", 0.5, -1.0)),
        kv("arr_arr", 9, struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 5, 1) + struct.pack("<i", 3) + struct.pack("<IQ", 8, 1) + s("x")),
    ]
    infos, data = [], bytearray()
    for name, dims, ttype in (("a.weight", [8], 0), ("b.weight", [32, 2], 8), ("c.weight", [256, 1, 2], 12), ("d.weight", [4, 1, 1, 2], 1)):
        blk, size = BLOCKS[ttype]
        n = 1
        for d in dims:
            n *= d
        infos.append(s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims) + struct.pack("<IQ", ttype, len(data)))
        data += bytes(k & 0xFF for k in range(n // blk * size))
        data += b"\0" * ((-len(data)) % 64)
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos))
    out += b"\0" * ((-len(out)) % 64)
    return bytes(out + data)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rich.seed.gguf"), "wb") as f:
        f.write(rich())
    for path in sys.argv[2:]:
        seed = shrink(path)
        name = os.path.basename(path).replace(".gguf", "") + ".seed.gguf"
        with open(os.path.join(out, name), "wb") as f:
            f.write(seed)
    print(f"wrote {len(sys.argv) - 2} seeds to {out}")


if __name__ == "__main__":
    main()
