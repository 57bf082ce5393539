// The tensor-core prefill attention's own code (backend/cuda/attention_prefill.cu: host plan, kernel,
// split-K combine), compiled for the host against the thread-level emulation of tests/cuda/
// cuda_thread_shim.h, against the CPU backend's attention (exact mode) on the same cache: F16, and typed
// caches (q8_0, q4_0, q4_1, q5_0, q5_1, bf16, tq3_0, mixed pairs, TQ3_0 padded at head 64) whose blocks
// the kernel decodes tile by tile into its F16 tiles (the CPU decodes the same bytes). No GPU: runs in CI
// wherever the CUDA backend is configured. This catches errors of the kernel's logic — row tiling and
// GQA packing, per-sequence passes, causal / sliding-window masks, the cp.async double buffer (copies
// land only at their wait: a tile read too early is NaN), online softmax, the output and partial
// layouts, the combine — before the kernel ever runs on a device. It cannot catch what the emulation
// assumes (the hardware's ldmatrix/mma semantics, which are emulated from the PTX tables, timing,
// register limits): tests/cuda/test_cuda_attention_prefill.cpp on the GPU covers those.
// Small shapes: every CUDA thread is a host thread and every warp intrinsic a barrier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/attention_prefill.cu"  // with PG_CUDA_HOST_SHIM: into pg::cuda::host_emu
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

struct EmuCase {
  int n_head, n_head_kv, head_dim, window;
  float softcap;
  int n_sm;  // the plan's SM count: small grids below 2·n_sm blocks split the keys (split-K)
  DType k = DType::F16, v = DType::F16;  // cache types (F16/F16: the untyped kernel; else the typed one)
};

class CudaFaEmulated : public testing::TestWithParam<EmuCase> {};

std::string emu_name(const testing::TestParamInfo<EmuCase>& i) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "h%d_kv%d_d%d_w%d_cap%d_sm%d", i.param.n_head, i.param.n_head_kv, i.param.head_dim, i.param.window,
                static_cast<int>(i.param.softcap), i.param.n_sm);
  std::string name = buf;
  if (i.param.k != DType::F16 || i.param.v != DType::F16) name = kv_type_name(i.param.k) + "_" + kv_type_name(i.param.v) + "_" + name;
  return name;
}

TEST_P(CudaFaEmulated, KernelCodeMatchesCpu) {
  const EmuCase c = GetParam();
  CpuOptions co;
  co.n_threads = 1;
  co.exact_f32 = true;
  CpuBackend cpu(co);
  // Two sequences: 0 with 700 cached positions, 1 with 90; blocks of 16 cells in a shuffled order.
  const int n_seq = 2, block_size = 16, lens[n_seq] = {700, 90};
  const int max_blocks = (700 + block_size - 1) / block_size, n_blocks = n_seq * max_blocks;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(3));
  auto cell = [&](int s, int p) { return table[static_cast<size_t>(s * max_blocks + p / block_size)] * block_size + p % block_size; };
  const int64_t kvw = static_cast<int64_t>(c.n_head_kv) * c.head_dim, qw = static_cast<int64_t>(c.n_head) * c.head_dim;
  const bool typed = !(c.k == DType::F16 && c.v == DType::F16);
  KvLayer kv;
  // Each head in whole blocks of its type (kv_head_width: TQ3_0 pads head 64 to its 128-value group).
  kv.k = cpu.alloc(c.k, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.k, c.head_dim), static_cast<int64_t>(n_blocks) * block_size);
  kv.v = cpu.alloc(c.v, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.v, c.head_dim), static_cast<int64_t>(n_blocks) * block_size);
  if (typed) kv.n_head_kv = c.n_head_kv, kv.head_dim = c.head_dim, kv.head_dim_v = c.head_dim;
  ASSERT_EQ(kv.k.row_bytes(), kv_row_bytes(c.k, c.n_head_kv, c.head_dim));
  ASSERT_EQ(kv.v.row_bytes(), kv_row_bytes(c.v, c.n_head_kv, c.head_dim));
  {  // defined bytes in the cells no sequence writes (alloc does not promise zeros)
    const std::vector<uint8_t> zk(kv.k.nbytes(), 0), zv(kv.v.nbytes(), 0);
    cpu.upload(kv.k, zk.data(), zk.size());
    cpu.upload(kv.v, zv.data(), zv.size());
  }
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
    std::vector<int32_t> pos, seq;
    for (int p = 0; p < lens[s]; ++p) pos.push_back(p), seq.push_back(s);
    const auto k = randn(pos.size() * static_cast<size_t>(kvw), 10 + s), v = randn(pos.size() * static_cast<size_t>(kvw), 20 + s);
    Tensor kt = make(cpu, DType::F32, kvw, static_cast<int64_t>(pos.size()), k.data());
    Tensor vt = make(cpu, DType::F32, kvw, static_cast<int64_t>(pos.size()), v.data());
    cpu.kv_store(kv, kt, vt, batch_of(pos, seq));
  }
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
    std::vector<int32_t> kv_len = {};  // tree rows only (empty: causal rows)
    std::vector<uint32_t> mask = {};   // (n, kTreeMaskWords) tree mask words
  };
  std::vector<B> batches;
  {
    B b{"prefill chunk after depth 600 (seq 0), 37 rows", {}, {}};
    for (int p = 600; p < 637; ++p) b.pos.push_back(p), b.seq.push_back(0);
    batches.push_back(b);
    B m{"two sequences in one tile: seq 1 rows 0..19, seq 0 rows 680..699, then seq 1 again", {}, {}};
    for (int p = 0; p < 20; ++p) m.pos.push_back(p), m.seq.push_back(1);
    for (int p = 680; p < 700; ++p) m.pos.push_back(p), m.seq.push_back(0);
    for (int p = 60; p < 70; ++p) m.pos.push_back(p), m.seq.push_back(1);
    batches.push_back(m);
    B one{"one row at depth 699", {699}, {0}};
    batches.push_back(one);
    B dec{"decode rows of both sequences: seq 0 at 699, seq 1 at 89", {699, 89}, {0, 1}};
    batches.push_back(dec);
    B chain{"chain verification: 6 rows of seq 0 at 650..655", {}, {}};
    for (int p = 650; p < 656; ++p) chain.pos.push_back(p), chain.seq.push_back(0);
    batches.push_back(chain);
    // Tree verification: seq 0 committed [0, 690); drafts stored at 690..694 (RoPE positions 690 + depth);
    // rows see their ancestors: 0 {0}, 1 {0,1}, 2 {0,2}, 3 {0,2,3}, 4 {0,1,4}, plus a seq 1 tree of 2 rows
    // (committed [0, 80), drafts at 80, 81: {0}, {0,1}) and a bit in the second mask word.
    B tree{"tree verification: 5 rows of seq 0 after 690, 2 rows of seq 1 after 80", {}, {}};
    const int depth0[5] = {0, 1, 1, 2, 2};
    const uint32_t m0[5] = {0x1u, 0x3u, 0x5u, 0xdu, 0x13u};
    for (int r = 0; r < 5; ++r) {
      tree.pos.push_back(690 + depth0[r]), tree.seq.push_back(0), tree.kv_len.push_back(690);
      for (int w = 0; w < kTreeMaskWords; ++w) tree.mask.push_back(w == 0 ? m0[r] : 0u);
    }
    for (int r = 0; r < 2; ++r) {
      tree.pos.push_back(80 + r), tree.seq.push_back(1), tree.kv_len.push_back(80 - (r == 1 ? 33 : 0));
      // row 1: committed [0, 47), sees 47 + {0, 33} (word 1 bit 1): positions 47 and 80
      for (int w = 0; w < kTreeMaskWords; ++w) tree.mask.push_back(r == 0 ? (w == 0 ? 0x1u : 0u) : (w == 0 ? 0x1u : w == 1 ? 0x2u : 0u));
    }
    batches.push_back(tree);
  }
  for (const B& bt : batches) {
    SCOPED_TRACE(bt.what);
    const int n = static_cast<int>(bt.pos.size());
    const auto q = randn(static_cast<size_t>(n * qw), static_cast<uint32_t>(n + 5));
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
    a.typed = typed;
    a.k_type = c.k;
    a.v_type = c.v;
    a.k_row_bytes = kv.k.row_bytes();
    a.v_row_bytes = kv.v.row_bytes();
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
    if (!bt.kv_len.empty()) {
      a.kv_len = b.kv_len.as<int32_t>();
      a.tree_mask = static_cast<const uint32_t*>(b.tree_mask.data);
    }
    ASSERT_TRUE(cuda::host_emu::attention_prefill_supported(a));
    std::vector<float> scratch(cuda::host_emu::attention_prefill_scratch_bytes(a, c.n_sm) / sizeof(float) + 1, std::nanf(""));
    const long misaligned0 = cuda::host_emu::shim::g_misaligned.load();
    cuda::host_emu::attention_prefill(a, scratch.data(), c.n_sm, nullptr);
    EXPECT_EQ(cuda::host_emu::shim::g_misaligned.load(), misaligned0) << "misaligned cp.async (a fault on the device)";
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
    // F16: q and p rounded to FP16. Typed: the decoded K/V values are rounded to FP16 as well (the CPU
    // uses the same decoded values in FP32), one more 2⁻¹² relative per operand: the same bound holds.
    EXPECT_LE(rel, 2e-3) << "max abs " << worst;
    EXPECT_GT(rel, 0.0) << "exactly the FP32 result: FP16 rounding should show";
    // A grid sized for a graph's bucket (kv_capacity 4096: more splits, most past the real length) must
    // give the same bits as the eager launch: the splits cut the actual range, not the bucket.
    {
      cuda::AttentionArgs g = a;
      std::vector<float> out_g(out.size(), std::nanf(""));
      g.out = out_g.data();
      g.kv_capacity = 4096;
      std::vector<float> scratch_g(cuda::host_emu::attention_prefill_scratch_bytes(g, c.n_sm) / sizeof(float) + 1, std::nanf(""));
      cuda::host_emu::attention_prefill(g, scratch_g.data(), c.n_sm, nullptr);
      size_t diff = 0;
      for (size_t i = 0; i < out.size(); ++i) diff += std::memcmp(&out[i], &out_g[i], sizeof(float)) != 0;
      EXPECT_EQ(diff, 0u) << "bucket-sized grid (" << scratch_g.size() - 1 << " scratch floats) differs from the eager launch";
    }
    // The fused split combine (CudaOptions::fa_fused_combine): the last split merges the partials itself with
    // the combine kernel's functions — the same bits — and leaves its counters at zero for the next launch.
    {
      cuda::AttentionArgs f = a;
      std::vector<float> out_f(out.size(), std::nanf(""));
      std::vector<int> counters(4096, 0);
      f.out = out_f.data();
      f.fa_counters = counters.data();
      f.fa_counters_len = static_cast<int64_t>(counters.size());
      std::vector<float> scratch_f(cuda::host_emu::attention_prefill_scratch_bytes(f, c.n_sm) / sizeof(float) + 1, std::nanf(""));
      const long adds0 = cuda::host_emu::g_atomic_adds.load();
      cuda::host_emu::attention_prefill(f, scratch_f.data(), c.n_sm, nullptr);
      // With splits (scratch) and no TQ3_0 V, every block counted its arrival: the fused path ran.
      if (scratch_f.size() > 1 && c.v != DType::TQ3_0) {
        EXPECT_GT(cuda::host_emu::g_atomic_adds.load(), adds0) << "the fused combine did not run";
      }
      size_t diff = 0;
      for (size_t i = 0; i < out.size(); ++i) diff += std::memcmp(&out[i], &out_f[i], sizeof(float)) != 0;
      EXPECT_EQ(diff, 0u) << "fused split combine differs from the combine kernel";
      EXPECT_EQ(std::count(counters.begin(), counters.end(), 0), static_cast<std::ptrdiff_t>(counters.size())) << "counters not reset";
    }
    std::printf("%s/%s %s: rel %.2e max abs %.2e (splits scratch %zu floats)\n", kv_type_name(c.k).c_str(), kv_type_name(c.v).c_str(), bt.what,
                rel, worst, scratch.size() - 1);
    cpu.free(qt);
    cpu.free(ref);
  }
  for (auto& t : keep) cpu.free(t);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFaEmulated,
                         testing::Values(EmuCase{4, 2, 64, 0, 0.0f, 64},      // GQA 2 (the tiny models), split-K
                                         EmuCase{8, 1, 64, 50, 20.0f, 1},     // GQA 8, window, softcap, no split (one "SM")
                                         EmuCase{6, 2, 64, 0, 0.0f, 1},       // GQA 3: 63 of the 64 query rows of a block
                                         EmuCase{2, 1, 128, 0, 0.0f, 64},     // D 128, split-K
                                         EmuCase{2, 2, 256, 37, 0.0f, 1}),    // D 256 (32-key tiles), window
                         emu_name);

// Typed caches: the cache's own blocks decoded tile by tile (issue 12: no dequantized copy), every decoder
// family, TQ3_0's query rotation (K) and output un-rotation (V) in the kernel and in the split-K combine,
// TQ3_0 at head 64 (heads padded to 128: the (128, 64), (64, 128) and (128, 128) width instantiations).
INSTANTIATE_TEST_SUITE_P(TypedKv, CudaFaEmulated,
                         testing::Values(EmuCase{4, 2, 64, 0, 0.0f, 64, DType::Q8_0, DType::Q8_0},      // split-K
                                         EmuCase{8, 1, 64, 50, 20.0f, 1, DType::Q4_0, DType::Q4_0},     // GQA 8, window, softcap
                                         EmuCase{2, 1, 128, 0, 0.0f, 64, DType::TQ3_0, DType::TQ3_0},   // rotations, split-K combine
                                         EmuCase{4, 2, 64, 0, 0.0f, 1, DType::TQ3_0, DType::TQ3_0},     // padded 64 → 128, in-kernel R⁻¹
                                         EmuCase{6, 2, 64, 0, 0.0f, 1, DType::F16, DType::Q8_0},        // mixed, GQA 3
                                         EmuCase{2, 2, 256, 37, 0.0f, 1, DType::BF16, DType::Q4_1},     // D 256, window
                                         EmuCase{2, 1, 64, 0, 0.0f, 64, DType::Q5_1, DType::TQ3_0},     // widths 64 / 128, R⁻¹ in the combine
                                         EmuCase{2, 1, 64, 0, 0.0f, 1, DType::TQ3_0, DType::Q5_0}),     // widths 128 / 64
                         emu_name);

TEST(CudaFaEmulatedTyped, Routing) {
  // Which typed caches the kernel takes (the rest keep attention.cu), and bad input: a clear error.
  cuda::AttentionArgs a;
  a.typed = true;
  a.n_head = 8, a.n_head_kv = 2, a.head_dim = 128;
  const DType ok[] = {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0};
  for (DType k : ok)
    for (DType v : ok) {
      a.k_type = k, a.v_type = v;
      a.k_row_bytes = kv_row_bytes(k, a.n_head_kv, a.head_dim), a.v_row_bytes = kv_row_bytes(v, a.n_head_kv, a.head_dim);
      for (int hd : {64, 128, 256}) {
        a.head_dim = hd;
        a.k_row_bytes = kv_row_bytes(k, a.n_head_kv, hd), a.v_row_bytes = kv_row_bytes(v, a.n_head_kv, hd);
        EXPECT_TRUE(cuda::host_emu::attention_prefill_supported(a)) << kv_type_name(k) << "/" << kv_type_name(v) << " head " << hd;
      }
    }
  a.head_dim = 128;
  a.k_type = DType::F32, a.v_type = DType::Q8_0;
  EXPECT_FALSE(cuda::host_emu::attention_prefill_supported(a)) << "an F32 side keeps attention.cu";
  a.k_type = DType::Q8_0, a.v_type = DType::Q4_K;
  EXPECT_FALSE(cuda::host_emu::attention_prefill_supported(a)) << "not a KV type";
  a.v_type = DType::Q8_0, a.head_dim = 80;
  EXPECT_FALSE(cuda::host_emu::attention_prefill_supported(a)) << "head 80";
  a.head_dim = 128;
  alignas(16) static uint8_t buf[64];
  a.k = buf + 2;  // a cache base that no cp.async unit divides
  EXPECT_FALSE(cuda::host_emu::attention_prefill_supported(a)) << "2-byte aligned cache";
  a.k = buf;
  EXPECT_TRUE(cuda::host_emu::attention_prefill_supported(a));
  a.n = 1;
  a.k_row_bytes = kv_row_bytes(DType::Q8_0, a.n_head_kv, a.head_dim) + 4;  // rows of another layout
  a.v_row_bytes = kv_row_bytes(DType::Q8_0, a.n_head_kv, a.head_dim);
  EXPECT_THROW(cuda::host_emu::attention_prefill(a, nullptr, 1, nullptr), Error);
}

}  // namespace
}  // namespace pg
