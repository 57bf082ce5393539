// The CUDA backend: every Backend op on one NVIDIA GPU, with device memory and one stream.
//
// This header is included by host code compiled with the project's C++ compiler, so it names no CUDA
// type: the stream is kept as an opaque pointer. Kernels live in the .cu files beside it (see README.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/prefetch_plan.h"

struct CUstream_st;
struct CUevent_st;

namespace pg {
namespace cuda {
struct MatmulArgs;
struct NormQuant;
class CublasGemm;  // gemm_cublas.h
void activate(int device);  // kernels.h
}

struct CudaOptions {
  // Matmuls in FP32 on dequantized weights for every batch size (the GEMV kernels, looped over groups
  // of rows), instead of FP16/BF16 tensor cores for batches above gemv_max_rows. A validation mode:
  // results then differ from CpuBackend(exact_f32) only by summation order. Also set by the
  // environment variable PEREGRINE_CUDA_EXACT=1 when the backend is created through the factory.
  bool exact_f32 = false;
  // Matmuls with at most this many activation rows use the GEMV kernels (1..8); larger ones the GEMM,
  // except that in default mode quantized weights keep 8-bit activations up to 64 rows (MMQ, or the
  // GEMV in groups of 8 rows for the types MMQ does not take).
  int gemv_max_rows = 8;
  // Decode steps recorded once and replayed as CUDA graphs (Backend::graphs_supported). Off with the
  // environment variable PEREGRINE_CUDA_GRAPHS=0 (factory), for debugging and A/B timing.
  bool graphs = true;
  // Forwards of at most this many rows replay graphs (Backend::graph_max_rows), 1..64. Default 64: decode
  // micro-batches, speculative verify forwards (chain 8 + 1 = 9 rows, DDTree 22-23 rows) and short prompt
  // chunks, one recording per row count and KV bucket. Every op those rows take (MMQ up to 64 rows, the FP16
  // GEMM, the tensor-core prefill attention at >= 32 chain rows, MoE's grouped GEMM) sizes its launch from
  // shapes only. Measured (run 39, bundled pair on the H200): DDTree 22 0.90x -> 1.01x of AR, chain unchanged.
  // Environment: PEREGRINE_CUDA_GRAPH_ROWS=<n> (factory; 8 was the default before run 39).
  int graph_max_rows = 64;
  // Lanes per weight row in the 8-bit-activation GEMV: 32 (measured default), 16 or 8 (candidates; see
  // gemv_q8.cu). Environment: PEREGRINE_GEMV_LANES (factory).
  int gemv_lanes = 32;
  // Default mode: matmuls with mmq_min_rows..64 activation rows of Q4_K/Q5_K/Q6_K/Q8_0/Q4_0 weights run
  // on integer tensor cores (MMQ, gemv_q8.cu) instead of the GEMV (below mmq_min_rows) or the FP16 GEMM
  // (above 64): the same 8-bit activations as the GEMV and the CPU, and a verification batch priced near
  // one read of the weights. 2 was measured faster than the dp4a GEMV from 2 rows up for the K-quants
  // (device run 13: qwen3-8b Q4_K_M forward of 8 rows 6.4 ms vs 13.3 ms); Q8_0/Q4_0 use MMQ from 9 rows
  // whatever this says (slower than the GEMV below). 0 turns MMQ off. Environment:
  // PEREGRINE_MMQ_MIN_ROWS (factory).
  int mmq_min_rows = 2;
  // MMQ stages each superblock's activation slice in shared memory once per block (mmq_staged_kernel,
  // gemv_q8.cu) instead of every warp reading its fragments from global memory: Nsight showed the old
  // kernel L1-bound (L1/TEX 79 %, DRAM 17 % at 22 rows). Bit-identical (CudaOps.MmqStagedBitIdentical).
  // Environment: PEREGRINE_CUDA_MMQ_STAGED=0 turns it off (factory).
  bool mmq_staged = true;
  // MMQ products of one activation tensor (matmul_shared: q/k/v; matmul_glu: gate/up) that share a type, K
  // and split plan run as ONE launch over their concatenated rows (gemv_q8.cu mmq_multi), and gate/up's
  // split-K reduce applies the GLU (no glu launch): per product bit-identical to one launch each followed
  // by the glu op (CudaOps.MmqGroupedBitIdentical). Why: at verify sizes a 1024×4096 product costs 17 µs
  // alone, most of it launch and ramp. Environment: PEREGRINE_CUDA_MMQ_GROUP=0 turns it off (factory).
  bool mmq_group = true;
  // The one-row GEMVs (two rows per warp, fused gate/up/GLU, grouped q/k/v) copy the activation row into
  // shared memory once per block (gemv_q8.cu stage_act) instead of every warp reading it from global memory:
  // Nsight showed them L1-bound (L1/TEX 78-85 %, DRAM 36-57 %); qwen35-27b and qwen3-8b Q8_0 decode +9 %,
  // qwen3-8b Q4_K_M even (gemv_q8.cu stage_ok). Bit-identical (CudaOps.GemvStageXBitIdentical).
  // Environment: PEREGRINE_CUDA_GEMV_STAGE_X=0 turns it off (factory).
  bool gemv_stage_x = true;
  // Programmatic dependent launch for the decode GEMV (compute capability ≥ 9.0; ignored below): the
  // GEMV's blocks are scheduled while the kernel before it (activation quantization, or the previous
  // GEMV sharing its activations) drains, issue their first weight loads — weights are never written
  // during a forward — and only then wait (griddepcontrol.wait) for that kernel's results, so launch
  // gap, ramp-up and tail overlap the weight stream. Inside CUDA graphs too (programmatic edges).
  // Environment: PEREGRINE_CUDA_PDL=0 turns it off (factory).
  bool pdl = true;
  // PDL for every kernel of the decode path, not only the GEMV (pdl.cuh: RMSNorm, RoPE, KV store, the
  // attention and its combine, GLU, activation quantization, Gated DeltaNet, MoE routing, top-k, ...): each
  // is scheduled while its predecessor drains and waits in griddepcontrol.wait, so the ~1-2 µs launch gap
  // per kernel boundary (~780 per qwen3-8b decode step) overlaps. Timing only: results are bit-identical.
  // Needs pdl. Process-wide (cuda::set_pdl_launches). Device run 33: every CUDA test passed with it (219/219);
  // qwen3-8b Q4_K_M tg128 231.2 -> 235.7, with the fused GEMVs 247.5 -> 257.2 (llama.cpp 257.4). On by default.
  // Environment: PEREGRINE_CUDA_PDL_ALL=0 turns it off (factory).
  bool pdl_all = true;
  // One-row decode GEMV (8-bit activations): weight rows per warp, 2 (default: a lane serves two rows
  // with each activation load and keeps twice the weight bytes in flight; device run 18: qwen3-8b Q4_K_M
  // tg128 196.1 → 207.8 tok/s, Q4_K 151936×4096 52 → 62 % of copy bandwidth) or 1; bit-identical results.
  // Environment: PEREGRINE_GEMV_RPW (factory).
  int gemv_rows_per_warp = 2;
  // Persistent, software-pipelined one-row decode GEMV (gemv_pipe.cuh, issue 11) for Q4_K/Q5_K/Q6_K/Q8_0,
  // plain, fused gate/up/GLU and grouped q/k/v: a fixed grid of blocks per SM, each warp streaming its rows
  // through a cp.async ring of gemv_pipe_stages shared-memory slots so weight bytes stay in flight across
  // row boundaries; activations staged once per block in shared memory. Same per-row summation order as
  // gemv_q8_rw2_kernel: bit-identical. Not yet measured on a GPU: off. Environment:
  // PEREGRINE_CUDA_GEMV_PIPE=1, PEREGRINE_CUDA_GEMV_PIPE_U=<stages 2..8>, PEREGRINE_CUDA_GEMV_PIPE_BPS=<blocks per SM>.
  bool gemv_pipe = false;
  int gemv_pipe_stages = 4;
  int gemv_pipe_bps = 0;
  // Prefill attention on tensor cores (attention_prefill.cu, FA2 form: mma.m16n8k16 FP16, cp.async double-
  // buffered K/V tiles) for attention calls of at least this many rows, when it applies (F16 cache, head_dim
  // 64/128/256, GQA ratio ≤ 64, no token tree; not in exact_f32 mode); other calls keep attention.cu. 0 = off.
  // Default 32: on the H200 (device run of 2026-12-02) the attention alone is 6-26x the SIMT kernel's speed at
  // 512-4096 rows, qwen3-8b Q4_K_M pp4096 2 931 -> 6 875 tok/s and pp512 at depth 4096 903 -> 3 067; decode and
  // verification steps (fewer rows, trees) stay on attention.cu. Environment: PEREGRINE_CUDA_FA_PREFILL=<rows>
  // (factory); 0 turns it off.
  int fa_prefill_min_rows = 32;
  // The same routing for typed (quantized / mixed) KV caches: attention_prefill.cu decodes the cache's blocks
  // per tile (every KV type pair without F32). On since device run 26 (H200, 2026-12-02): the typed cases of
  // tests/cuda/test_cuda_attention_prefill.cpp passed (37/37, whole models within the ≤ 4-bit bound), and the
  // attention alone at 512-4096 rows is 6.7-13x the SIMT kernel for q8_0 (pg_cuda_attn_bench --kv q8_0).
  // Environment: PEREGRINE_CUDA_FA_PREFILL_TYPED=0 turns it off (factory).
  bool fa_prefill_typed = true;
  // Decode and verification attention on tensor cores: attention calls below fa_prefill_min_rows (decode
  // rows, chain / tree verification of 2..64 rows) and every tree batch (AttentionBatch::tree_mask) go to
  // attention_prefill.cu when it takes the shape — F16 caches always, typed caches only with
  // fa_prefill_typed and only the types where it wins at decode shapes (cuda_backend.cpp
  // fa_decode_type_wins: q8_0 yes, tq3_0 no). H200, attention alone (32 q / 8 kv heads × 128): f16 1 row d4096
  // 0.027 vs 0.047 ms, d32768 0.082 vs 0.274, 22 rows d4096 0.043 vs 0.456. Device run 28 (H200, 2026-12-02):
  // its decode / tree kernel tests 37/37 and the typed-KV tests with it 47/47 passed; qwen3-8b Q4_K_M tg128 at
  // depth 4096 148.1 -> 172.7 tok/s (depth 0 218.5 -> 215.6). On by default. Environment:
  // PEREGRINE_CUDA_FA_DECODE=0 turns it off (factory).
  bool fa_decode = true;
  // Split-K of the tensor-core attention for small grids (decode, short verification batches at depth):
  // the key range is cut so that about this many blocks per SM run (attention_prefill.cuh split_plan). Each
  // value is deterministic and graph/eager-identical; values give different (equally valid) summation orders.
  // Environment: PEREGRINE_CUDA_FA_SPLIT_BLOCKS=<n> (factory). Being measured (issue 11: tg at depth).
  int fa_blocks_per_sm = 2;
  // The smallest split chunk (keys, a multiple of 64) of the tensor-core attention for calls below
  // fa_prefill_min_rows rows (decode of several sequences, verification trees): 64 cuts a 22-row tree at
  // depth 541 into 9 splits of one tile each, whose partials (64 rows × head_dim floats per block) and
  // combine outweigh the 2 MB of KV. Larger: fewer, longer splits. Environment:
  // PEREGRINE_CUDA_FA_DECODE_CHUNK=<keys> (factory). Being measured (issue 10: the verify forward).
  int fa_decode_min_split_keys = 64;
  // Split-K of the tensor-core attention without the combine launch: the last split of each (row tile, KV
  // head) to finish merges the partials with the combine kernel's own code (bit-identical; not for a TQ3_0
  // V). Why: the combine was a separate 6.4 µs launch per layer at decode (ncu, device run 32). Checked in the
  // host emulation (CudaFaEmulated), not yet on a GPU: off. Environment: PEREGRINE_CUDA_FA_FUSED_COMBINE=1.
  bool fa_fused_combine = false;
  // Decode / short verification attention (1..8 rows, F16 or Q8_0 K and V, head_dim 64/128/256, GQA ≤ 8, token trees
  // included; not in exact_f32 mode) on the SIMT flash-decoding kernel (attention_decode.cu): one block per
  // (row, KV head, key split), all query heads of a KV head in the block, 16-byte K/V loads straight from the
  // cache, FP32 online softmax, a one-warp-per-head split combine. Taken before the tensor-core route. Why:
  // the tensor-core kernel costs 25.5 µs per decode launch at depth 0 and ~37 µs with its combine at 4096
  // (issue 11). Runs 37–38 (H200): every CUDA test passes with it; with one-row calls, head_dim ≤ 128 and
  // 64-key chunks, qwen3-8b Q4_K_M tg128 269.5 → 300.5 (d0), 194.7 → 204.5 (d4096), 100.0 → 120.2 (d32768).
  // On by default within those limits (fa_vec_max_rows, fa_vec_max_head_dim). Environment:
  // PEREGRINE_CUDA_FA_VEC=0 turns it off (factory).
  bool fa_vec = true;
  // Its split plan's target: about this many blocks per SM (the key splits of a short grid). Environment:
  // PEREGRINE_CUDA_FA_VEC_BLOCKS=<n> (factory).
  int fa_vec_blocks_per_sm = 4;
  // Its smallest key split in keys (doubled for rows of ≥ 32 such chunks: fd::split_range): fewer keys per
  // split means more blocks in flight at depth, more partials for the combine. 64 won run 38's sweep (qwen3-8b, 1 row: d512 1.66×, d4096 1.29×, d32768 1.55× the
  // tensor-core route; 256 lost at d512). Environment: PEREGRINE_CUDA_FA_VEC_CHUNK=<n> (factory).
  int fa_vec_min_chunk = 64;
  // Its K/V staging: the split's keys go to shared memory through a cp.async ring of this many tiles (2..4;
  // a tile is 32 keys at head 128), so a block requests them before its first score. Run 41 (qwen3-8b tg128
  // d4096 / d32768): 2 and 3 tie (215.2 / 129.7, 216.3 / 129.2), 4 (64 KB, 3 blocks per SM) loses at 32768
  // (114.3). Environment: PEREGRINE_CUDA_FA_VEC_STAGES=<n> (factory).
  int fa_vec_stages = 2;
  // Calls of at most this many rows take it (1..8): above one row each block re-reads its KV head's keys for
  // its own row, where the tensor-core route reads them once for all rows. Environment:
  // PEREGRINE_CUDA_FA_VEC_ROWS=<n> (factory). 1: at 2 rows it ties at d32768 and loses at 4–8 rows (run 37).
  int fa_vec_max_rows = 1;
  // Heads of at most this size take it: at head_dim 256 (qwen35) it loses to the tensor-core route beyond a
  // few hundred keys (0.53–0.90×, runs 37–38). Environment: PEREGRINE_CUDA_FA_VEC_HEAD_DIM=<n> (factory).
  int fa_vec_max_head_dim = 128;
  // Typed caches on fa_vec: K and V each F16 or Q8_0 (q8_0/q8_0 and the mixed pairs), K = V one of q4_0, q4_1,
  // q5_0, q5_1, tq3_0 (head_dim 128/256), bf16, or an F16 K with a q4_0/q4_1/q5_0/q5_1/tq3_0 V (attention_decode.cu
  // reads the blocks as stored). On since device run 71 (H100, 2026-12-08): every CUDA test passed with it
  // (315/316, the one failure a graph-count check of another test) and qwen3-8b Q4_K_M tg64 at depth 4096 went
  // q8_0 199.6 -> 261.1, q4_0 183.8 -> 261.9, tq3_0 166.7 -> 230.6 tok/s (f16: 281.7). Environment:
  // PEREGRINE_CUDA_FA_VEC_TYPED=0 turns it off (factory and tests' make_cuda).
  bool fa_vec_typed = true;
  // Op profiling: every op is timed on the device with a CUDA event pair around it (the outermost op only:
  // a matmul inside matmul_shared counts as part of it) and drained by profile_take(); CUDA graphs are off
  // so that each op is its own launch. The times include launch gaps when the host falls behind, so small
  // ops read high; their sum beside the wall time shows the gaps. For `peregrine bench` per-op tables.
  // Environment: PEREGRINE_CUDA_PROFILE=1 (factory).
  bool profile = false;
  // Typed KV store (kv_quant.cu): one warp per 32-value block / TQ3_0 group (amax, min/max by shuffles,
  // the cooperative TQ3_0 rotation) instead of one thread encoding a whole unit (TQ3_0: a 128-float local
  // array and a sequential rotation per thread). Same bytes as the CPU's kv_quantize_row: device run 28 (H200,
  // 2026-12-02) passed CudaKvStore.BytesEqualCpuQuantizer/Parallel and every CudaKv* / prefill test with it
  // (79/79); qwen3-8b Q4_K_M tg128 at depth 4096: q8_0 125.2 -> 131.1, tq3_0 105.3 -> 124.1 tok/s. On by
  // default. Environment: PEREGRINE_CUDA_KV_STORE_PAR=0 turns it off (factory).
  bool kv_store_parallel = true;
  // Fused decode FFN: matmul_glu of one activation row with gate and up of the same 8-bit-activation type
  // (Q4_K/Q5_K/Q6_K/Q8_0/Q4_0/IQ4_XS) and shape, in default mode, runs as the act-quant plus ONE kernel
  // (gemv_q8.cu gemv_q8_glu_kernel: a warp owns row i of gate and of up, sums both as the two-row GEMV
  // does and writes act(g)·u) instead of the act-quant, two GEMVs and the glu kernel. Bit-identical to the
  // composition (tests/cuda/test_cuda_ops.cpp CudaFuse*). Everything else takes the composition. Why: a
  // decode step is ~21 launches per layer, each ~2-3 µs of fill/drain in a graph (issue 11). Written without
  // Device run 33 (H200, 2026-12-02): its tests passed (CudaFuse*, and every CUDA test with it on); qwen3-8b
  // Q4_K_M tg128 231.2 -> 244.2 tok/s (with fuse_qkv 247.5). On by default. Environment:
  // PEREGRINE_CUDA_FUSE_GLU=0 turns it off (factory).
  bool fuse_glu = true;
  // Grouped decode GEMV: matmul_shared of one activation row launches the products of the same
  // 8-bit-activation type as one kernel over their concatenated rows (q/k/v: one launch; wv of another type
  // than wq/wk: two), bit-identical to one launch each. Device run 33: tests passed, qwen3-8b Q4_K_M tg128
  // 231.2 -> 239.2 alone. On by default. Environment: PEREGRINE_CUDA_FUSE_QKV=0 turns it off (factory).
  bool fuse_qkv = true;
  // Backend::qk_norm_rope as one kernel (elementwise.cu qk_norm_rope_kernel): the per-head q/k RMSNorm and the
  // RoPE of q and k of an attention layer in one launch instead of up to four (issue 11: qwen3-8b decode
  // spends ~2-3 µs per launch inside the step graph, 36 layers × 3 saved launches ≈ 0.2-0.3 ms per token).
  // Bit-identical to rms_norm then rope (CudaOps.QkNormRopeFusedBitIdentical); shapes it does not take
  // (head_dim > 256, weights other than F32/F16) keep the four ops. On by default from device run 34, where
  // every CUDA test passed with it (227/227); qwen3-8b Q4_K_M tg128 255.9 -> 264.8 tok/s. Environment: PEREGRINE_CUDA_FUSE_QK_ROPE=0 turns it off.
  bool fuse_qk_norm_rope = true;
  // RMSNorm writes the next matmul's 8-bit activations (issue 11): rms_norm / add_rms_norm of ≤ kMmqMaxRows
  // rows in default mode also quantize their output y, q8_0 (width % 32 == 0) and q8_K (width % 256 == 0)
  // both (the norm cannot know the consumer's weight type; the second layout costs ~1 % of the row's bytes),
  // into two scratch buffers of their own, with act_quant.cuh's rounding (the bytes act_quant_kernel
  // writes). A matmul (the GEMV, the fused GLU / grouped q/k/v GEMVs, MMQ) whose input is exactly that y
  // (same data pointer, rows, width) then skips its act_quant launch, provided no other op ran since the
  // norm (a host-side guard: every op but the matmuls bumps an epoch, see CudaBackend::norm_q8_). Decisions
  // are made on the host, so graph capture records exactly what an eager run launches. Bit-identical to
  // the unfused path (CudaFuseNormQuant*). Off until measured on the device. Environment:
  // PEREGRINE_CUDA_FUSE_NORM_QUANT=1 (factory and tests' make_cuda).
  bool fuse_norm_quant = false;
  // MoE decode (n ≤ gemv_max_rows, default mode, Q4_K/Q5_K/Q6_K/Q8_0 experts, gemv_lanes 32) in 4 launches
  // instead of 8: act_quant(x), one gate+up+GLU kernel, act_quant(G), one down+weighted-combine kernel
  // (moe_gemv.cu; no T buffer, no combine launch). Same per-dot order, GLU and combine arithmetic as the
  // default path: bit-identical (CudaMoeFused*). Run 38 (H200): every CUDA test passes with it, qwen3-30b-a3b
  // Q4_K_M tg128 255.7 → 287.9 (d0), 197.7 → 215.5 (d4096). On by default. Environment:
  // PEREGRINE_CUDA_MOE_FUSED=0 turns it off (factory and tests' make_cuda).
  bool moe_fused = true;
  // L2 weight prefetch (prefetch_plan.h, prefetch.cu; issue 11): right after the launches of a matmul of at
  // most kMmqMaxRows rows, a one-block kernel on a side stream asks the L2 for up to this many MiB of the
  // weights of the matmul that followed this one last time (the order is learned as the forwards run), so
  // DRAM works through the small ops between two matmuls (norms, RoPE, KV store, attention) and the next
  // GEMV starts on L2 hits. A hint only: results are bit-identical with it on or off (CudaPrefetch*). 0 = off.
  // Measured SLOWER (device run 71, H100, qwen3-8b Q4_K_M tg128 at d0): 3.1 ms per token off, 9.35 ms at 16 MiB,
  // 13.9 ms at 32 MiB. The one-block kernels on the side stream form a serial chain that the graph joins at its
  // end, and one SM's bulk prefetches move only ~0.4 TB/s, so the chain (~2 GB per step) outlasts the step.
  // Kept off. l2_prefetch_blocks spreads each hint over that many blocks (run 71 had 1; not yet measured with
  // more). Environment: PEREGRINE_CUDA_L2_PREFETCH=<MiB>, PEREGRINE_CUDA_L2_PREFETCH_BLOCKS=<1..132> (factory).
  int l2_prefetch_mb = 0;
  int l2_prefetch_blocks = 16;
  // Prefill GEMM through cuBLASLt (issue 14; gemm_cublas.cu): a matmul that takes the tensor-core GEMM (the
  // branch of CudaBackend::matmul that runs cuda::gemm: more than gemv_max_rows rows, more than 64 for quantized
  // weights in default mode; not MoE's grouped GEMM, not exact_f32) with at least gemm_cublas_min_rows rows
  // instead dequantizes the whole weight matrix to FP16 (BF16 for BF16 weights; F16/BF16 are read in place)
  // into one scratch buffer and runs one cublasLtMatmul with FP32 accumulation on gemm.cu's own activation
  // operand. Why: gemm.cu's mma.sync kernel reaches ~0.4-0.8x llama.cpp's prompt speed on the H200 (qwen3-8b
  // Q4_K_M pp4096 ~3-6K vs 9.8K tok/s); cuBLAS's Hopper kernels run near the FP16 tensor-core peak, for the
  // price of writing 2 B per weight each matmul (~0.4 ms for 151936x4096), which pays only from some row count:
  // gemm_cublas_min_rows, to be measured with pg_cuda_bench --gemm. Same 16-bit operands as cuda::gemm: results
  // differ from it only in summation order (CudaGemmCublas.*). The weight scratch is sized for the largest
  // matrix seen (M*K*2 bytes: 100 MB for a 12288x4096 FFN matrix) and kept, up to gemm_cublas_max_weight_mb:
  // a larger matrix (the 151936-row output matrix of an all-rows-logits prefill: 1.2 GB) keeps cuda::gemm, so
  // the scratch stays small beside the KV cache. A 32 MiB cuBLASLt workspace too.
  // On since device run 71 (H100, 2026-12-08): every CUDA test passed with it (315/316, the failure a graph-count
  // check of the test's own setup, fixed after the run); qwen3-8b Q4_K_M pp512 7 612 -> 19 055 tok/s, pp4096
  // 6 879 -> 14 812 (-b 4096: 8 152 -> 21 250), pp512 at depth 4096 6 007 -> 11 172 (llama.cpp on the H200:
  // 9 105 / 9 779 / 8 615). pg_cuda_bench --gemm: cuBLASLt 580-700 TFLOP/s at n = 4096 against 100-180 for
  // gemm.cu; the dequantization runs at 70-97 % of copy bandwidth on the large matrices. Environment:
  // PEREGRINE_CUDA_GEMM_CUBLAS=0 turns it off, PEREGRINE_CUDA_GEMM_CUBLAS_ROWS=<rows> (factory and tests' make_cuda).
  bool gemm_cublas = true;
  int gemm_cublas_min_rows = 256;
  int gemm_cublas_max_weight_mb = 512;
};

// Number of CUDA devices visible (0 when there is no driver or no device; never throws).
int cuda_device_count();
// The environment aliases of CudaOptions' switches (PEREGRINE_CUDA_GRAPHS, PEREGRINE_CUDA_PDL, ..., each documented
// at its field), applied over opt: one list for the factory and the CUDA tests' make_cuda, so a device run can
// switch a path on or off for every command and every test alike. Not PEREGRINE_CUDA_EXACT / _PROFILE, which
// the factory applies itself (a test chooses its own mode).
void cuda_options_from_env(CudaOptions& opt);
std::unique_ptr<Backend> create_cuda_backend(int index);
std::unique_ptr<Backend> create_cuda_backend(int index, const CudaOptions& opt);

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaOptions& opt);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override;
  bool is_host() const override { return false; }
  int device() const { return device_; }
  const CudaOptions& options() const { return opt_; }
  void set_options(const CudaOptions& opt) { opt_ = opt; }
  CUstream_st* stream() const { return stream_; }

  Tensor alloc(DType t, int64_t cols, int64_t rows = 1, int64_t ne2 = 1) override;
  void free(Tensor& t) override;
  Tensor load_weight(DType t, const int64_t ne[4], const void* host_data) override;
  void upload(Tensor& dst, const void* src, size_t bytes, size_t dst_offset = 0) override;
  void download(const Tensor& src, void* dst, size_t bytes, size_t src_offset = 0) override;
  void synchronize() override;

  void get_rows(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void matmul(const Tensor& w, const Tensor& x, Tensor& y) override;
  void matmul_shared(const Tensor& x, std::initializer_list<MatmulOut> outs) override;
  // With CudaOptions::fuse_glu, one decode row: act-quant + one fused kernel (u untouched); else the default.
  void matmul_glu(const Tensor& x, const Tensor& gate_w, const Tensor& up_w, Activation act, Tensor& y, Tensor& u) override;
  void mul_rows_sigmoid(Tensor& x, const Tensor& gate) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void deltanet_gates(Tensor& alpha, Tensor& beta, const Tensor& dt_bias, const Tensor& a) override;
  void ssm_conv(const Tensor& x, const Tensor& w, Tensor& conv_state, const RecurrentBatch& rb, bool silu, Tensor& out) override;
  void gated_delta_net(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& state,
                       const RecurrentBatch& rb, int d_k, int d_v, float scale, Tensor& out) override;
  void add_bias(Tensor& y, const Tensor& bias) override;
  void rms_norm(const Tensor& x, const Tensor& w, Tensor& y, float eps) override;
  void add(const Tensor& a, const Tensor& b, Tensor& y) override;
  void add_rms_norm(Tensor& x, const Tensor& r, const Tensor& w, Tensor& y, float eps) override;  // one kernel
  void scale(Tensor& x, float s) override;
  void glu(const Tensor& gate, const Tensor& up, Tensor& y, Activation act) override;
  void rope(Tensor& x, const Tensor& pos, int n_heads, int head_dim, int n_rot, float base, RopeStyle style) override;
  // One launch with CudaOptions::fuse_qk_norm_rope (when the shapes fit), else Backend's four ops.
  void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& q_norm, const Tensor& k_norm, const Tensor& pos, int n_head, int n_head_kv,
                    int head_dim, int n_rot, float base, RopeStyle style, float eps) override;
  // Every KV type of core/kv_quant.h. F32/F32 and F16/F16 caches keep their original kernels; any other
  // pair stores through kv_quant.cu and attends through attention.cu's typed kernel (not yet run on a GPU).
  bool supports_kv_type(DType t) const override;
  void kv_store(KvLayer& kv, const Tensor& k, const Tensor& v, const AttentionBatch& batch) override;
  void attention(const Tensor& q, const KvLayer& kv, const AttentionBatch& batch, const AttentionParams& p,
                 Tensor& out) override;
  void mul_sigmoid(Tensor& x, const Tensor& gate) override;
  void softcap(Tensor& x, float cap) override;
  void argmax_rows(const Tensor& x, Tensor& ids) override;
  void topk_rows(const Tensor& x, int k, Tensor& ids, Tensor& logprobs) override;
  void kv_copy(KvLayer& kv, const Tensor& src_cells, const Tensor& dst_cells) override;
  void gather_cols(const Tensor& src, int group, int col0, Tensor& dst) override;
  void moe_route(const Tensor& logits, int k, ExpertGating gating, bool norm, float scale, Tensor& ids,
                 Tensor& weights) override;
  void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_exps, const Tensor& up_exps,
               const Tensor& down_exps, Activation act, Tensor& out) override;

  // ---- CUDA graphs (decode steps) ----
  // Ops issued between begin_capture() and end_capture() are recorded, not run; end_capture() returns the
  // id of an executable graph that replay() launches on the stream (asynchronously, like any op).
  // Inside a capture, alloc/free/upload/download/synchronize throw, and so does an op whose scratch
  // buffer would have to grow: run the same step once uncaptured first. Replays read the tensors' current
  // contents, so per-step inputs (token ids, positions, cells, block table) are uploaded before replay().
  void begin_capture();
  int end_capture();
  void replay(int graph);
  void drop_graphs();
  // The Backend graph interface (on top of the four above).
  bool graphs_supported() const override { return opt_.graphs && !opt_.profile; }
  int graph_max_rows() const override { return opt_.graph_max_rows; }
  // Executable graphs currently held (recorded and not dropped): lets tests check that a forward replayed.
  int graph_count() const;
  std::vector<OpTime> profile_take() override;
  double wait_take() override {
    const double s = wait_s_;
    wait_s_ = 0.0;
    return s;
  }
  void begin_graph() override { begin_capture(); }
  int end_graph() override { return end_capture(); }
  void abort_graph() override;
  void replay_graph(int id) override { replay(id); }
  void drop_graph(int id) override;
  bool capturing() const { return capturing_; }
  // Attention grids sized for this many cached positions (rounded up to a power of two) instead of each
  // step's AttentionBatch::max_kv_len, so that one captured graph serves every step up to that length.
  // 0 (default) = size per call.
  void set_attention_kv_capacity(int n) { attn_kv_capacity_ = n; }

  // True when matmul supports weights of type t on this backend.
  static bool supports_weight_type(DType t);
  // Device properties, for benchmarks and roofline accounting.
  std::string device_name() const;
  int multiprocessor_count() const { return n_sm_; }
  // fuse_norm_quant: how many matmul products so far read the activations a norm quantized (tests: the
  // fused path ran).
  int64_t norm_quant_hits() const { return norm_q8_hits_; }
  // moe_fused: how many moe_ffn calls took the fused kernels (tests: the path really ran).
  int64_t moe_fused_hits() const { return moe_fused_hits_; }
  // l2_prefetch_mb: prefetch kernels launched so far (tests: the path really ran).
  int64_t prefetch_launches() const { return prefetch_launches_; }
  // gemm_cublas: matmuls that ran through cuBLASLt so far (tests: the path really ran).
  int64_t gemm_cublas_calls() const { return gemm_cublas_calls_; }
  size_t total_memory() const;

 private:
  // A device buffer reused across calls; grows (stream-synchronised) only when a bigger shape appears.
  struct Scratch {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  void* scratch(int slot, size_t bytes);
  // Checked arguments of y = x·wᵀ for the kernels (shapes, types, ownership).
  cuda::MatmulArgs matmul_args(const Tensor& w, const Tensor& x, Tensor& y) const;
  void gemv(const cuda::MatmulArgs& a);  // default mode: gemv_fast where it applies, else the FP32 GEMV
  // The tensor-core GEMM branch of matmul (a.act_quant set): through cuBLASLt when CudaOptions::gemm_cublas takes
  // it, else cuda::gemm.
  void gemm(const cuda::MatmulArgs& a);
  cuda::CublasGemm* cublas_ = nullptr;  // created on first use (gemm_cublas), destroyed with the backend
  int64_t gemm_cublas_calls_ = 0;
  bool use_mmq(const cuda::MatmulArgs& a) const;
  // integer tensor cores, 8-bit activations; xs: the activation scratch to use (null: kSlotQ8's)
  void mmq(const cuda::MatmulArgs& a, bool x_quantized, void* xs = nullptr);
  // mmq_multi of a[0..count) (mmq_multi_compatible), x quantized into xs (null: kSlotQ8's) unless x_quantized;
  // glu as cuda::mmq_multi.
  void mmq_group(const cuda::MatmulArgs* const* a, int count, bool x_quantized, void* xs, int glu = -1);
  // ---- fuse_norm_quant: the host-side guard ----
  // Every op method starts with activate(device_); inside the class that name finds this member, which
  // bumps op_epoch_ (then makes the device current), so any op that may write device memory — kernels,
  // uploads, allocations — moves the epoch. The norm that quantized its output records the epoch after its
  // own bump; the matmul entry points (matmul, matmul_shared, matmul_glu) make the device current without
  // bumping (cuda::activate) and use the record only while the epoch still matches, i.e. nothing but
  // matmuls ran since the norm. A matmul whose output overlaps the recorded tensor ends the record.
  void activate(int device) const {
    ++op_epoch_;
    cuda::activate(device);
  }
  struct NormQ8 {
    uint64_t epoch = 0;  // op_epoch_ when recorded; 0 = none
    const void* data = nullptr;
    int64_t rows = 0, cols = 0;
    void* q8_0 = nullptr;  // the scratch (kSlotNormQ8_0) holding y's q8_0 activations, or null
    void* q8_k = nullptr;  // the scratch (kSlotNormQ8_K) holding y's q8_K activations, or null
  };
  // The scratch already holding a's quantized activations (the record matches a's input, width, rows and
  // rounding, and is current), else null.
  void* norm_q8_for(const cuda::MatmulArgs& a) const;
  // The norm ops: the quantized outputs to request for y (null when the fusion does not apply), and the record.
  const cuda::NormQuant* norm_q8_begin(const Tensor& y, cuda::NormQuant& nq);
  // Matmul entry: ends the record when out (written by the matmul) overlaps the recorded tensor.
  void norm_q8_written(const Tensor& out);
  mutable uint64_t op_epoch_ = 1;
  NormQ8 norm_q8_;
  mutable int64_t norm_q8_hits_ = 0;
  int64_t moe_fused_hits_ = 0;
  // ---- l2_prefetch_mb ----
  // A matmul entry point opens one PrefetchScope with the weights it reads; only the outermost scope of a
  // call (matmul_shared may fall back to matmul) acts: on entry it records the set in the plan (and, outside
  // a capture, writes the plan's dirty slots to the device table), on exit it launches the prefetch kernel
  // on the set's slot, on side_stream_ after an edge from the main stream (so it starts when this matmul's
  // launches are done and never delays the main stream). A capture that forked the side stream joins it
  // back before it ends (end_capture).
  class PrefetchScope {
   public:
    // w[0..n): the weights this matmul reads (only those load_weight made count: nothing else is prefetched).
    PrefetchScope(CudaBackend* be, int64_t rows, const Tensor* const* w, int n);
    ~PrefetchScope();
    PrefetchScope(const PrefetchScope&) = delete;
    PrefetchScope& operator=(const PrefetchScope&) = delete;

   private:
    CudaBackend* be_ = nullptr;  // null: inactive
    int slot_ = -1;              // the set's slot in the table: its successor is what the kernel fetches
  };
  // Writes the plan's dirty slots (clipped to l2_prefetch_mb) into the device table, after the side stream's
  // earlier prefetches (a running kernel never reads a slot being rewritten). Not while capturing.
  void prefetch_flush();
  // The side stream, its two events and the slot table: made on the first matmul with l2_prefetch_mb on (a
  // backend that never prefetches holds none of them; weights freed before then have nothing to clear).
  void prefetch_init();
  static constexpr int kPrefetchSlots = 4096;  // weight sets of all models on this backend (qwen3-32b: 257)
  cuda::PrefetchPlan prefetch_plan_{kPrefetchSlots};
  void* prefetch_table_ = nullptr;  // (kPrefetchSlots) cuda::PrefetchDesc, device
  void* prefetch_mirror_ = nullptr;  // (kPrefetchSlots) cuda::PrefetchDesc, pinned host: the source of the copies
  int prefetch_clip_mb_ = 0;         // the budget the device table was written with
  std::unordered_map<const void*, size_t> weight_bytes_;  // load_weight's allocations (prefetch candidates)
  int prefetch_depth_ = 0;
  CUstream_st* side_stream_ = nullptr;
  CUevent_st* fork_event_ = nullptr;  // main → side edge before each prefetch
  CUevent_st* join_event_ = nullptr;  // side → main edge at the end of a capture that forked
  bool side_forked_in_capture_ = false;
  int64_t prefetch_launches_ = 0;
  void check_own(const Tensor& t, const char* op) const;
  void sync_timed(const char* what);  // cudaStreamSynchronize, its wait added to wait_s_
  void check_not_capturing(const char* what) const;

  int device_ = 0;
  CudaOptions opt_;
  int n_sm_ = 0;
  bool pdl_capable_ = false;  // compute capability ≥ 9.0
  CUstream_st* stream_ = nullptr;
  std::vector<Scratch> scratch_;
  // Pinned staging ring for small host→device uploads: upload() copies the caller's bytes here and
  // returns at once (the caller may reuse its buffer), the copy to the device runs on the stream.
  uint8_t* stage_ = nullptr;
  size_t stage_bytes_ = 0, stage_head_ = 0;
  std::vector<CUevent_st*> stage_events_;  // one per segment of the ring: last copy out of it
  int stage_segment_ = 0;
  bool capturing_ = false;
  double wait_s_ = 0.0;  // wait_take(): host seconds blocked in download/synchronize
  int attn_kv_capacity_ = 0;
  static constexpr int64_t kFaCounters = 65536;  // attention split counters: row tiles × KV heads per call, at most
  int* fa_counters_ = nullptr;                    // (kFaCounters) zero between launches (fa_fused_combine)
  std::vector<void*> graphs_;  // cudaGraphExec_t
  // Scratch buffers replaced by a larger one while recorded graphs may still point at them: freed only
  // when no graph is left (a replay of an older graph must find its buffers alive).
  std::vector<void*> retired_scratch_;
  bool any_graph() const;
  void free_retired_scratch();

  // ---- op profiling (CudaOptions::profile) ----
  // An op method opens one scope; only the outermost scope of a call stack records (begin event on entry,
  // end event on exit, both on the stream). Pending spans are resolved when the stream is synchronised
  // anyway (download, synchronize, profile_take), so their events return to the pool.
  class ProfScope {
   public:
    ProfScope(CudaBackend* be, const char* op, std::string detail = {});  // be == nullptr: inactive, builds nothing
    ~ProfScope();
    ProfScope(const ProfScope&) = delete;
    ProfScope& operator=(const ProfScope&) = delete;

   private:
    CudaBackend* be_;
    std::string key_;
    CUevent_st* begin_ = nullptr;
  };
  bool prof_active() const { return opt_.profile && prof_depth_ == 0; }
  ProfScope profile_op(const char* op) { return ProfScope(prof_active() ? this : nullptr, op); }
  struct ProfSpan {
    std::string key;
    CUevent_st* begin;
    CUevent_st* end;
  };
  CUevent_st* prof_event();
  void prof_resolve();  // after a stream synchronisation: spans → prof_sum_, events → pool
  int prof_depth_ = 0;
  std::vector<ProfSpan> prof_pending_;
  std::vector<CUevent_st*> prof_pool_;
  std::vector<OpTime> prof_sum_;  // by key (linear lookup: a step has a few dozen distinct keys)
};

}  // namespace pg
