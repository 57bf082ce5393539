// KV-cache element formats: which types a K or V cache may store, how one token's row of n_head_kv heads
// is laid out in a type, the row codecs, and TQ3_0 (its block format, its fixed rotation and the reference
// quantizer / dequantizer). docs/kv-cache-types.md has the sizes and the measured accuracy of each type.
//
// The GGML block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) use core/quant's quantize_row, i.e. ggml-cpu's
// from_float — what llama.cpp applies when it writes a quantized KV cache — so their bytes are GGML's.
// TQ3_0 is our own internal format: the block layout is the reference fork's (32 values in 14 bytes,
// 128-value groups, same codebook and index packing), but the sign tables are ours (rule in kv_quant.cpp),
// so its bytes are not the fork's GGML_TYPE_TQ3_0 (id 42). KV formats live only in the cache (RAM, VRAM,
// the prefix cache's disk files); they never appear in GGUF weight files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace pg {

// ---- which types -------------------------------------------------------------------------------

// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, TQ3_0.
bool is_kv_type(DType t);
// Lower-case name as the command line spells it ("q8_0", "tq3_0").
std::string kv_type_name(DType t);
// "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, tq3_0": for messages.
std::string kv_type_list();
// Parses a --cache-type-k / --cache-type-v value, case-insensitive. Throws pg::Error that names the
// accepted types for anything else (a weight-only type such as q4_k included).
DType parse_kv_type(std::string_view name);

// ---- layout of one head in one token's row ----------------------------------------------------
//
// A row is one token's K (or V) of one layer: n_head_kv heads one after the other. Attention reads a
// head at a time, so each head is stored in whole blocks: head_dim is rounded up to kv_head_granule(t)
// (1 for F32/F16/BF16, 32 for the GGML block types, 128 for TQ3_0 — its rotation group) and the tail
// is zero-padded. Every model in docs/kv-cache-types.md has head_dim 64, 128 or 256, so there is no
// padding for the GGML block types, and none for TQ3_0 at 128 / 256. A head_dim that is not a multiple
// of the granule (stories260K: 8; head_dim 64 with TQ3_0) still works, at the cost of the padding bytes
// (kv_bits_per_value says how much); llama.cpp refuses those instead.

int kv_head_granule(DType t);
// Stored values per head: head_dim rounded up to the granule.
int kv_head_width(DType t, int head_dim);
// Bytes of one head, and of one token's row of n_head_kv heads.
size_t kv_head_bytes(DType t, int head_dim);
size_t kv_row_bytes(DType t, int n_head_kv, int head_dim);
// Storage bits per real value, padding included (TQ3_0 at head_dim 128: 3.5).
double kv_bits_per_value(DType t, int head_dim);

// The largest head_dim the kernels accept (their per-head scratch lives on the stack).
constexpr int kKvMaxHeadDim = 1024;

// Throws pg::Error unless k and v are KV types and head_dim is in 1..kKvMaxHeadDim. Every (K, V) pair
// of KV types is allowed on the CPU (a TQ3_0 K rotates the query, a TQ3_0 V un-rotates the output).
void check_kv_types(DType k, DType v, int head_dim);

// ---- row codecs ----------------------------------------------------------------------------------

// One token's row: src (n_head_kv, head_dim) f32 -> dst (kv_row_bytes). Non-finite input gives
// unspecified values (never a crash), as quantize_row does.
void kv_quantize_row(DType t, const float* src, int n_head_kv, int head_dim, void* dst);
// One stored head -> dst (kv_head_width(t, head_dim)) floats in the storage domain: for TQ3_0 that is the
// rotated domain (what attention dots the rotated query with), padding included. Any bytes are valid
// input (NaN/Inf norms decode to NaN/Inf values).
void kv_dequantize_head(DType t, const void* src, int head_dim, float* dst);
// A whole row back to the original domain: dst (n_head_kv, head_dim). TQ3_0 is un-rotated here; this is
// the round trip that the accuracy numbers measure, and the way to convert a cache between types.
void kv_decode_row(DType t, const void* src, int n_head_kv, int head_dim, float* dst);

// ---- TQ3_0 -----------------------------------------------------------------------------------------
//
// Per group of 128 values x (one head, or a 128-slice of it):
//   n = ‖x‖₂;  u = R(x / n) with R(v) = s2 ⊙ H(s1 ⊙ v) / √128 (H the 128-point Walsh–Hadamard matrix,
//   s1, s2 fixed ±1 vectors); idx_i = nearest of 8 Lloyd–Max centroids c (unit-norm-128 scale) found
//   through the 7 decision mids; stored norm = n / ‖c[idx]‖₂ (the "norm correction": the decoded group has
//   norm n). Decoding is c[idx_i] · norm, in the rotated domain. R is orthogonal, so q·k = R(q)·R(k): a
//   TQ3_0 K cache needs the query rotated by tq3_rotate, and a TQ3_0 V cache gives Σ wⱼ R(vⱼ), which
//   tq3_rotate_inverse turns into the output.
constexpr int kTq3Block = 32;   // values per 14-byte block
constexpr int kTq3Group = 128;  // values per rotation group (4 blocks; each block repeats the group's norm)

#pragma pack(push, 1)
// Value j of the block has index idx = low2 + 4·hi1, low2 at bits 2·(j%4) of qs[j/4], hi1 at bit j%8 of
// signs[j/8] (the fork's packing).
struct BlockTQ3_0 {
  uint16_t norm;     // fp16, the group's corrected norm (the same in its 4 blocks)
  uint8_t qs[8];     // low 2 bits of each index
  uint8_t signs[4];  // high bit of each index
};
#pragma pack(pop)
static_assert(sizeof(BlockTQ3_0) == 14);

extern const float kTq3Centroids[8];  // ascending; index i -> kTq3Centroids[i]
extern const float kTq3Mids[7];       // kTq3Mids[i] = decision boundary between centroid i and i + 1
// The fixed sign vectors: which = 0 gives s1, 1 gives s2; 128 entries of +1 or -1.
const float* tq3_signs(int which);

// In place, per group of 128 (n a multiple of 128): x <- R(x) ("rotate_query": applied to the query of a
// TQ3_0 K cache), and x <- R⁻¹(x) = s1 ⊙ H(s2 ⊙ x) / √128 (applied to the attention output of a TQ3_0 V
// cache). Throws pg::Error for other n.
void tq3_rotate(float* x, int64_t n);
void tq3_rotate_inverse(float* x, int64_t n);
// Reference quantizer: n values (a multiple of 128) -> n / 32 blocks.
void tq3_quantize(const float* x, BlockTQ3_0* y, int64_t n);
// Reference dequantizer: n / 32 blocks -> n values (a multiple of 32) in the rotated domain.
void tq3_dequantize(const BlockTQ3_0* y, float* x, int64_t n);

}  // namespace pg
