// Block formats of the quantized weight types, their reference (de)quantizers, and the CPU dot
// products used by matrix-vector kernels.
//
// The CPU computes W·x the way llama.cpp does: the activation row x is first converted to the weight
// type's vec_dot_type (F32, F16, BF16, Q8_0, Q8_1 or Q8_K), then an integer / half dot product runs on
// the raw blocks. That reproduces llama.cpp's "native" numbers (see shared/golden/README.md §3).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pg {

// ---- block layouts (identical to GGML's, so GGUF bytes are used as they are) -------------------
constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32, QK4_NL = 32;
constexpr int QK_K = 256, K_SCALE_SIZE = 12;

#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[QK4_1 / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[QK8_0]; };
struct BlockQ8_1 { uint16_t d, s; int8_t qs[QK8_1]; };
struct BlockQ2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
struct BlockIQ4_NL { uint16_t d; uint8_t qs[QK4_NL / 2]; };
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36 && sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);

// The 16 non-uniform levels of IQ4_NL / IQ4_XS.
extern const int8_t kIQ4NLValues[16];

// ---- per-type operations -----------------------------------------------------------------------
// Reference dequantization of n elements (n a multiple of the block size) to f32. All supported types.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Reference quantization of n floats into blocks of type t (ggml's reference rounding rules).
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, Q4_K, Q5_K, Q6_K (and more where
// implemented); throws pg::Error for the others.
void quantize_row(DType t, const float* src, void* dst, int64_t n);
bool can_quantize(DType t);

// The type the activation row is converted to before a dot product with a row of weight type t.
DType vec_dot_type(DType t);

// Dot product of one weight row (type t) with one activation row already converted to
// vec_dot_type(t); n elements. Fast SIMD path where available, identical results to ggml's up to
// float summation order.
float vec_dot(DType t, int64_t n, const void* w_row, const void* x_row);

// ---- additions: weight quantization as llama-quantize does it, and the portable paths ----------

// Note on quantize_row: it is ggml-cpu's from_float for t, i.e. what the matmul applies to activations
// and the KV cache to its rows. Q8_0/Q8_1 follow the activation rule of golden README §3 (multiplier
// 127/amax, ties to even) and Q8_K its §3 rule, byte-exact with the golden kernels/*.xq.bin; the other
// types use the same reference quantizers as quantize_weights (IQ4_NL with ggml's single-guess scale).
// It does not scan for NaN/Inf (hot path); non-finite input gives unspecified blocks, never a crash.

// Quantizes model weights the way llama-quantize does without an importance matrix (ggml_quantize_chunk),
// so the bytes equal those of the files it writes. Differs from quantize_row only where ggml's
// model-file quantizer differs from its activation converter: Q8_0/Q8_1 use the reference rounding
// (scale 1/d, ties away from zero) and IQ4_NL runs the full ±7 scale search. Rows are independent
// blocks, so callers may split a tensor into row ranges and quantize them on several threads.
// Throws pg::Error for NaN/Inf input, for n not a multiple of the block size, and for types
// can_quantize() rejects.
void quantize_weights(DType t, const float* src, void* dst, int64_t n);

// Portable scalar versions of quantize_row and vec_dot. The SIMD paths must agree with them (bytes for
// quantize_row except NaN payloads, float-summation-order precision for vec_dot); exposed for tests
// and benchmarks.
void quantize_row_scalar(DType t, const float* src, void* dst, int64_t n);
float vec_dot_scalar(DType t, int64_t n, const void* w_row, const void* x_row);
// True when this build has a SIMD (AVX2/FMA/F16C) vec_dot for weight type t.
bool vec_dot_has_simd(DType t);

}  // namespace pg
