#!/usr/bin/env python3
"""Seeds of fuzz_block_file in format version 2 (kv/disk_cache.h): valid headers, each preceded by the
8 bytes fuzz_block_file.cpp reads as the claimed file size (odd: header + the payload length in bits
1..20). The version 1 seeds beside them (snapshot.bin, three.bin, two_blocks.bin) stay: they exercise
the rejection of old files.

  /usr/bin/python3 fuzz/seeds_kv/make_seeds.py fuzz/seeds_kv
"""
import struct
import sys
from pathlib import Path


def fnv1a64(data, h=1469598103934665603):
    for b in data:
        h ^= b
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def header(block_size, keys, tokens, block_bytes, snapshot_bytes=0, snap_depth=0, tail=(), tail_key=0):
    fixed = 8 + 4 + 4 + 8 + 4 * 4 + 8 + 8 + 4 + 4 + 8
    n = len(keys)
    hb = fixed + 8 * n + 4 * len(tokens) + 4 * len(tail) + 16
    out = b"PGKVBLK\0" + struct.pack("<IIQIIIIQQIIQ", 2, hb, 42, 1, 1, block_size, n, block_bytes, snapshot_bytes, snap_depth, len(tail), tail_key)
    out += b"".join(struct.pack("<Q", k) for k in keys) + b"".join(struct.pack("<i", t) for t in tokens)
    out += b"".join(struct.pack("<i", t) for t in tail)
    out += struct.pack("<Q", 0x1234)
    out += struct.pack("<Q", fnv1a64(out))
    payload = n * block_bytes + (snapshot_bytes if snap_depth else 0) + len(tail) * (block_bytes // block_size) + (snapshot_bytes if tail else 0)
    return struct.pack("<Q", (payload << 1) | 1) + out


def main():
    out = Path(sys.argv[1])
    seeds = {
        "v2_two_blocks.bin": header(4, [7, 8], list(range(8)), 12),
        "v2_tail.bin": header(4, [7, 8], list(range(8)), 12, tail=[9, 10, 11], tail_key=99),
        "v2_hybrid_tail.bin": header(4, [7, 8, 9], list(range(12)), 8, snapshot_bytes=16, snap_depth=2, tail=[5], tail_key=77),
        "v2_hybrid_tail_only.bin": header(2, [7], [1, 2], 6, snapshot_bytes=10, tail=[3], tail_key=55),
    }
    for name, data in seeds.items():
        (out / name).write_bytes(data)


if __name__ == "__main__":
    main()
