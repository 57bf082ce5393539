#!/usr/bin/python3
"""Writes the hostile GGUF corpus under tests/gguf/corpus/ (run once; the files are committed).

Every file must make pg::gguf::File fail with one pg::Error line; corpus/expected.tsv maps each file to
a substring its error message must contain. The files are built byte by byte here, independently of
the C++ writer, from the GGUF v3 layout:
  magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv | kv* | tensor_info* | pad | data
  kv          = string key | u32 type | value
  tensor_info = string name | u32 n_dims | i64 ne[n_dims] | u32 ggml type | u64 offset (from data start)
  string      = u64 length | bytes
Usage: /usr/bin/python3 tests/gguf/make_corpus.py [OUT_DIR]   (default tests/gguf/corpus; valid_base.gguf goes
beside OUT_DIR)
"""
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
T_F32, T_F16, T_Q4_0, T_Q8_0 = 0, 1, 2, 8


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def header(n_tensors, n_kv, version=3, magic=b"GGUF"):
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def kv_str(key, value):
    return kv(key, STR, s(value))


def kv_u32(key, value):
    return kv(key, U32, struct.pack("<I", value))


def arr(elem_type, n, payload=b""):
    return struct.pack("<IQ", elem_type, n) + payload


def tinfo(name, dims, ttype, offset):
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims) + struct.pack("<IQ", ttype, offset)


def pad(b, alignment=32):
    return b + b"\0" * ((-len(b)) % alignment)


def model(kvs, infos, data, alignment=32, version=3):
    """A whole file from kv records, tensor infos and the data section."""
    body = header(len(infos), len(kvs), version) + b"".join(kvs) + b"".join(infos)
    return pad(body, alignment) + data


ARCH = kv_str("general.architecture", "llama")


def valid():
    """A correct file: 2 keys, 2 tensors (F32 {8} and Q8_0 {32, 2})."""
    kvs = [ARCH, kv_u32("llama.block_count", 1)]
    infos = [tinfo("a.weight", [8], T_F32, 0), tinfo("b.weight", [32, 2], T_Q8_0, 32)]
    data = pad(struct.pack("<8f", *range(8))) + pad(bytes(range(68)))
    return model(kvs, infos, data)


def cases():
    v = valid()
    head_len = len(header(2, 2)) + len(ARCH) + len(kv_u32("llama.block_count", 1))
    info_len = len(tinfo("a.weight", [8], T_F32, 0)) + len(tinfo("b.weight", [32, 2], T_Q8_0, 32))
    one = [tinfo("a.weight", [8], T_F32, 0)]
    one_data = pad(b"\0" * 32)

    yield "empty", b"", "too short"
    yield "short_magic", b"GG", "too short"
    yield "bad_magic", b"GGML" + v[4:], "bad magic"
    yield "bad_magic_zeros", b"\0" * 64, "bad magic"
    yield "version_1", model([ARCH], one, one_data, version=1), "version 1"
    yield "version_0", model([ARCH], one, one_data, version=0), "unsupported GGUF version 0"
    yield "version_4", model([ARCH], one, one_data, version=4), "unsupported GGUF version 4"
    yield "version_huge", model([ARCH], one, one_data, version=0xFFFFFFFF), "unsupported GGUF version"
    yield "big_endian", b"GGUF" + struct.pack(">IQQ", 3, 1, 1) + v[24:], "big-endian"
    yield "truncated_version", v[:6], "truncated"
    yield "truncated_counts", v[:20], "truncated"
    yield "truncated_kv_key", v[:24 + 10], "tensor count 2 cannot fit in the 10 bytes"
    yield "truncated_kv_value", v[:24 + len(ARCH) - 2], "tensor count 2 cannot fit"
    # One tensor and a kv count of 2 that the bytes can hold, cut inside the second key.
    yield "truncated_second_key", model([ARCH, kv_u32("llama.block_count", 1)], one, one_data)[:24 + len(ARCH) + 12], "truncated file while reading metadata key"
    yield "truncated_in_array", header(0, 1) + kv("k", ARR, arr(STR, 3, s("a") + s("b") + s("cdefgh")))[:-3], "truncated file while reading string value"
    yield "truncated_tensor_info", v[:head_len + 12], "truncated"
    yield "truncated_tensor_offset", v[:head_len + info_len - 3], "truncated"
    yield "truncated_before_data", v[:head_len + info_len], "starts past the end"
    yield "truncated_data", v[:-40], "extends past the end"
    yield "truncated_last_byte", v[:-29], "extends past the end"
    yield "huge_tensor_count", header(1 << 62, 0) + b"\0" * 64, "tensor count"
    yield "max_tensor_count", header(0xFFFFFFFFFFFFFFFF, 0) + b"\0" * 64, "tensor count"
    yield "huge_kv_count", header(0, 1 << 40) + b"\0" * 64, "metadata count"
    yield "max_kv_count", header(0, 0xFFFFFFFFFFFFFFFF) + b"\0" * 64, "metadata count"
    yield "huge_key_length", header(0, 1) + struct.pack("<Q", 1 << 63) + b"k" * 32, "metadata key length"
    yield "max_key_length", header(0, 1) + struct.pack("<Q", 0xFFFFFFFFFFFFFFFF) + b"k" * 32, "metadata key length"
    yield "key_past_end", header(0, 1) + struct.pack("<Q", 1000) + b"k" * 32, "truncated file while reading metadata key"
    yield "huge_string_value", header(0, 1) + s("k") + struct.pack("<IQ", STR, 1 << 62) + b"x" * 32, "string value"
    yield "max_string_value", header(0, 1) + s("k") + struct.pack("<IQ", STR, 0xFFFFFFFFFFFFFFFF) + b"x" * 32, "string value"
    yield "huge_array_u8", header(0, 1) + kv("k", ARR, arr(U8, 1 << 60, b"\1" * 16)), "array length"
    yield "max_array_u64", header(0, 1) + kv("k", ARR, arr(U64, 0xFFFFFFFFFFFFFFFF, b"\1" * 16)), "array length"
    yield "huge_array_strings", header(0, 1) + kv("k", ARR, arr(STR, 1 << 40, s("a") * 4)), "array length"
    yield "huge_string_in_array", header(0, 1) + kv("k", ARR, arr(STR, 2, s("a") + struct.pack("<Q", 1 << 50) + b"b")), "string value"
    yield "array_past_end", header(0, 1) + kv("k", ARR, arr(I32, 100, b"\0" * 40)), "array length"
    nested = arr(U8, 1, b"\1")
    for _ in range(4):
        nested = arr(ARR, 1, nested)
    yield "nested_arrays_5_deep", header(0, 1) + kv("k", ARR, nested), "nested deeper"
    yield "unknown_kv_type", header(0, 1) + kv("k", 13, b"\0" * 8), "unknown metadata value type 13"
    yield "unknown_kv_type_max", header(0, 1) + kv("k", 0xFFFFFFFF, b"\0" * 8), "unknown metadata value type"
    yield "unknown_array_elem_type", header(0, 1) + kv("k", ARR, arr(77, 1, b"\0" * 8)), "unknown array element type 77"
    yield "empty_key", header(0, 1) + kv("", U32, b"\0" * 4), "empty metadata key"
    yield "bool_value_2", header(0, 1) + kv("k", BOOL, b"\2"), "neither 0 nor 1"
    yield "bool_value_255", header(0, 1) + kv("k", BOOL, b"\xff"), "neither 0 nor 1"
    yield "bool_in_array", header(0, 1) + kv("k", ARR, arr(BOOL, 3, b"\0\1\7")), "neither 0 nor 1"
    yield "duplicate_key", model([ARCH, kv_u32("x", 1), kv_u32("x", 2)], one, one_data), "duplicate metadata key 'x'"
    yield "duplicate_key_newline", model([kv_u32("a\nb", 1), kv_u32("a\nb", 2)], one, one_data), "duplicate metadata key 'a\\nb'"
    yield "duplicate_tensor", model([ARCH], one + [tinfo("a.weight", [8], T_F32, 32)], pad(b"\0" * 64)), "duplicate tensor name"
    yield "alignment_zero", model([ARCH, kv_u32("general.alignment", 0)], one, one_data), "general.alignment 0"
    yield "alignment_3", model([ARCH, kv_u32("general.alignment", 3)], one, one_data), "general.alignment 3"
    yield "alignment_huge", model([ARCH, kv_u32("general.alignment", 1 << 30)], one, one_data), "general.alignment"
    yield "alignment_u64", model([ARCH, kv("general.alignment", U64, struct.pack("<Q", 32))], one, one_data), "must be a u32"
    yield "alignment_string", model([ARCH, kv_str("general.alignment", "32")], one, one_data), "must be a u32"
    yield "misaligned_offset", model([ARCH], [tinfo("a.weight", [8], T_F32, 4)], pad(b"\0" * 64)), "not aligned"
    yield "misaligned_offset_64", model([ARCH, kv_u32("general.alignment", 64)], [tinfo("a.weight", [8], T_F32, 32)],
                                        pad(b"\0" * 128, 64), 64), "not aligned to 64"
    yield "offset_past_end", model([ARCH], [tinfo("a.weight", [8], T_F32, 1 << 40)], one_data), "extends past the end"
    yield "offset_max", model([ARCH], [tinfo("a.weight", [8], T_F32, 0xFFFFFFFFFFFFFFE0)], one_data), "extends past the end"
    yield "size_past_end", model([ARCH], [tinfo("a.weight", [1024, 1024], T_F32, 0)], one_data), "extends past the end"
    yield "overlapping_tensors", model([ARCH], [tinfo("a.weight", [16], T_F32, 0), tinfo("b.weight", [8], T_F32, 32)],
                                       pad(b"\0" * 64)), "overlaps"
    yield "shape_overflow", model([ARCH], [tinfo("a.weight", [1 << 32, 1 << 32], T_F32, 0)], one_data), "element count overflows"
    yield "shape_overflow_4d", model([ARCH], [tinfo("a.weight", [1 << 16] * 4, T_F32, 0)], one_data), "element count overflows"
    yield "bytes_overflow", model([ARCH], [tinfo("a.weight", [1 << 31, 1 << 31], T_F32, 0)], one_data), "byte size overflows"
    yield "dim_zero", model([ARCH], [tinfo("a.weight", [8, 0], T_F32, 0)], one_data), "of size 0"
    yield "dim_negative", model([ARCH], [tinfo("a.weight", [-8], T_F32, 0)], one_data), "of size -8"
    yield "dim_min", model([ARCH], [tinfo("a.weight", [-(1 << 63)], T_F32, 0)], one_data), "of size"
    yield "n_dims_zero", model([ARCH], [tinfo("a.weight", [], T_F32, 0)], one_data), "0 dimensions"
    yield "n_dims_5", model([ARCH], [tinfo("a.weight", [1, 1, 1, 1, 8], T_F32, 0)], one_data), "5 dimensions"
    yield "n_dims_huge", header(1, 0) + s("a") + struct.pack("<I", 0xFFFFFFFF) + b"\0" * 64, "dimensions"
    yield "type_removed_q4_2", model([ARCH], [tinfo("a.weight", [32], 4, 0)], one_data), "unknown type 4"
    yield "type_unknown_99", model([ARCH], [tinfo("a.weight", [32], 99, 0)], one_data), "unknown type 99"
    yield "type_unknown_max", model([ARCH], [tinfo("a.weight", [32], 0xFFFFFFFF, 0)], one_data), "unknown type"
    yield "block_size_mismatch", model([ARCH], [tinfo("a.weight", [33], T_Q4_0, 0)], pad(b"\0" * 64)), "block size"
    yield "tensor_name_64", model([ARCH], [tinfo("t" * 64, [8], T_F32, 0)], one_data), "longer than 63"
    yield "tensor_name_empty", model([ARCH], [tinfo("", [8], T_F32, 0)], one_data), "empty name"
    yield "tensor_name_huge_length", header(1, 0) + struct.pack("<Q", 1 << 62) + b"n" * 64, "tensor name length"
    yield "tensor_count_lies", header(3, 1) + ARCH + one[0] + s("b.weight") + b"\1\0", "truncated file while reading tensor dimension count"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    os.makedirs(out, exist_ok=True)
    # The valid base really is valid: the corpus test loads it as a control (it is not in the corpus).
    with open(os.path.join(os.path.dirname(os.path.abspath(out)), "valid_base.gguf"), "wb") as f:
        f.write(valid())
    names = set()
    lines = []
    for name, data, expect in cases():
        assert name not in names, name
        names.add(name)
        with open(os.path.join(out, name + ".gguf"), "wb") as f:
            f.write(data)
        lines.append(f"{name}.gguf\t{expect}\n")
    with open(os.path.join(out, "expected.tsv"), "w") as f:
        f.write("# file<TAB>substring its pg::Error message must contain (written by make_corpus.py)\n")
        f.writelines(lines)
    print(f"wrote {len(lines)} files to {out}")


if __name__ == "__main__":
    main()
