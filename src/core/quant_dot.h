// Tiles of weight-row × activation-row dot products for the CPU matmul (quant_dot.cpp).
//
// vec_dot (quant.h) takes one weight row and one activation row; a prefill matmul calls it for every pair
// and so decodes each weight block once per activation row. gemm_rows decodes a block once and applies
// it to several activation rows, with per-row float accumulators laid out exactly as vec_dot lays them
// out: every result is bit-identical to vec_dot(t, n, w_row, x_row) for the same pair.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pg {

// The format gemm_rows reads activation rows in for weight type t: vec_dot_type(t), except for F16 and
// BF16 weights, whose activations are F32 rows holding the F16 (BF16) rounding of the input — the same
// values vec_dot multiplies, without a conversion per weight row.
DType gemm_x_type(DType t);
// Bytes of one prepared activation row of n elements: the gemm_x_type row, followed for the 32-element
// types (Q8_0 / Q8_1 activations) by their block scales (and sums) as F32, which the tile kernels read in
// place of converting the F16 fields once per weight row. vec_dot accepts the row as it is.
size_t gemm_x_row_bytes(DType t, int64_t n);
// Converts one F32 activation row of n elements to the prepared format (gemm_x_row_bytes bytes at dst;
// for F32 weights a copy).
void gemm_prepare_x(DType t, const float* x, void* dst, int64_t n);

// y[j * y_stride + i] = vec_dot(t, n, w + i·w_stride, x[j]) for i < n_w, j < n_x, where the x[j] are
// rows prepared by gemm_prepare_x (for F32 weights: plain F32 rows). The weight rows are walked once per
// group of up to 4 activation rows (3 × 4 tiles for the float types; on CPUs with AVX-512 VNNI, 4 weight
// rows × 8 activation rows for Q8_0 / Q4_0 / Q5_0 / IQ4_NL with 16 weight rows × 1 for one activation
// row, and 2 × 8 for Q4_K / Q6_K from two activation rows up), so with many activation rows a caller should pass a block of weight rows that stays in L2 (the
// CPU backend uses ~256 KB).
void gemm_rows(DType t, int64_t n, const void* w, size_t w_stride, int64_t n_w, const void* const* x, int64_t n_x, float* y,
               int64_t y_stride);

// Turns gemm_rows's AVX-512 VNNI tiles on or off (on by default where the CPU has AVX-512 VNNI; asking for
// them elsewhere leaves them off), so that tests and benches can check the AVX2 tiles on the same machine.
// Returns whether they were on. Not meant to be flipped while another thread runs gemm_rows.
bool gemm_enable_vnni(bool on);

// True when gemm_rows has a kernel for t that shares decoded blocks between activation rows (otherwise
// it calls vec_dot once per pair).
bool gemm_has_tiles(DType t);

}  // namespace pg
