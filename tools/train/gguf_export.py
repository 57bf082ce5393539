"""A minimal GGUF v3 writer (numpy only) for the trained models: metadata of the types we need,
F32 / F16 / Q8_0 tensors. Q8_0 follows ggml's reference quantizer: per 32 values d = max|x|/127,
q = round-half-away-from-zero(x/d), d stored as fp16.
"""
import struct
from typing import Dict, List, Tuple

import numpy as np

GGUF_MAGIC = 0x46554747
ALIGN = 32
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(v) -> Tuple[int, bytes]:
    if isinstance(v, bool):
        return T_BOOL, struct.pack("<B", 1 if v else 0)
    if isinstance(v, int):
        return (T_U32, struct.pack("<I", v)) if 0 <= v < 2 ** 32 else (T_I64, struct.pack("<q", v))
    if isinstance(v, float):
        return T_F32, struct.pack("<f", v)
    if isinstance(v, str):
        return T_STR, _str(v)
    if isinstance(v, (list, tuple)):
        if not v:
            return T_ARR, struct.pack("<IQ", T_I32, 0)
        if all(isinstance(x, str) for x in v):
            return T_ARR, struct.pack("<IQ", T_STR, len(v)) + b"".join(_str(x) for x in v)
        if all(isinstance(x, bool) for x in v):
            return T_ARR, struct.pack("<IQ", T_BOOL, len(v)) + bytes(int(x) for x in v)
        if all(isinstance(x, int) for x in v):
            return T_ARR, struct.pack("<IQ", T_I32, len(v)) + np.asarray(v, dtype="<i4").tobytes()
        return T_ARR, struct.pack("<IQ", T_F32, len(v)) + np.asarray(v, dtype="<f4").tobytes()
    raise TypeError(f"unsupported metadata value {type(v)}")


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """x: (rows, cols) float32, cols % 32 == 0 -> raw Q8_0 blocks (rows, cols/32*34) uint8."""
    rows, cols = x.shape
    b = x.reshape(rows, cols // 32, 32).astype(np.float32)
    amax = np.abs(b).max(axis=2, keepdims=True)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    v = b * inv
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    out = np.empty((rows, cols // 32, 34), dtype=np.uint8)
    out[:, :, :2] = d.astype(np.float16).view(np.uint8).reshape(rows, cols // 32, 2)
    out[:, :, 2:] = q.view(np.uint8)
    return out.reshape(rows, -1)


def dequantize_q8_0(raw: np.ndarray, cols: int) -> np.ndarray:
    rows = raw.shape[0]
    blk = raw.reshape(rows, cols // 32, 34)
    d = blk[:, :, :2].copy().view(np.float16).astype(np.float32)
    q = blk[:, :, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(rows, cols)


def write_gguf(path: str, metadata: Dict[str, object], tensors: List[Tuple[str, np.ndarray, int]]):
    """tensors: (name, array in PyTorch (out, in) / 1-D layout, ggml type). Returns the bytes of each
    tensor as stored (for exact reference computations)."""
    stored = {}
    header = bytearray(struct.pack("<IIQQ", GGUF_MAGIC, 3, len(tensors), len(metadata)))
    for k, v in metadata.items():
        t, payload = _value(v)
        header += _str(k) + struct.pack("<I", t) + payload
    datas, offset = [], 0
    for name, arr, gtype in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        shape = arr.shape[::-1]  # ggml order: contiguous dimension first
        if gtype == GGML_F32:
            data = arr.astype("<f4").tobytes()
        elif gtype == GGML_F16:
            data = arr.astype("<f2").tobytes()
        elif gtype == GGML_Q8_0:
            data = quantize_q8_0(arr.reshape(-1, arr.shape[-1])).tobytes()
        else:
            raise ValueError(gtype)
        stored[name] = (gtype, data, arr.shape)
        header += _str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<q", d) for d in shape)
        header += struct.pack("<IQ", gtype, offset)
        datas.append(data)
        offset += (len(data) + ALIGN - 1) // ALIGN * ALIGN
    with open(path, "wb") as f:
        f.write(header)
        f.write(b"\0" * ((-len(header)) % ALIGN))
        for d in datas:
            f.write(d)
            f.write(b"\0" * ((-len(d)) % ALIGN))
    return stored


def stored_as_f32(gtype: int, data: bytes, shape) -> np.ndarray:
    """The float32 values a reader decodes from stored bytes (what the engine computes with)."""
    if gtype == GGML_F32:
        return np.frombuffer(data, dtype="<f4").reshape(shape).copy()
    if gtype == GGML_F16:
        return np.frombuffer(data, dtype="<f2").astype(np.float32).reshape(shape)
    cols = shape[-1]
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, cols // 32 * 34)
    return dequantize_q8_0(raw, cols).reshape(shape)
