// The SIMT flash-decoding attention's own code (backend/cuda/attention_decode.cu: host split plan, kernel, split
// combine), compiled for the host against the thread-level emulation of tests/cuda/cuda_thread_shim.h, against the
// CPU backend's attention (exact mode) on the same paged cache bytes (core's kv_quantize_row: what the CPU and CUDA
// stores write): F16, Q8_0 and the mixed pairs F16/Q8_0 and Q8_0/F16, then Q4_0, Q4_1, Q5_0, Q5_1, TQ3_0, BF16 (K = V)
// and F16 K with each low-bit V; rows 1..8 of one or several sequences, head_dim
// 64/128/256, GQA 1/3/4/8, sliding window, soft-cap, token trees, depths that split and depths that do not. Also: a
// grid sized for a graph bucket (more splits, most past the real length) gives the same bits as the eager launch, and
// unsupported shapes are refused. The typed cases run a subset of the batches (VecCase::batches; every emulated
// shuffle is two barriers of 32 host threads, and the F16 cases already take minutes on a 2-core machine) chosen so
// that together they still cover every batch kind. No GPU needed; the device tests (test_cuda_favec.cpp, and every
// CUDA test with PEREGRINE_CUDA_FA_VEC=1) cover what the emulation cannot (timing, registers, the real intrinsics).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/attention_decode.cu"  // with PG_CUDA_HOST_SHIM: into pg::cuda::host_emu
#include "core/kv_quant.h"

namespace pg {
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor make(Backend& be, DType t, int64_t cols, int64_t rows, const void* data) {
  Tensor x = be.alloc(t, cols, rows);
  if (data) be.upload(x, data, x.nbytes());
  return x;
}

struct VecCase {
  int n_head, n_head_kv, head_dim, window;
  float softcap;
  int n_sm;  // the plan's SM count: with 1 the grid is "full" at once (no split), with 64 long rows split
  int stages = 2;       // AttentionArgs::fa_vec_stages: the cp.async ring's tiles (2..4)
  int block_size = 16;  // cache cells per block: a power of two (shift) or not (division)
  DType k = DType::F16, v = DType::F16;  // cache element types (F16/F16: AttentionArgs::typed false)
  uint32_t batches = ~0u;  // which of the test's batches run (bit i: batch i of the list below)
};

// Batch bits of VecCase::batches (the order of the list in KernelCodeMatchesCpu).
constexpr uint32_t kDepth0 = 1u << 0, kDepth5 = 1u << 1, kDepth329 = 1u << 2, kTwoSeqs = 1u << 3, kChain8 = 1u << 4,
                   kMixed3 = 1u << 5, kTree = 1u << 6;
constexpr DType kF16 = DType::F16, kQ8 = DType::Q8_0, kQ40 = DType::Q4_0, kQ41 = DType::Q4_1, kQ50 = DType::Q5_0, kQ51 = DType::Q5_1,
                kTq3 = DType::TQ3_0, kBf16 = DType::BF16;

class CudaFaVecEmulated : public testing::TestWithParam<VecCase> {};

std::string vec_name(const testing::TestParamInfo<VecCase>& i) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "h%d_kv%d_d%d_w%d_cap%d_sm%d_st%d_bs%d", i.param.n_head, i.param.n_head_kv, i.param.head_dim, i.param.window,
                static_cast<int>(i.param.softcap), i.param.n_sm, i.param.stages, i.param.block_size);
  std::string name = buf;
  if (i.param.k != DType::F16 || i.param.v != DType::F16) {
    // Piece by piece: GCC 12 at -O3 raises a false -Wrestrict on "_" + std::string&&.
    name += '_';
    name += kv_type_name(i.param.k);
    name += '_';
    name += kv_type_name(i.param.v);
  }
  return name;
}

TEST_P(CudaFaVecEmulated, KernelCodeMatchesCpu) {
  const VecCase c = GetParam();
  CpuOptions co;
  co.n_threads = 1;
  co.exact_f32 = true;
  CpuBackend cpu(co);
  // Two sequences: 0 with 330 cached positions (splits of 64-key chunks, the backend's default), 1 with 90;
  // shuffled blocks. (Short: every emulated shuffle is two barriers of 32 host threads.)
  const int n_seq = 2, block_size = c.block_size, lens[n_seq] = {330, 90};
  const int max_blocks = (330 + block_size - 1) / block_size, n_blocks = n_seq * max_blocks;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(5));
  auto cell = [&](int s, int p) { return table[static_cast<size_t>(s * max_blocks + p / block_size)] * block_size + p % block_size; };
  const int64_t kvw = static_cast<int64_t>(c.n_head_kv) * c.head_dim, qw = static_cast<int64_t>(c.n_head) * c.head_dim;
  const bool typed = c.k != DType::F16 || c.v != DType::F16;
  const int64_t n_cells = static_cast<int64_t>(n_blocks) * block_size;
  const size_t krb = kv_row_bytes(c.k, c.n_head_kv, c.head_dim), vrb = kv_row_bytes(c.v, c.n_head_kv, c.head_dim);
  KvLayer kv;
  kv.k = cpu.alloc(c.k, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.k, c.head_dim), n_cells);
  kv.v = cpu.alloc(c.v, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.v, c.head_dim), n_cells);
  kv.n_head_kv = c.n_head_kv, kv.head_dim = c.head_dim, kv.head_dim_v = c.head_dim;
  ASSERT_EQ(kv.k.row_bytes(), krb);
  ASSERT_EQ(kv.v.row_bytes(), vrb);
  // The cache bytes: every cell zero, then each stored position's row through core's kv_quantize_row.
  std::vector<uint8_t> kbytes(static_cast<size_t>(n_cells) * krb, 0), vbytes(static_cast<size_t>(n_cells) * vrb, 0);
  Tensor tt = make(cpu, DType::I32, max_blocks, n_seq, table.data());
  std::vector<Tensor> keep;
  auto batch_of = [&](const std::vector<int32_t>& pos, const std::vector<int32_t>& seq) {
    AttentionBatch b;
    std::vector<int32_t> cells(pos.size());
    int mx = 0;
    for (size_t i = 0; i < pos.size(); ++i) cells[i] = cell(seq[i], pos[i]), mx = std::max(mx, pos[i] + 1);
    b.n_tokens = static_cast<int>(pos.size());
    b.positions = make(cpu, DType::I32, b.n_tokens, 1, pos.data());
    b.seq = make(cpu, DType::I32, b.n_tokens, 1, seq.data());
    b.cells = make(cpu, DType::I32, b.n_tokens, 1, cells.data());
    keep.insert(keep.end(), {b.positions, b.seq, b.cells});
    b.block_table = tt;
    b.block_size = block_size;
    b.max_blocks = max_blocks;
    b.max_kv_len = mx;
    return b;
  };
  for (int s = 0; s < n_seq; ++s) {
    // Keys with a spread of scales so that the softmax is far from uniform (the max updates matter).
    auto k = randn(static_cast<size_t>(lens[s]) * static_cast<size_t>(kvw), 30 + s);
    for (size_t i = 0; i < k.size(); ++i) k[i] *= 1.0f + 2.0f * static_cast<float>((i / static_cast<size_t>(kvw)) % 7 == 3);
    const auto v = randn(static_cast<size_t>(lens[s]) * static_cast<size_t>(kvw), 40 + s);
    for (int p = 0; p < lens[s]; ++p) {
      const size_t cl = static_cast<size_t>(cell(s, p));
      kv_quantize_row(c.k, k.data() + static_cast<size_t>(p) * kvw, c.n_head_kv, c.head_dim, kbytes.data() + cl * krb);
      kv_quantize_row(c.v, v.data() + static_cast<size_t>(p) * kvw, c.n_head_kv, c.head_dim, vbytes.data() + cl * vrb);
    }
  }
  cpu.upload(kv.k, kbytes.data(), kbytes.size());
  cpu.upload(kv.v, vbytes.data(), vbytes.size());
  AttentionParams ap;
  ap.n_head = c.n_head;
  ap.n_head_kv = c.n_head_kv;
  ap.head_dim = c.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ap.sliding_window = c.window;
  ap.logit_softcap = c.softcap;

  struct B {
    const char* what;
    std::vector<int32_t> pos, seq;
    std::vector<int32_t> kv_len = {};
    std::vector<uint32_t> mask = {};
  };
  std::vector<B> batches;
  batches.push_back(B{"depth 0: one key", {0}, {1}});
  batches.push_back(B{"one row at depth 5", {5}, {0}});
  batches.push_back(B{"one row at depth 329 (splits with 4 or 16 SMs)", {329}, {0}});
  batches.push_back(B{"two sequences: seq 0 at 329, seq 1 at 89", {329, 89}, {0, 1}});
  {
    B chain{"chain of 8 rows of seq 0 at 200..207", {}, {}};
    for (int p = 200; p < 208; ++p) chain.pos.push_back(p), chain.seq.push_back(0);
    batches.push_back(chain);
    B mixed{"3 rows: seq 1 at 40, seq 0 at 300, seq 1 at 41", {40, 300, 41}, {1, 0, 1}};
    batches.push_back(mixed);
    // Tree verification: seq 0 committed [0, 320); drafts at 320..324; rows see their ancestors; a seq 1
    // row with a bit in the second mask word (committed [0, 47), sees 47 + {0, 33}).
    B tree{"tree: 5 rows of seq 0 after 320, 2 rows of seq 1", {}, {}};
    const int depth0[5] = {0, 1, 1, 2, 2};
    const uint32_t m0[5] = {0x1u, 0x3u, 0x5u, 0xdu, 0x13u};
    for (int r = 0; r < 5; ++r) {
      tree.pos.push_back(320 + depth0[r]), tree.seq.push_back(0), tree.kv_len.push_back(320);
      for (int w = 0; w < kTreeMaskWords; ++w) tree.mask.push_back(w == 0 ? m0[r] : 0u);
    }
    for (int r = 0; r < 2; ++r) {
      tree.pos.push_back(80 + r), tree.seq.push_back(1), tree.kv_len.push_back(80 - (r == 1 ? 33 : 0));
      for (int w = 0; w < kTreeMaskWords; ++w) tree.mask.push_back(r == 0 ? (w == 0 ? 0x1u : 0u) : (w == 0 ? 0x1u : w == 1 ? 0x2u : 0u));
    }
    batches.push_back(tree);
  }
  bool saw_split = false, saw_unsplit = false;
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    if (!(c.batches >> bi & 1u)) continue;
    const B& bt = batches[bi];
    SCOPED_TRACE(bt.what);
    const int n = static_cast<int>(bt.pos.size());
    const auto q = randn(static_cast<size_t>(n * qw), static_cast<uint32_t>(n + 7));
    AttentionBatch b = batch_of(bt.pos, bt.seq);
    if (!bt.kv_len.empty()) {
      b.kv_len = make(cpu, DType::I32, n, 1, bt.kv_len.data());
      b.tree_mask = make(cpu, DType::I32, kTreeMaskWords, n, bt.mask.data());
      keep.insert(keep.end(), {b.kv_len, b.tree_mask});
      int mx = 0;
      for (int r = 0; r < n; ++r)
        mx = std::max(mx, cuda::fa::tree_hi(bt.kv_len[static_cast<size_t>(r)], bt.mask.data() + static_cast<size_t>(r) * kTreeMaskWords, kTreeMaskWords));
      b.max_kv_len = mx;
    }
    Tensor qt = make(cpu, DType::F32, qw, n, q.data());
    Tensor ref = cpu.alloc(DType::F32, qw, n);
    cpu.attention(qt, kv, b, ap, ref);
    std::vector<float> out(static_cast<size_t>(n * qw), std::nanf(""));
    cuda::AttentionArgs a;
    a.q = qt.as<float>();
    a.q_stride = qw;
    a.k = kv.k.data;
    a.v = kv.v.data;
    a.kv_f16 = c.k == DType::F16;
    a.typed = typed;  // as CudaBackend::attention sets them
    a.k_type = c.k, a.v_type = c.v;
    a.k_row_bytes = krb, a.v_row_bytes = vrb;
    a.positions = b.positions.as<int32_t>();
    a.seq = b.seq.as<int32_t>();
    a.block_table = tt.as<int32_t>();
    a.block_size = block_size;
    a.max_blocks = max_blocks;
    a.n = n;
    a.max_kv_len = b.max_kv_len;
    a.n_head = c.n_head;
    a.n_head_kv = c.n_head_kv;
    a.head_dim = c.head_dim;
    a.scale = ap.scale;
    a.sliding_window = c.window;
    a.softcap = c.softcap;
    a.out = out.data();
    a.out_stride = qw;
    a.fa_vec_stages = c.stages;
    a.fa_vec_min_chunk = 64;
    if (!bt.kv_len.empty()) {
      a.kv_len = b.kv_len.as<int32_t>();
      a.tree_mask = static_cast<const uint32_t*>(b.tree_mask.data);
    }
    ASSERT_TRUE(cuda::host_emu::attention_decode_supported(a));
    const size_t sb = cuda::host_emu::attention_decode_scratch_bytes(a, c.n_sm);
    (sb ? saw_split : saw_unsplit) = true;
    std::vector<float> scratch(sb / sizeof(float) + 1, std::nanf(""));  // NaN: a partial read before written shows
    const long misaligned0 = cuda::host_emu::shim::g_misaligned.load();
    cuda::host_emu::attention_decode(a, scratch.data(), c.n_sm, nullptr);
    EXPECT_EQ(cuda::host_emu::shim::g_misaligned.load(), misaligned0) << "a cp.async with a misaligned address (the GPU faults)";
    const float* r = ref.as<float>();
    double num = 0, den = 0, worst = 0;
    size_t bad = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      if (!std::isfinite(out[i])) {
        ++bad;
        continue;
      }
      const double d = static_cast<double>(out[i]) - r[i];
      num += d * d, den += static_cast<double>(r[i]) * r[i], worst = std::max(worst, std::fabs(d));
    }
    EXPECT_EQ(bad, 0u) << "NaN/Inf or unwritten outputs";
    const double rel = std::sqrt(num / den);
    // FP32 arithmetic on the same F16 / Q8_0 values as the CPU (d·q is exact in FP32): only the summation order differs.
    EXPECT_LE(rel, 2e-5) << "max abs " << worst;
    EXPECT_LE(worst, 1e-4);
    // A grid sized for a graph's bucket (kv_capacity 1024: more splits, most of them empty) must give the
    // same bits as the eager launch: the splits cut the actual range, not the bucket.
    {
      cuda::AttentionArgs g = a;
      std::vector<float> out_g(out.size(), std::nanf(""));
      g.out = out_g.data();
      g.kv_capacity = 1024;
      const size_t sg = cuda::host_emu::attention_decode_scratch_bytes(g, c.n_sm);
      std::vector<float> scratch_g(sg / sizeof(float) + 1, std::nanf(""));
      cuda::host_emu::attention_decode(g, scratch_g.data(), c.n_sm, nullptr);
      size_t diff = 0;
      for (size_t i = 0; i < out.size(); ++i) diff += std::memcmp(&out[i], &out_g[i], sizeof(float)) != 0;
      EXPECT_EQ(diff, 0u) << "bucket-sized grid (" << sg << " scratch bytes vs " << sb << ") differs from the eager launch";
    }
    std::printf("%s: rel %.2e max abs %.2e (split scratch %zu bytes)\n", bt.what, rel, worst, sb);
    cpu.free(qt);
    cpu.free(ref);
  }
  if (c.n_sm > 1) {
    EXPECT_TRUE(saw_split) << "no batch exercised the split combine";
  }
  EXPECT_TRUE(saw_unsplit) << "no batch exercised the direct (unsplit) output";
  for (auto& t : keep) cpu.free(t);
  cpu.free(kv.k);
  cpu.free(kv.v);
  cpu.free(tt);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFaVecEmulated,
                         testing::Values(VecCase{8, 2, 128, 0, 0.0f, 16},    // qwen3-8b's GQA 4 at head 128, splits
                                         VecCase{8, 1, 64, 50, 20.0f, 16},   // GQA 8, window, softcap, splits
                                         VecCase{6, 2, 64, 0, 0.0f, 1},      // GQA 3 (slots 4, one dead), one SM
                                         VecCase{2, 2, 128, 0, 30.0f, 16},   // GQA 1, softcap
                                         VecCase{4, 1, 256, 37, 0.0f, 16},   // head 256, GQA 4, window
                                         VecCase{8, 1, 256, 200, 0.0f, 1},   // head 256, GQA 8 (U = 2), window 200 (the split bound)
                                         VecCase{8, 1, 64, 50, 20.0f, 16, 3, 24},  // three stages, block size 24
                                         VecCase{2, 2, 128, 0, 30.0f, 16, 4},      // four stages
                                         // Q8_0 caches and the mixed pairs (issue 12), each on a subset of the batches and
                                         // 4 SMs in the plan (fewer splits: fewer emulated blocks; still split at 329 keys):
                                         VecCase{8, 2, 128, 0, 0.0f, 4, 2, 16, kQ8, kQ8, kDepth0 | kDepth329 | kChain8},
                                         VecCase{8, 1, 64, 50, 20.0f, 4, 2, 16, kQ8, kQ8, kDepth0 | kDepth329 | kTree},
                                         VecCase{2, 2, 128, 0, 30.0f, 1, 2, 16, kQ8, kQ8, kDepth0 | kTwoSeqs | kTree},
                                         VecCase{4, 1, 256, 37, 0.0f, 4, 3, 24, kQ8, kQ8, kDepth0 | kMixed3 | kTree},
                                         VecCase{8, 2, 128, 0, 0.0f, 4, 2, 16, kF16, kQ8, kDepth0 | kDepth329 | kMixed3},
                                         VecCase{6, 2, 64, 0, 0.0f, 4, 4, 16, kQ8, kF16, kDepth0 | kDepth5 | kDepth329 | kChain8},
                                         // The other types (issue 12, second part): K = V, and an F16 K with a low-bit V;
                                         // one or two batches each (one split, one unsplit where the shape allows), every
                                         // head_dim the type takes, a soft-cap, a window and a tree among them.
                                         VecCase{4, 2, 128, 0, 0.0f, 4, 2, 16, kQ40, kQ40, kDepth0 | kDepth329},
                                         VecCase{2, 1, 64, 0, 20.0f, 4, 2, 16, kQ41, kQ41, kDepth5 | kDepth329},
                                         VecCase{2, 1, 256, 0, 0.0f, 4, 3, 24, kQ50, kQ50, kDepth5 | kDepth329},
                                         VecCase{2, 2, 128, 0, 30.0f, 4, 2, 16, kQ51, kQ51, kDepth5 | kDepth329},
                                         VecCase{4, 2, 128, 0, 0.0f, 4, 2, 16, kTq3, kTq3, kDepth0 | kDepth329},
                                         VecCase{2, 1, 256, 0, 30.0f, 4, 2, 16, kTq3, kTq3, kDepth5 | kDepth329},
                                         VecCase{6, 2, 64, 0, 0.0f, 4, 2, 16, kBf16, kBf16, kDepth0 | kDepth329},
                                         VecCase{8, 1, 64, 50, 20.0f, 1, 2, 16, kF16, kQ40, kDepth329},
                                         VecCase{8, 2, 128, 0, 0.0f, 1, 2, 16, kF16, kQ41, kDepth5 | kDepth329},
                                         VecCase{6, 2, 64, 0, 0.0f, 1, 2, 16, kF16, kQ50, kDepth5},
                                         VecCase{4, 1, 256, 37, 0.0f, 1, 2, 16, kF16, kQ51, kDepth329},
                                         VecCase{2, 2, 128, 0, 30.0f, 1, 2, 16, kF16, kTq3, kDepth329 | kTree}),
                         vec_name);

TEST(CudaFaVecPlan, SplitsCoverTheRangeOnce) {
  // For every length up to the bound, the non-empty splits cover [0, len) exactly once and in order, and
  // never exceed the grid's n_splits — for the eager bound (len) and a graph bucket (4096), at the default
  // smallest chunk (256) and the backend's (64, which rows of ≥ 2048 keys double).
  for (int mc : {256, 64}) {
    for (int base : {1, 8, 64}) {
      for (int len : {1, 255, 256, 257, 1000, 2047, 2048, 4096}) {
        for (int bound : {len, 4096}) {
          const cuda::fd::Plan pl = cuda::fd::split_plan(base, 4 * 132, bound, mc);
          ASSERT_GE(pl.n_splits, 1);
          ASSERT_LE(pl.n_splits, cuda::fd::kMaxSplits);
          int next = 0, used = 0;
          for (int z = 0; z < pl.n_splits; ++z) {
            int lo = 0, hi = len;
            cuda::fd::split_range(lo, hi, z, pl.n_splits, pl.target, pl.min_chunk);
            if (lo >= hi) continue;
            EXPECT_EQ(lo, next) << "chunk " << mc << " base " << base << " len " << len << " z " << z;
            next = hi, ++used;
          }
          EXPECT_EQ(next, len) << "chunk " << mc << " base " << base << " len " << len << " bound " << bound;
          // qwen3-8b's one-row plan at depth 4096: 32 splits of 128 keys (the doubled chunk), not 64 of 64.
          if (mc == 64 && base == 8 && len == 4096) {
            EXPECT_EQ(used, 32);
          }
          if (mc == 64 && base == 8 && len == 1000 && bound == 1000) {
            EXPECT_EQ(used, 16) << "64-key chunks below 2048 keys";
          }
        }
      }
    }
  }
  EXPECT_EQ(cuda::fd::split_plan(8, 528, 200).n_splits, 1) << "short contexts do not split";
}

TEST(CudaFaVecPlan, Routing) {
  alignas(16) static uint16_t buf[64];
  alignas(16) static float qbuf[64];
  cuda::AttentionArgs a;
  a.k = a.v = buf;
  a.q = qbuf;
  a.q_stride = 32 * 128;
  a.n = 1, a.n_head = 32, a.n_head_kv = 8, a.head_dim = 128, a.block_size = 16;
  EXPECT_TRUE(cuda::host_emu::attention_decode_supported(a));
  a.n = 9;
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "more than 8 rows";
  a.n = 8;
  a.head_dim = 80;
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "head 80";
  a.head_dim = 128, a.n_head = 128;
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "GQA 16";
  a.n_head = 32, a.kv_f16 = false;
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "F32 cache";
  a.kv_f16 = true;
  // Typed caches: K and V each F16 or Q8_0 with rows in core's layout; any other type is refused.
  a.typed = true, a.k_type = a.v_type = DType::Q8_0;
  a.k_row_bytes = a.v_row_bytes = kv_row_bytes(DType::Q8_0, 8, 128);
  EXPECT_TRUE(cuda::host_emu::attention_decode_supported(a)) << "q8_0 cache";
  a.k_type = DType::F16, a.k_row_bytes = kv_row_bytes(DType::F16, 8, 128);
  EXPECT_TRUE(cuda::host_emu::attention_decode_supported(a)) << "f16 K, q8_0 V";
  a.v_row_bytes += 2;
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "V rows not in the q8_0 layout";
  a.v_type = DType::Q4_0, a.v_row_bytes = kv_row_bytes(DType::Q4_0, 8, 128);
  EXPECT_TRUE(cuda::host_emu::attention_decode_supported(a)) << "f16 K, q4_0 V";
  a.k_type = DType::Q8_0, a.k_row_bytes = kv_row_bytes(DType::Q8_0, 8, 128);
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "q8_0 K, q4_0 V (no instantiation)";
  a.k_type = DType::Q4_0, a.k_row_bytes = kv_row_bytes(DType::Q4_0, 8, 128);
  EXPECT_TRUE(cuda::host_emu::attention_decode_supported(a)) << "q4_0 cache";
  a.v_type = DType::F16, a.v_row_bytes = kv_row_bytes(DType::F16, 8, 128);
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "q4_0 K, f16 V (no instantiation)";
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0, DType::BF16}) {
    a.k_type = a.v_type = t, a.k_row_bytes = a.v_row_bytes = kv_row_bytes(t, 8, 128);
    EXPECT_TRUE(cuda::host_emu::attention_decode_supported(a)) << kv_type_name(t);
  }
  a.k_type = a.v_type = DType::TQ3_0, a.head_dim = 64, a.k_row_bytes = a.v_row_bytes = kv_row_bytes(DType::TQ3_0, 8, 64);
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "tq3_0 at head_dim 64 (a padded group)";
  a.k_type = DType::F16, a.k_row_bytes = kv_row_bytes(DType::F16, 8, 64);
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "tq3_0 V at head_dim 64";
  a.head_dim = 128;
  a.k_type = a.v_type = DType::F32, a.k_row_bytes = a.v_row_bytes = kv_row_bytes(DType::F32, 8, 128);
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "f32 cache";
  a.k_type = DType::F16, a.v_type = DType::BF16, a.k_row_bytes = kv_row_bytes(DType::F16, 8, 128), a.v_row_bytes = kv_row_bytes(DType::BF16, 8, 128);
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "f16 K, bf16 V (no instantiation)";
  a.typed = false, a.k = buf + 1;
  EXPECT_FALSE(cuda::host_emu::attention_decode_supported(a)) << "misaligned cache";
  a.k = buf;
  EXPECT_THROW(cuda::host_emu::attention_decode(cuda::AttentionArgs{}, nullptr, 1, nullptr), Error);
}

}  // namespace
}  // namespace pg
