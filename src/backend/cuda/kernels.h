// Launchers of the CUDA kernels (defined in the .cu files of this folder), called by cuda_backend.cpp.
// Plain C++ types only, so the host side compiles with the project's C++ compiler and warnings.
// Every launcher is asynchronous on `stream` and checks the launch (not the kernel's completion).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pg::cuda {

// Process-wide: whether the decode-path kernels are launched with programmatic dependent launch (pdl.cuh).
// CudaBackend sets it from CudaOptions::pdl on devices of compute capability ≥ 9.0; every backend of a
// process shares it (PDL changes timing only, never results).
bool pdl_launches();
void set_pdl_launches(bool on);

// Throws pg::Error naming `what` when err is not cudaSuccess.
void check(cudaError_t err, const char* what);
// Checks cudaGetLastError() after a launch.
void check_launch(const char* kernel);
// Makes `device` current for the calling thread (cached per thread: cudaSetDevice only on a change).
void activate(int device);

// ---- matrix products ------------------------------------------------------------------------------

// y (n, M) = x (n, K) · Wᵀ with W (M, K) of type `type`, stored as GGUF blocks, row_bytes apart.
struct MatmulArgs {
  DType type = DType::F32;
  const void* w = nullptr;
  size_t row_bytes = 0;
  int64_t K = 0, M = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;  // floats between activation rows
  float* y = nullptr;
  int64_t y_stride = 0;  // floats between output rows
  int n = 0;             // activation rows
  // Grouped (mixture of experts): when expert_ids is set, output row g (0..n-1) uses the weight
  // w + expert_ids[g]·expert_bytes and activation row g / x_div.
  const int32_t* expert_ids = nullptr;
  size_t expert_bytes = 0;
  int x_div = 1;
  // Default-mode GEMM: activations rounded as act_quant_mode(type) says (kActNone: plain FP16/BF16).
  int act_quant = 0;
  // Default-mode GEMV (gemv_q8.cu): lanes per weight row, 32 (default), 16 or 8 (candidates for rows
  // whose pieces are too few to keep a whole warp's loads in flight; chosen by measurement).
  int lanes = 32;
  // Launch the 8-bit-activation GEMV with programmatic dependent launch (Hopper, CudaOptions::pdl): its
  // blocks start while the previous kernel drains and stream their weights before waiting for it.
  bool pdl = false;
  // Default-mode one-row GEMV: weight rows per warp, 1 or 2 (gemv_q8_rw2_kernel; bit-identical results).
  int rows_per_warp = 1;
  // Default-mode one-row GEMV, plain / fused GLU / grouped (CudaOptions::gemv_pipe): the persistent
  // pipelined kernel (gemv_pipe.cuh) with this many cp.async ring stages per warp (2..8) where it applies
  // (Q5_K, Q8_0, 32 lanes, 16-byte-aligned matrix); 0 = off. Bit-identical results.
  int pipe_stages = 0;
  int pipe_bps = 0;  // its blocks per SM (0: as many as fit, at most 8)
  // MMQ (2..64 rows): the block stages each superblock's activation slice in shared memory and the warps
  // read their fragments from there (mmq_staged_kernel) instead of each from global memory (mmq_kernel).
  // Bit-identical results (CudaOptions::mmq_staged).
  bool mmq_staged = true;
  // One-row GEMV (two rows per warp, fused GLU, grouped q/k/v): the block copies the activation row into
  // shared memory once and its warps read it there (gemv_q8.cu stage_act; K % 128 == 0, K ≤ 38912).
  // Bit-identical results (CudaOptions::gemv_stage_x).
  bool stage_x = true;
};

bool gemv_supported(DType t);
// FP32 on dequantized weights, any n (rows are processed in groups of up to 8).
void gemv(const MatmulArgs& a, cudaStream_t stream);

// Default-mode decode GEMV (gemv_q8.cu): 8-bit activations and integer dot products for Q4_K, Q5_K, Q6_K,
// Q8_0, Q4_0, IQ4_XS; FP32 activations for F16/BF16. Returns false, launching nothing, for other types
// and layouts it does not handle (the caller then uses gemv()). scratch: gemv_fast_scratch_bytes(a).
size_t gemv_fast_scratch_bytes(const MatmulArgs& a);
bool gemv_fast(const MatmulArgs& a, void* scratch, cudaStream_t stream, bool x_quantized = false);
// Whether gemv_fast takes a on an 8-bit-activation kernel; then quantize_q8 fills the scratch for a's
// activations and gemv_fast(..., x_quantized = true) reuses it (products sharing one input).
bool gemv_fast_q8(const MatmulArgs& a);
// Whether gemv_fast / gemv_glu / gemv_multi run a on the persistent pipelined kernel (a.pipe_stages > 0,
// one row, not grouped, 32 lanes, Q4_K/Q5_K/Q6_K/Q8_0, 16-byte-aligned matrix, shared memory that fits).
bool gemv_pipe_supported(const MatmulArgs& a);
void quantize_q8(const MatmulArgs& a, void* scratch, cudaStream_t stream);
// The 8-bit activation scratch of `rows` activation rows of width K (not grouped), as quantize_q8 writes it and
// the GEMVs / MMQ read it (act_quant.cuh describes the layout): its size (= gemv_fast_scratch_bytes of such a
// matmul) and its parts inside `scratch` (split: q8_K's MMQ operand, null unless K % 256 == 0). For producers
// that quantize their own output (RMSNorm with CudaOptions::fuse_norm_quant).
struct Q8Scratch {
  int8_t* q = nullptr;       // (rows, K)
  float* d = nullptr;        // (rows, K/32)
  int32_t* s = nullptr;      // (rows, K/32) Σq per 32
  uint4* split = nullptr;    // (rows, K/256)
};
size_t q8_scratch_bytes(int64_t rows, int64_t K);
Q8Scratch q8_scratch(void* scratch, int64_t rows, int64_t K);

// Fused decode FFN (CudaOptions::fuse_glu): gate.y (1, M) = act(x·Gᵀ) ⊙ (x·Uᵀ), G = gate.w and U = up.w
// (M, K), in one launch (after the act-quant unless x_quantized: the scratch already holds x's). act: as
// glu(). Bit-identical to gemv_fast on both + glu (same per-row sums, glu_act.cuh's expression); up.y is
// not written. Supported: one activation row of one x, not grouped, 32 lanes, the same 8-bit-activation
// type and layout (gemv_fast_q8) for both.
bool gemv_glu_supported(const MatmulArgs& gate, const MatmulArgs& up);
void gemv_glu(const MatmulArgs& gate, const MatmulArgs& up, int act, void* scratch, cudaStream_t stream, bool x_quantized = false);
// Grouped decode GEMV (CudaOptions::fuse_qkv): the products a[0..count) of one activation row, all of one
// 8-bit-activation type and K (gemv_multi_compatible with a[0]), in one launch per 4 of them over their
// concatenated rows; bit-identical to one gemv_fast each. scratch / x_quantized as for gemv_fast.
bool gemv_multi_compatible(const MatmulArgs& a, const MatmulArgs& b);
void gemv_multi(const MatmulArgs* const* a, int count, void* scratch, cudaStream_t stream, bool x_quantized = false);

// Default-mode matmul for 1..kMmqMaxRows activation rows on integer tensor cores (gemv_q8.cu: MMQ), for
// Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 with K a multiple of 256 (not grouped). The activations are the
// quantize_q8 ones in `scratch` (gemv_fast_scratch_bytes; x_quantized: already there, as for gemv_fast);
// `part` holds the split-K partials (mmq_part_bytes, may be 0 and then null).
constexpr int kMmqMaxRows = 64;
bool mmq_supported(const MatmulArgs& a);
size_t mmq_part_bytes(const MatmulArgs& a, int n_sm);
void mmq(const MatmulArgs& a, void* scratch, void* part, int n_sm, cudaStream_t stream, bool x_quantized = false);
// Grouped MMQ: the products a[0..count) (count ≤ 4) of one activation tensor, all mmq_multi_compatible with
// a[0] (one MMQ type, K, rows, and the same split plan), in one launch over their concatenated 16-row tiles
// (plus one reduce launch when K is split); each product's outputs are bit-identical to its own mmq().
// part: mmq_multi_part_bytes. glu ≥ 0 (0 SiLU, 1 GELU; count == 2, gate then up of one shape, and
// mmq_splits > 1): the reduce writes a[0].y = act(gate)·up and a[1].y = up — bit-identical to the products
// followed by the glu op.
bool mmq_multi_compatible(const MatmulArgs& a, const MatmulArgs& b, int n_sm);
size_t mmq_multi_part_bytes(const MatmulArgs* const* a, int count, int n_sm);
int mmq_splits(const MatmulArgs& a, int n_sm);
void mmq_multi(const MatmulArgs* const* a, int count, void* scratch, void* part, int n_sm, cudaStream_t stream, bool x_quantized, int glu = -1);

// The activation rounding of the CPU backend's default mode (ggml-cpu's vec_dot_type) for weights of
// type t: kActQ8_0 (32 values, FP16 scale, half-even), kActQ8_K (256 values, signed-max scale) or none.
constexpr int kActNone = 0, kActQ8_0 = 1, kActQ8_K = 2;
int act_quant_mode(DType t);
// x (n, K) → out (n, K) = the quantized-then-dequantized activations q·d (FP32, or FP16 bits with the
// rows gathered through x_rows when given). K: a multiple of 32 (of 256 for kActQ8_K).
void act_quant_f32(int mode, const float* x, int64_t x_stride, int64_t n, int64_t K, float* out, cudaStream_t stream);
void act_quant_f16(int mode, const float* x, int64_t x_stride, const int32_t* x_rows, int64_t n, int64_t K, uint16_t* out,
                   cudaStream_t stream);

bool gemm_supported(DType t);  // tensor-core path: every GEMV type except F32
// Grouped GEMM (mixture of experts): tiles[3·i .. 3·i+2] = (expert, first row, rows) in the sorted
// activation order; rows == 0 marks an unused tile. y_rows (optional) scatters output row i to y_rows[i].
struct GemmGroups {
  const int32_t* tiles = nullptr;
  int max_tiles = 0;
  size_t expert_bytes = 0;
  const int32_t* y_rows = nullptr;
};
// Rows of the tensor-core tile along the activation dimension; the MoE bookkeeping needs it.
constexpr int kGemmTileN = 128;
// Scratch the GEMM needs for n activation rows of width K (the activations converted to 16 bits).
size_t gemm_scratch_bytes(int64_t n, int64_t K);
// y = x·Wᵀ on tensor cores (FP16, or BF16 for BF16 weights), FP32 accumulation. `scratch` holds
// gemm_scratch_bytes(n, K). x_rows (optional) gathers activation row i from x row x_rows[i].
void gemm(const MatmulArgs& a, const GemmGroups* groups, const int32_t* x_rows, void* scratch, cudaStream_t stream);

// ---- L2 prefetch (prefetch.cu) -------------------------------------------------------------------------

// One slot of the prefetch table (prefetch_plan.h), in device memory: n ≤ kMaxPrefetchRegions regions
// [ptr[i], ptr[i] + bytes[i]), 16-byte aligned starts, bytes multiples of 16; n = 0: nothing to fetch.
constexpr int kMaxPrefetchRegions = 4;
struct PrefetchDesc {
  const void* ptr[kMaxPrefetchRegions];
  uint64_t bytes[kMaxPrefetchRegions];
  int32_t n;
  int32_t pad;
};
// Asks the L2 cache to fetch the regions of *desc (a device pointer, read when the kernel runs) from `blocks`
// blocks: a hint that writes nothing (CudaOptions::l2_prefetch_mb, l2_prefetch_blocks).
void l2_prefetch(const PrefetchDesc* desc, int blocks, cudaStream_t stream);

// ---- row operations -----------------------------------------------------------------------------------
// out (n, d) = dequantized rows ids[i] of table (rows of row_bytes). Out-of-range ids give NaN rows.
void get_rows(DType type, const void* table, size_t row_bytes, int64_t n_rows, int64_t d, const int32_t* ids, int n,
              float* out, int64_t out_stride, cudaStream_t stream);
// y = x / sqrt(mean(x²)+eps) · w; w may be null; w_f16 says its type. y may alias x.
// quant (optional, CudaOptions::fuse_norm_quant): the kernel also writes y's 8-bit activations, q8_0 into
// quant->q8_0 and q8_K into quant->q8_k where their q is set (Q8Scratch of rows × d; q8_0 needs d % 32 == 0,
// q8_K d % 256 == 0), bytes identical to quantize_q8 of y (act_quant.cuh). y itself is unchanged.
struct NormQuant {
  Q8Scratch q8_0, q8_k;
};
void rms_norm(const float* x, const void* w, bool w_f16, float* y, int64_t rows, int64_t d, float eps, cudaStream_t stream,
              const NormQuant* quant = nullptr);
// x (rows, d) += r (rows, d), then y (rows, d) = rms_norm(x)·w: the same arithmetic as add then rms_norm.
void add_rms_norm(float* x, const float* r, const void* w, bool w_f16, float* y, int64_t rows, int64_t d, float eps,
                  cudaStream_t stream, const NormQuant* quant = nullptr);
void add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);
void scale(float* x, float s, int64_t n, cudaStream_t stream);
void add_bias(float* y, const void* bias, bool bias_f16, int64_t rows, int64_t d, cudaStream_t stream);
// act: 0 = SiLU, 1 = GELU (tanh form, through FP16 as ggml-cpu does).
void glu(const float* gate, const float* up, float* y, int64_t n, int act, cudaStream_t stream);
void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);
void softcap(float* x, float cap, int64_t n, cudaStream_t stream);
// ids (rows) = per row the column of the highest value (ties to the lowest; see Backend::argmax_rows).
void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, cudaStream_t stream);
void gather_cols(const float* src, int64_t src_cols, int group, int col0, float* dst, int64_t dst_cols, int64_t rows,
                 cudaStream_t stream);
// theta_scale = base^(−2/n_rot), computed by the caller exactly as the CPU backend does.
void rope(float* x, int64_t x_stride, const int32_t* pos, int n, int n_heads, int head_dim, int n_rot, float theta_scale,
          bool neox, cudaStream_t stream);
// Backend::qk_norm_rope in one launch (CudaOptions::fuse_qk_norm_rope): per head of q (n, n_head*head_dim)
// and k (n, n_head_kv*head_dim), in place, rms_norm with weight q_w / k_w (F32, or F16 when *_f16; null =
// no norm for that tensor), then rope — the same arithmetic as rms_norm then rope above, bit for bit.
// head_dim ≤ kQkNormRopeMaxHeadDim (the norm of a head is then one warp, as rms_norm's for d < 512).
inline constexpr int kQkNormRopeMaxHeadDim = 256;
void qk_norm_rope(float* q, int64_t q_stride, float* k, int64_t k_stride, const void* q_w, bool q_w_f16, const void* k_w, bool k_w_f16,
                  const int32_t* pos, int n, int n_head, int n_head_kv, int head_dim, int n_rot, float theta_scale, bool neox,
                  float eps, cudaStream_t stream);

// ---- KV cache and attention -------------------------------------------------------------------------
// Writes rows of k and v (n, width) into cache cells cells[r]; kv_f16: cache element type.
void kv_store(void* k_cache, void* v_cache, bool kv_f16, const float* k, const float* v, int64_t k_width, int64_t v_width,
              const int32_t* cells, int n, cudaStream_t stream);

// Any pair of KV types (core/kv_quant.h's layout: each head in whole blocks of its type, zero-padded):
// rows r of k (n, n_head_kv·head_dim, k_stride floats apart) and v (n, n_head_kv·head_dim_v) are encoded
// into cache rows cells[r] (k_row_bytes / v_row_bytes each, k_cells / v_cells rows), bytes identical to
// the CPU backend's kv_quantize_row (kv_quant.cuh). Cells outside the cache are skipped.
struct KvStoreArgs {
  DType k_type = DType::F16, v_type = DType::F16;
  void* k_cache = nullptr;  // (k_cells, k_row_bytes) bytes
  void* v_cache = nullptr;  // (v_cells, v_row_bytes) bytes
  size_t k_row_bytes = 0, v_row_bytes = 0;
  int64_t k_cells = 0, v_cells = 0;
  const float* k = nullptr;  // (n, n_head_kv·head_dim)
  const float* v = nullptr;  // (n, n_head_kv·head_dim_v)
  int64_t k_stride = 0, v_stride = 0;
  int n_head_kv = 1, head_dim = 0, head_dim_v = 0;
  const int32_t* cells = nullptr;  // (n)
  int n = 0;
  // One warp per 32-value block / TQ3_0 group (kv_quant.cu's kv_store_typed_par_kernel) instead of one
  // thread per unit; same bytes (CudaOptions::kv_store_parallel).
  bool parallel = false;
};
void kv_store_typed(const KvStoreArgs& a, cudaStream_t stream);

constexpr int kAttnMaskWords = 4;  // = backend.h's kTreeMaskWords (checked in cuda_backend.cpp)
struct AttentionArgs {
  const float* q = nullptr;  // (n, n_head·head_dim)
  int64_t q_stride = 0;
  const void* k = nullptr;  // cache (cells, n_head_kv·head_dim)
  const void* v = nullptr;
  bool kv_f16 = true;
  // Typed caches (any KV-type pair other than F32/F32 or F16/F16; attention.cu's kvq kernel): the element
  // types and row bytes of K and V, each head in whole blocks of its type (core/kv_quant.h). A TQ3_0 K
  // rotates the query once per head; a TQ3_0 V un-rotates the output once. Not yet run on a GPU.
  bool typed = false;
  DType k_type = DType::F16, v_type = DType::F16;
  size_t k_row_bytes = 0, v_row_bytes = 0;
  const int32_t* positions = nullptr;  // (n)
  const int32_t* seq = nullptr;        // (n)
  const int32_t* block_table = nullptr;
  int block_size = 0, max_blocks = 0;
  int n = 0, max_kv_len = 0;
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;
  int sliding_window = 0;
  float softcap = 0.0f;
  float* out = nullptr;  // (n, n_head·head_dim)
  int64_t out_stride = 0;
  int kv_capacity = 0;  // > 0: size the grid for this many positions (graph capture), not max_kv_len
  int fa_blocks_per_sm = 2;
  int fa_min_split_keys = 64;  // tensor-core attention's smallest split chunk (fa::split_plan min_keys)
  // Tensor-core attention's fused split combine (CudaOptions::fa_fused_combine): fa_counters_len zeroed ints the
  // kernel counts split arrivals in and leaves zeroed; null: the separate combine kernel.
  int* fa_counters = nullptr;
  int64_t fa_counters_len = 0;  // tensor-core kernel's split-K target: blocks per SM for small grids (CudaOptions::fa_blocks_per_sm)
  // Token trees: when tree_mask is set, row r sees [begin, kv_len[r]) plus kv_len[r] + j for each set bit j
  // of tree_mask[r·kAttnMaskWords + j/32] (backend.h: AttentionBatch); else [begin, positions[r] + 1).
  const int32_t* kv_len = nullptr;     // (n)
  const uint32_t* tree_mask = nullptr;  // (n, kAttnMaskWords)
  // SIMT flash-decoding attention (attention_decode.cu, CudaOptions::fa_vec): blocks per SM its split plan
  // aims the grid at (CudaOptions::fa_vec_blocks_per_sm), and its smallest key split (fa_vec_min_chunk).
  int fa_vec_blocks_per_sm = 4;
  int fa_vec_min_chunk = 256;
  // Its K/V staging (CudaOptions::fa_vec_stages): tiles of the cp.async ring in shared memory (2..4).
  int fa_vec_stages = 2;
};
// Scratch for split-K partial results at this shape (0 when no split is needed).
size_t attention_scratch_bytes(const AttentionArgs& a, int n_sm);
void attention(const AttentionArgs& a, void* scratch, int n_sm, cudaStream_t stream);

// Prefill attention on tensor cores (attention_prefill.cu, CudaOptions::fa_prefill_min_rows): the same
// result as attention() for causal rows (no tree_mask) of an F16 cache or a typed one (every KV type pair
// without F32, read in its own blocks; typed path not yet run on a GPU: the backend routes typed caches here
// only with CudaOptions::fa_prefill_typed) with head_dim 64/128/256 and
// n_head/n_head_kv ≤ 64 (attention_prefill_supported), FP16 q·k and p·v products with FP32 accumulation
// and softmax. Scratch: attention_prefill_scratch_bytes (split-K partials, may be 0).
bool attention_prefill_supported(const AttentionArgs& a);
size_t attention_prefill_scratch_bytes(const AttentionArgs& a, int n_sm);
void attention_prefill(const AttentionArgs& a, void* scratch, int n_sm, cudaStream_t stream);

// Decode / short verification attention, SIMT flash-decoding (attention_decode.cu, CudaOptions::fa_vec): the
// result of attention() for 1..8 rows (causal, window, soft-cap, token trees) of a cache whose (K, V) types are
// F16/F16 or a typed pair of attention_decode.cu's list (K and V each F16 or Q8_0; K = V one of q4_0, q4_1, q5_0,
// q5_1, tq3_0, bf16; an F16 K with a q4_0/q4_1/q5_0/q5_1/tq3_0 V; each read in its own blocks) with head_dim
// 64/128/256 (tq3_0: 128/256) and n_head/n_head_kv ≤ 8 (attention_decode_supported), FP32 arithmetic, one block
// per (row, KV head, key split).
// Scratch: attention_decode_scratch_bytes (split partials, 0 when the plan does not split).
bool attention_decode_supported(const AttentionArgs& a);
size_t attention_decode_scratch_bytes(const AttentionArgs& a, int n_sm);
void attention_decode(const AttentionArgs& a, void* scratch, int n_sm, cudaStream_t stream);

// ---- speculative verification (spec.cu) ------------------------------------------------------------------
// Per row of x (rows, cols): the k ≤ 64 largest values' columns (descending, ties to the lower column, NaN
// never chosen) and their log-softmax (sum in double), as CpuBackend::topk_rows. ids, logprobs: (rows, k).
void topk_rows(const float* x, int64_t rows, int64_t cols, int k, int32_t* ids, float* logprobs, cudaStream_t stream);
// For i = 0..n-1 in order: cache row dst[i] ← row src[i], in both the K and the V cache (n_cells rows each).
void kv_copy(void* k_cache, void* v_cache, size_t k_row_bytes, size_t v_row_bytes, int64_t n_cells, const int32_t* src, const int32_t* dst,
             int n, cudaStream_t stream);

// ---- mixture of experts ---------------------------------------------------------------------------------
// Top-k routing of logits (n, n_expert): ids (n, k) I32 and weights (n, k), as CpuBackend::moe_route.
void moe_route(const float* logits, int n, int n_expert, int k, bool sigmoid, bool norm, float scale, int32_t* ids,
               float* weights, cudaStream_t stream);
// Groups the n·k routed entries by expert for the grouped GEMM. Writes sorted_rows[i] = the token row of
// the i-th entry in expert order, sorted_entry[i] = its entry id (r·k + j), and `tiles`
// (3·max_tiles ints, see GemmGroups). scratch: moe_sort_scratch_bytes(n_expert).
int moe_max_tiles(int n_entries, int n_expert);
size_t moe_sort_scratch_bytes(int n_expert);
void moe_sort(const int32_t* ids, int n_entries, int k, int n_expert, int32_t* sorted_rows, int32_t* sorted_entry,
              int32_t* tiles, int max_tiles, void* scratch, cudaStream_t stream);
// out (n, d) = Σ_j weights[r][j] · t[r·k + j] (summed in ascending expert id order, as the CPU does).
void moe_combine(const float* t, const int32_t* ids, const float* weights, int n, int k, int64_t d, float* out,
                 cudaStream_t stream);

// ---- Gated DeltaNet (deltanet.cu) ------------------------------------------------------------------------
// In place: alpha ← softplus(alpha + dt_bias)·a, beta ← sigmoid(beta); (rows, h).
void deltanet_gates(float* alpha, float* beta, const float* dt_bias, const float* a, int64_t rows, int h, cudaStream_t stream);
// x (rows, d): row r *= sigmoid(gate[r]).
void mul_rows_sigmoid(float* x, const float* gate, int64_t rows, int64_t d, cudaStream_t stream);

// Segments as in backend.h's RecurrentBatch, on the device: rows (Σ lengths), seg (n_segments, 4) =
// start, length, src, dst; capture (n rows) slot or −1. serial: run the segments one after another (one
// of them starts from a slot another one writes).
struct SsmConvArgs {
  const float* x = nullptr;  // (n, C)
  const void* w = nullptr;   // (C, kernel) F32 or F16
  bool w_f16 = false;
  int kernel = 0;
  float* state = nullptr;  // (slots, (kernel−1)·C)
  const int32_t *rows = nullptr, *seg = nullptr, *capture = nullptr;
  int n_segments = 0;
  bool serial = false;
  int64_t C = 0;
  bool silu = false;
  float* out = nullptr;  // (n, C)
};
void ssm_conv(const SsmConvArgs& a, cudaStream_t stream);

struct GatedDeltaArgs {
  const float *q = nullptr, *k = nullptr;  // (n, hk·d_k)
  const float* v = nullptr;                // (n, hv·d_v)
  const float *g = nullptr, *beta = nullptr;  // (n, hv)
  float* state = nullptr;                  // (slots, hv·d_k·d_v)
  const int32_t *rows = nullptr, *seg = nullptr, *capture = nullptr;
  int n_segments = 0;
  bool serial = false;
  int hk = 0, hv = 0, d_k = 0, d_v = 0;
  float scale = 1.0f;
  float* out = nullptr;  // (n, hv·d_v)
};
void gated_delta_net(const GatedDeltaArgs& a, cudaStream_t stream);

}  // namespace pg::cuda
