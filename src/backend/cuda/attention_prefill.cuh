// Index arithmetic of the tensor-core prefill attention (attention_prefill.cu), shared with a host test.
//
// Everything here is __host__ __device__ and free of CUDA types, so tests/cuda/test_cuda_fa_layout.cpp
// compiles it with the host compiler and checks, without a GPU, that the fragment maps compose into
// S = Q·Kᵀ and O = P·V under the PTX definitions of ldmatrix and mma.m16n8k16, and that the tile plan
// covers every (row, head) pair once. The kernel uses these functions and no private copy of them.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define PG_FA_HD __host__ __device__ __forceinline__
#else
#define PG_FA_HD inline
#endif

namespace pg::cuda::fa {

constexpr int kWarps = 4;                 // warps per block
constexpr int kThreads = 32 * kWarps;     // 128
constexpr int kRowsPerWarp = 16;          // query rows ((batch row, head) pairs) per warp: one m16 tile
constexpr int kTileM = kWarps * kRowsPerWarp;  // 64 query rows per block
constexpr int kMaxGroup = kTileM;         // query heads per KV head the kernel takes (GQA ratio)

// Keys per shared-memory tile: 64 for head sizes ≤ 128, 32 for 256 (register budget: a thread holds
// D/2 FP32 output accumulators + D/4 Q fragment words + BN/2 score registers; at D = 256 and BN = 64
// that is 128 + 64 + 32 = 224 before addresses, which spills).
constexpr int keys_per_tile(int head_dim) { return head_dim > 128 ? 32 : 64; }
// Row pitch of the K/V tiles in 16-bit elements: head_dim + 8 (16 bytes of padding), so the 8 rows an
// ldmatrix reads start 4 banks apart (pitch/4 bytes ≡ 4 mod 32 banks for head_dim a multiple of 64).
constexpr int tile_pitch(int head_dim) { return head_dim + 8; }
// Dynamic shared memory of one block: 2 stages × (K tile + V tile) × BN keys × pitch × 2 bytes.
//   D = 64:  2·2·64·72·2  = 36 864 B;  D = 128: 2·2·64·136·2 = 69 632 B;  D = 256: 2·2·32·264·2 = 67 584 B.
// (+ 768 B static row data.) H100/H200 (228 KB/SM) fit 3 blocks of any of them; sm_86/89/120 (99 KB
// per block, 100 KB/SM) one block at D ≥ 128.
constexpr int smem_bytes(int head_dim) { return 2 * 2 * keys_per_tile(head_dim) * tile_pitch(head_dim) * 2; }

// Batch rows per block for a GQA ratio g (≤ kMaxGroup): the block's kTileM query rows are the pairs
// (batch row r0 + m / g, head kvh·g + m % g), m < rows·g; heads of one KV head share its K/V tiles.
PG_FA_HD int rows_per_block(int group) { return kTileM / group; }
// Query row m of a block (0..kTileM−1) → local batch row and head within the group.
PG_FA_HD void pair_of(int m, int group, int& row, int& head) {
  row = m / group;
  head = m - row * group;
}
// Visible key range [begin, end) of a causal row at logical position pos (sliding window w, 0 = none).
PG_FA_HD void row_bounds(int pos, int window, int& begin, int& end) {
  end = pos + 1;
  begin = window > 0 && pos + 1 - window > 0 ? pos + 1 - window : 0;
}

// ---- mma.m16n8k16 fragment maps (PTX ISA, "Matrix fragments for mma.m16n8k16", 16-bit A/B, f32 C) ----
// C/D (16×8, 4 floats per lane): element e of lane l is (row c_row(l, e), column c_col(l, e)).
PG_FA_HD int c_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
PG_FA_HD int c_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }
// A (16×16, 4 registers of two halves): half h of register r of lane l is (a_row(l, r), a_col(l, r, h)).
PG_FA_HD int a_row(int lane, int r) { return (lane >> 2) + 8 * (r & 1); }
PG_FA_HD int a_col(int lane, int r, int h) { return 2 * (lane & 3) + 8 * (r >> 1) + h; }
// B (16×8, 2 registers): half h of register r of lane l is (k = b_k(l, r, h), n = b_n(l)).
PG_FA_HD int b_k(int lane, int r, int h) { return 2 * (lane & 3) + 8 * r + h; }
PG_FA_HD int b_n(int lane) { return lane >> 2; }

// ---- ldmatrix addresses ------------------------------------------------------------------------------
// ldmatrix.x4: lane l supplies the start of row (l & 7) of 8×8 matrix l >> 3; register i receives
// matrix i (non-transposed: elements (l >> 2, 2(l & 3) + h); .trans: (2(l & 3) + h, l >> 2)).
//
// Scores: K tile stored [key][dim]. For 16 keys n0.. and dims k0..k0+15 the four matrices are
// (keys n0+0..7, dims k0), (n0+0..7, k0+8), (n0+8..15, k0), (n0+8..15, k0+8): registers 0,1 are B's
// b0,b1 for keys n0..n0+7, registers 2,3 for keys n0+8..15. Lane l's row start: (key, dim) offset.
PG_FA_HD int k_ld_key(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
PG_FA_HD int k_ld_dim(int lane) { return ((lane >> 3) & 1) * 8; }
// Output: V tile stored [key][dim], read transposed. For keys k0..k0+15 and dims n0..n0+15 the four
// matrices are (keys k0+0..7, dims n0), (k0+8..15, n0), (k0+0..7, n0+8), (k0+8..15, n0+8): registers 0,1
// are b0,b1 for dims n0..n0+7, registers 2,3 for dims n0+8..15.
PG_FA_HD int v_ld_key(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
PG_FA_HD int v_ld_dim(int lane) { return (lane >> 4) * 8; }

// Score fragment → A fragment of P for the P·V product: keys 16kk..16kk+15 are score tiles 2kk and
// 2kk+1; A register r takes tile 2kk + (r >> 1), elements 2(r & 1) and 2(r & 1) + 1 (rows g / g+8 pairs).
PG_FA_HD int p_tile(int kk, int r) { return 2 * kk + (r >> 1); }
PG_FA_HD int p_elem(int r, int h) { return 2 * (r & 1) + h; }

// Split-K plan (host): how many splits the grid has (blockIdx.z) and the split target the kernel divides
// each pass's ACTUAL key range by (split_range, on the device). The target depends only on the grid of row
// tiles × KV heads and the SM count, never on the length, so a grid sized for a graph's bucket
// (kv_capacity rounded up to a power of two) and an eager launch of the exact length cut the real keys
// the same way and give the same bits; splits past the real length find an empty range and exit at once.
// (Sizing the chunks by the bucket, as before, left most splits empty and a few walking the whole context.)
struct SplitPlan {
  int n_splits = 1, target = 1;
  int min_keys = 64;  // the chunk floor split_range rounds to (kMinSplitKeys or a multiple of it)
};
constexpr int kMinSplitKeys = 64;  // smallest split chunk (one 64-key tile; two at head 256); as attention.cu
// min_keys: the smallest chunk (a multiple of kMinSplitKeys; others are rounded up to one). Decode and
// verification calls may ask for more (CudaOptions::fa_decode_min_split_keys): fewer, longer splits, so less
// partial traffic and combine work where each split would otherwise hold one 64-key tile.
PG_FA_HD SplitPlan split_plan(int base_blocks, int max_kv, int n_sm, int per_sm = 2, int min_keys = kMinSplitKeys) {
  SplitPlan s;
  // per_sm (default 2) blocks per SM: an FA block (4 warps, 16 rows each on tensor cores) has far more work
  // in flight than a SIMT decode block, so fewer of them hide the latency (CudaOptions::fa_blocks_per_sm
  // tries more: decode rows fill 4-8 of a block's 64 MMA rows, so its keys per block set the time).
  if (per_sm < 1) per_sm = 1;
  if (min_keys < kMinSplitKeys) min_keys = kMinSplitKeys;
  min_keys = (min_keys + kMinSplitKeys - 1) / kMinSplitKeys * kMinSplitKeys;
  s.min_keys = min_keys;
  const int want = base_blocks >= per_sm * n_sm ? 1 : (per_sm * n_sm + base_blocks - 1) / base_blocks;
  const int most = (max_kv + min_keys - 1) / min_keys;
  s.target = want;
  s.n_splits = want < most ? want : most;
  if (s.n_splits < 1) s.n_splits = 1;
  return s;
}
// Split z's share [lo, hi) of a pass's keys [lo, hi) (the pass range as read on the device): chunks of
// max(min_keys, ⌈(hi − lo) / target⌉ rounded up to min_keys) keys, so ⌈(hi − lo) / chunk⌉ ≤
// min(target, ⌈(hi − lo) / min_keys⌉) ≤ n_splits splits are non-empty and cover the range once; the others get
// lo ≥ hi. Chunks are multiples of 64, hence of every tile size (keys_per_tile: 32 or 64). min_keys: the
// plan's (SplitPlan::min_keys).
PG_FA_HD void split_range(int& lo, int& hi, int z, int n_splits, int target, int min_keys = kMinSplitKeys) {
  if (n_splits <= 1 || hi <= lo) return;
  int chunk = ((hi - lo) + target - 1) / target;
  chunk = (chunk + min_keys - 1) / min_keys * min_keys;
  if (chunk < min_keys) chunk = min_keys;
  const int slo = lo + z * chunk;
  if (slo + chunk < hi) hi = slo + chunk;
  lo = slo;
}

// Tree rows (AttentionBatch::tree_mask): row r sees [begin, end) with end = kv_len[r], plus end + j for
// every set bit j of its mask words (bit j of word w = draft position 32w + j). tree_hi: one past the
// highest visible position (end when no bit is set); tree_visible: whether position kp ≥ end is visible.
PG_FA_HD int tree_hi(int end, const uint32_t* mask, int words) {
  int hi = end;
  for (int w = 0; w < words; ++w)
    for (int b = 31; b >= 0; --b)
      if ((mask[w] >> b) & 1u) {
        hi = end + 32 * w + b + 1;
        break;
      }
  return hi;
}
PG_FA_HD bool tree_visible(int kp, int end, const uint32_t* mask, int words) {
  const int j = kp - end;
  return j >= 0 && j < 32 * words && ((mask[j >> 5] >> (j & 31)) & 1u);
}

}  // namespace pg::cuda::fa
