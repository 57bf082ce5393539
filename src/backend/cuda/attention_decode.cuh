// Host/device index helpers of the SIMT flash-decoding attention (attention_decode.cu, CudaOptions::fa_vec),
// free of CUDA types so the host emulation test (tests/cuda/test_cuda_favec_emulated.cpp) uses the very same
// functions as the kernel and the launcher.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define PG_FD_HD __host__ __device__ __forceinline__
#else
#define PG_FD_HD inline
#endif

namespace pg::cuda::fd {

constexpr int kWarps = 4;              // warps per block: each takes its own keys of the block's range
constexpr int kThreads = 32 * kWarps;  // 128
constexpr int kMaxGroup = 8;           // query heads per KV head the kernel holds in registers (GQA ≤ 8)
constexpr int kMaxRows = 8;            // batch rows per call routed here (decode of ≤ 8 sequences, short chains)
constexpr int kMaxSplits = 64;         // key splits per row (the combine holds two splits' (m, l) per lane)
constexpr int kMaxStages = 4;          // cp.async ring of the staged kernel (CudaOptions::fa_vec_stages): 2..4 tiles
// Default smallest split chunk (CudaOptions::fa_vec_min_chunk): a split below this many keys costs more in
// its fixed part and in the combine than its share of the KV read saves; contexts up to one chunk never split
// (depth 0: one launch, no combine).
constexpr int kMinChunk = 256;

// Lanes that share one key: each lane holds 8 dims (one 16-byte load of F16 K or V), so head_dim / 8
// lanes cover a head (64 → 8, 128 → 16, 256 → 32) and a warp works on 32 / that many keys at once.
PG_FD_HD constexpr int lanes_per_key(int head_dim) { return head_dim / 8; }
// The register type of the head group: the next power of two ≥ g (1, 2, 4, 8); heads g..G−1 are dead
// lanes of the loops (zero queries, never written).
PG_FD_HD constexpr int group_slots(int g) { return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : 8; }

// Split plan (host). base = blocks without splitting (rows × KV heads); fill = blocks the grid should have
// (about two per SM: 128-thread blocks with one pass over their keys need several per SM to keep enough
// loads in flight); max_kv = the launch-shape bound (max_kv_len, or the graph bucket). target: how many
// chunks split_range cuts a row's ACTUAL range into (depends on base and fill only, never on the length,
// so a grid sized for a graph bucket and an eager launch cut the real keys identically); n_splits: the
// grid's split count (≥ the non-empty chunks of any length ≤ max_kv; surplus splits find an empty range).
// min_chunk: the smallest chunk in keys (≥ 1; CudaOptions::fa_vec_min_chunk).
struct Plan {
  int n_splits = 1, target = 1, min_chunk = kMinChunk;
};
PG_FD_HD Plan split_plan(int base, int fill, int max_kv, int min_chunk = kMinChunk) {
  Plan p;
  if (min_chunk < 1) min_chunk = 1;
  p.min_chunk = min_chunk;
  int want = base >= fill ? 1 : (fill + base - 1) / base;
  if (want > kMaxSplits) want = kMaxSplits;
  const int most = (max_kv + min_chunk - 1) / min_chunk;
  p.target = want;
  p.n_splits = want < most ? want : most;
  if (p.n_splits < 1) p.n_splits = 1;
  return p;
}
// Split z's share of the keys [lo, hi): chunks of ⌈(hi − lo) / target⌉ keys rounded up to min_chunk, so at
// most min(target, ⌈(hi − lo) / min_chunk⌉) ≤ n_splits chunks are non-empty and cover the range once; the
// others get lo ≥ hi.
PG_FD_HD void split_range(int& lo, int& hi, int z, int n_splits, int target, int min_chunk = kMinChunk) {
  if (n_splits <= 1 || hi <= lo) return;
  // Ranges of ≥ 32 smallest chunks round to twice that: at depth 4096 (qwen3-8b, 64-key floor) 33 splits of
  // 128 keys took 15 µs against 21 for 64 of 64 when the grid had 33 splits (2 blocks per SM, run 42), while
  // at 512 keys 8 splits of 64 beat 4 of 128 (9.4 vs 12.8 µs). With the default grid (64 splits, half of them
  // surplus) the same cut takes 20.5 µs alone (runs 43–44), but those are L2-resident figures (one layer's
  // 16.9 MB replayed): in the model, fewer blocks did not help (run 46).
  // Decided on the ACTUAL range, so a grid sized for a graph bucket cuts like the eager launch; the chunk
  // count only shrinks, n_splits still bounds it.
  if (hi - lo >= 32 * min_chunk) min_chunk *= 2;
  int chunk = ((hi - lo) + target - 1) / target;
  chunk = (chunk + min_chunk - 1) / min_chunk * min_chunk;
  const int slo = lo + z * chunk;
  if (slo + chunk < hi) hi = slo + chunk;
  lo = slo;
}

}  // namespace pg::cuda::fd
