// The per-KV-type pieces of CPU attention: scores q·Kⱼ and the weighted sum Σ wⱼ·Vⱼ, read straight from
// the cache's bytes in its own type (no dequantized copy of the cache), for every type of core/kv_quant.h.
// CpuBackend::attention calls these for the cache types its F16 fast path does not cover.
//
// Query format: the query stays f32 for every K type (zero-padded to the stored head width, and rotated
// for TQ3_0). llama.cpp's CPU flash attention instead converts q to the K type's vec_dot_type (Q8_0 /
// Q8_1 / F16) and takes integer dot products; we do not, because (a) it adds a second rounding (of q) on
// top of the cache's, which the accuracy numbers of docs/kv-cache-types.md would then mix in, (b) TQ3_0
// has no integer form (its levels are non-uniform floats), and (c) a head is only 64–256 values, so the
// per-key cost is the decode, not the multiply. The f32 form is also the CUDA kernels' reference.
//
// Each key's head is decoded once (into a stack buffer) and then dotted with, or accumulated into, all
// nq query heads that share that KV head (GQA), so the decode cost is shared by the group.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pg {

// q (head_dim) -> qp (kv_head_width(k, head_dim)): the query in the form kv_scores reads for K type k
// (zero tail; rotated by tq3_rotate for TQ3_0).
void kv_prepare_query(DType k, int head_dim, const float* q, float* qp);

// scores (nq, len): scores[g·len + j] = qp_g · Kⱼ, where qp (nq, width) are prepared queries and key j's
// head starts at k_base + k_offs[j] (byte offsets; a head is kv_head_bytes(k, head_dim) bytes).
void kv_scores(DType k, int head_dim, const float* qp, int nq, const uint8_t* k_base, const size_t* k_offs, int len,
               float* scores);

// acc (nq, width) += Σⱼ w[g·len + j] · Vⱼ, where width = kv_head_width(v, head_dim), w (nq, len) are the
// attention weights and value j's head starts at v_base + v_offs[j]. For TQ3_0 acc is in the rotated domain.
void kv_accumulate(DType v, int head_dim, const float* w, int nq, const uint8_t* v_base, const size_t* v_offs, int len,
                   float* acc);

// out (head_dim) = acc (kv_head_width(v, head_dim)) · scale, un-rotated for TQ3_0 (acc is overwritten).
void kv_finish_output(DType v, int head_dim, float* acc, float scale, float* out);

// Portable versions (decode with core/kv_quant's reference dequantizer, then f32 FMAs in index order):
// the reference the SIMD paths are tested against. Same arguments.
void kv_scores_scalar(DType k, int head_dim, const float* qp, int nq, const uint8_t* k_base, const size_t* k_offs,
                      int len, float* scores);
void kv_accumulate_scalar(DType v, int head_dim, const float* w, int nq, const uint8_t* v_base, const size_t* v_offs,
                          int len, float* acc);
// True when this build has a SIMD (AVX2/FMA/F16C) decode for KV type t.
bool kv_attn_has_simd(DType t);

// One query head over len keys: out (head_dim) = softmax(scale · q·Kᵀ) · V with the kernels above (two
// passes, double sum, as CpuBackend::attention). For tests and the accuracy measurements; throws pg::Error
// for types check_kv_types rejects.
void kv_attention_head(DType k, DType v, int head_dim, const float* q, const uint8_t* k_base, const size_t* k_offs,
                       const uint8_t* v_base, const size_t* v_offs, int len, float scale, float* out);

}  // namespace pg
