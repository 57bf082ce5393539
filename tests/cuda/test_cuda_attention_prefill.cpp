// The tensor-core prefill attention (backend/cuda/attention_prefill.cu, CudaOptions::fa_prefill_min_rows)
// against the CPU reference (exact mode, same cache type) and against the CUDA FP32 kernel (attention.cu) on
// the same device cache: F16 caches and typed ones (q8_0, q4_0, q4_1, q5_0, q5_1, bf16, tq3_0, mixed pairs,
// TQ3_0 padded at head 64; the kernel decodes the cache's blocks per tile, the FP32 kernel is
// attn_kvq_kernel), head sizes 64/128/256, GQA ratios 1..64 (7: partial row tiles of the 64-row block),
// 1..300 rows (partial tiles), prefill chunks after 0/100/3000 cached tokens (split-K at long depth),
// sliding window, soft-capping, several sequences in one batch; and whole tiny golden models with the
// option on vs off vs the CPU, prompts in one batch and in chunks.
//
// Written without device time: these run for the first time on the GPU (label `cuda`). Bounds: the new
// kernel rounds q and the softmax weights to FP16 (relative 2⁻¹¹ each, random), and for a typed cache the
// decoded K/V values too, so op outputs are expected within ~5e-4 relative of the FP32 result (host
// emulation of the same code, test_cuda_fa_emulated: 1.7e-4..5.1e-4); the bound is 2e-3. The FP32 kernel
// itself stays at its 2e-5 (test_cuda_ops.cpp; 5e-5 for typed caches, test_cuda_kv_types.cpp) and is checked
// here as well, so a failure says which side moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "backend/cuda/attention_prefill.cuh"
#include "backend/cuda/kernels.h"
#include "core/kv_quant.h"
#include "cuda_test_util.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

using test::compare;
using test::ErrStats;
using test::fetch;
using test::fetch_bytes;
using test::make_tensor;
using test::randn;

struct FaCase {
  int n_head, n_head_kv, head_dim;
  int window;
  float softcap;
  DType k = DType::F16, v = DType::F16;  // cache types: F16/F16 is the untyped kernel, any other pair the typed one
};

bool typed_pair(DType k, DType v) { return !(k == DType::F16 && v == DType::F16); }

std::string case_name(const testing::TestParamInfo<FaCase>& i) {
  const FaCase& c = i.param;
  char buf[96];  // (not std::string operator+: gcc 12's -Wrestrict false positive on "h" + to_string)
  std::snprintf(buf, sizeof buf, "h%d_kv%d_d%d_w%d_cap%d", c.n_head, c.n_head_kv, c.head_dim, c.window, static_cast<int>(c.softcap));
  std::string name;
  if (typed_pair(c.k, c.v)) name.append(kv_type_name(c.k)).append("_").append(kv_type_name(c.v)).append("_");
  return name.append(buf);
}

// min_rows 0: every attention call on attention.cu (the reference side); > 0: calls of ≥ min_rows rows and,
// through fa_decode, decode / verification calls on the tensor-core kernel (CudaOptions' defaults since
// device run 28; the model test below would otherwise compare the kernel with itself).
CudaOptions fa_options(int min_rows) {
  CudaOptions o;
  o.fa_prefill_min_rows = min_rows;
  o.fa_decode = min_rows > 0;
  o.fa_vec = false;  // one-row F16 calls would take the SIMT kernel (its own tests: test_cuda_favec.cpp) on both sides
  o.fa_prefill_typed = true;  // typed caches take the tensor-core kernel too
  if (const char* e = std::getenv("PEREGRINE_CUDA_PDL"); e && std::string(e) == "0") o.pdl = false;
  return o;
}

class CudaAttentionPrefill : public testing::TestWithParam<FaCase> {};

TEST_P(CudaAttentionPrefill, MatchesCpuAndFp32Kernel) {
  PG_REQUIRE_GPU();
  const FaCase c = GetParam();
  auto cpu = test::make_cpu_exact();
  auto gpu = std::make_unique<CudaBackend>(0, fa_options(0));
  // Sequences: 0 holds 3000 cached tokens + a 300-row chunk, 1 holds 100 + 300, 2 holds 300.
  const int n_seq = 3;
  const int lens[n_seq] = {3300, 400, 300};
  const test::PagedKvLayout layout(n_seq, 3300, 64, 7);
  const int64_t kvw = static_cast<int64_t>(c.n_head_kv) * c.head_dim, qw = static_cast<int64_t>(c.n_head) * c.head_dim;

  const bool typed = typed_pair(c.k, c.v);
  test::KvSide sides[2] = {{cpu.get(), {}, {}}, {gpu.get(), {}, {}}};
  for (auto& s : sides) {
    // Each head in whole blocks of its type (kv_head_width: TQ3_0 pads head 64 to its 128-value group).
    s.kv.k = s.be->alloc(c.k, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.k, c.head_dim), layout.n_cells());
    s.kv.v = s.be->alloc(c.v, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.v, c.head_dim), layout.n_cells());
    if (typed) {
      s.kv.n_head_kv = c.n_head_kv, s.kv.head_dim = c.head_dim, s.kv.head_dim_v = c.head_dim;
      const std::vector<uint8_t> zk(s.kv.k.nbytes(), 0), zv(s.kv.v.nbytes(), 0);  // the same bytes in unwritten cells
      s.be->upload(s.kv.k, zk.data(), zk.size());
      s.be->upload(s.kv.v, zv.data(), zv.size());
    }
    s.table = test::upload_block_table(*s.be, layout);
  }
  for (int sq = 0; sq < n_seq; ++sq)
    for (int p0 = 0; p0 < lens[sq]; p0 += 512) {
      std::vector<int32_t> pos, seq;
      for (int p = p0; p < std::min(lens[sq], p0 + 512); ++p) pos.push_back(p), seq.push_back(sq);
      const int n = static_cast<int>(pos.size());
      const auto k = randn(static_cast<size_t>(n * kvw), static_cast<uint32_t>(1000 + sq * 31 + p0));
      const auto v = randn(static_cast<size_t>(n * kvw), static_cast<uint32_t>(2000 + sq * 31 + p0));
      for (auto& s : sides) test::store_kv_rows(s, layout, pos, seq, kvw, k, v);
    }
  // Typed: the two kv_stores write identical bytes (test_cuda_kv_types' CudaKvStore.BytesEqualCpuQuantizer), so the
  // comparisons below are of kernels on the same cache.
  if (typed) {
    ASSERT_TRUE(fetch_bytes(*cpu, sides[0].kv.k) == fetch_bytes(*gpu, sides[1].kv.k)) << "K caches differ after kv_store";
    ASSERT_TRUE(fetch_bytes(*cpu, sides[0].kv.v) == fetch_bytes(*gpu, sides[1].kv.v)) << "V caches differ after kv_store";
  }
  AttentionParams ap;
  ap.n_head = c.n_head;
  ap.n_head_kv = c.n_head_kv;
  ap.head_dim = c.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ap.sliding_window = c.window;
  ap.logit_softcap = c.softcap;

  // The shape must be one the new kernel takes, else the "on" runs below would silently test attention.cu.
  cuda::AttentionArgs probe;
  probe.kv_f16 = c.k == DType::F16;
  probe.typed = typed;
  probe.k_type = c.k, probe.v_type = c.v;
  probe.k = sides[1].kv.k.data, probe.v = sides[1].kv.v.data;
  probe.k_row_bytes = sides[1].kv.k.row_bytes(), probe.v_row_bytes = sides[1].kv.v.row_bytes();
  probe.n_head = c.n_head;
  probe.n_head_kv = c.n_head_kv;
  probe.head_dim = c.head_dim;
  ASSERT_TRUE(cuda::attention_prefill_supported(probe));

  struct FaBatch {
    std::string what;
    std::vector<int32_t> pos, seq;
    std::vector<int32_t> kv_len = {};  // tree batches only: end of each row's contiguous range
    std::vector<uint32_t> mask = {};   // (n, kTreeMaskWords) tree mask words
  };
  std::vector<FaBatch> batches;
  // A prefill chunk of `rows` rows of sequence sq after `depth` cached tokens.
  auto chunk = [&](int sq, int depth, int rows) {
    char what[64];
    std::snprintf(what, sizeof what, "seq %d depth %d rows %d", sq, depth, rows);
    FaBatch b{what, {}, {}};
    for (int i = 0; i < rows; ++i) b.pos.push_back(depth + i), b.seq.push_back(sq);
    return b;
  };
  for (int rows : {1, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 128, 129, 255, 300}) batches.push_back(chunk(2, 0, rows));
  for (int rows : {1, 9, 64, 65, 200, 300}) batches.push_back(chunk(1, 100, rows));
  for (int rows : {1, 17, 64, 129, 300}) batches.push_back(chunk(0, 3000, rows));
  {
    // Several sequences in one batch, runs of consecutive positions (rows of different sequences share
    // row tiles: separate passes), as the server's mixed prefill batches.
    FaBatch b{"mixed", {}, {}};
    for (int p = 3000; p < 3070; ++p) b.pos.push_back(p), b.seq.push_back(0);
    for (int p = 0; p < 45; ++p) b.pos.push_back(p), b.seq.push_back(1);
    b.pos.push_back(299), b.seq.push_back(2);
    for (int p = 100; p < 140; ++p) b.pos.push_back(p), b.seq.push_back(2);
    for (int p = 350; p < 400; ++p) b.pos.push_back(p), b.seq.push_back(1);
    batches.push_back(b);
    // Interleaved rows (every row starts a new pass) and non-consecutive positions.
    FaBatch il{"interleaved", {}, {}};
    for (int i = 0; i < 90; ++i) il.pos.push_back(i % 3 == 0 ? 3299 - 7 * i : i % 3 == 1 ? 399 - i : 3 * i), il.seq.push_back(i % 3);
    batches.push_back(il);
  }
  {
    // Decode / verification shapes (CudaOptions::fa_decode): decode rows of several sequences at once,
    // and token trees (row r sees [begin, kv_len[r]) plus kv_len[r] + j for its mask bits j; drafts stored
    // at kv_len, kv_len + 1, ... with RoPE positions kv_len + depth). Depth up to 3299: several splits.
    FaBatch dec{"decode rows of 3 sequences", {3299, 399, 299}, {0, 1, 2}};
    batches.push_back(dec);
    std::mt19937 rng(5);
    for (int rows : {2, 5, 22, 64}) {
      // A random tree of `rows` nodes after seq 0's first 3200 cached tokens (so the drafts, up to 63 of
      // them, span two mask words), node i's parent a random earlier node.
      FaBatch t{"tree of " + std::to_string(rows) + " rows at depth 3200", {}, {}};
      std::vector<int> parent(static_cast<size_t>(rows), -1), depth(static_cast<size_t>(rows), 0);
      std::vector<std::vector<uint32_t>> m(static_cast<size_t>(rows), std::vector<uint32_t>(kTreeMaskWords, 0u));
      for (int i = 0; i < rows; ++i) {
        if (i > 0) {
          parent[static_cast<size_t>(i)] = static_cast<int>(rng() % static_cast<uint32_t>(i));
          m[static_cast<size_t>(i)] = m[static_cast<size_t>(parent[static_cast<size_t>(i)])];
          depth[static_cast<size_t>(i)] = depth[static_cast<size_t>(parent[static_cast<size_t>(i)])] + 1;
        }
        m[static_cast<size_t>(i)][static_cast<size_t>(i / 32)] |= 1u << (i % 32);
        t.pos.push_back(3200 + depth[static_cast<size_t>(i)]), t.seq.push_back(0), t.kv_len.push_back(3200);
        for (uint32_t w : m[static_cast<size_t>(i)]) t.mask.push_back(w);
      }
      batches.push_back(t);
    }
    // A chain of 7 rows of seq 1 (kv_len = pos + 1, no bits) and a 3-node tree of seq 2 in one batch.
    FaBatch cm{"chain of seq 1 + tree of seq 2", {}, {}};
    for (int p = 380; p < 387; ++p) {
      cm.pos.push_back(p), cm.seq.push_back(1), cm.kv_len.push_back(p + 1);
      for (int w = 0; w < kTreeMaskWords; ++w) cm.mask.push_back(0u);
    }
    const uint32_t tm[3] = {0x1u, 0x3u, 0x5u};
    const int td[3] = {0, 1, 1};
    for (int i = 0; i < 3; ++i) {
      cm.pos.push_back(290 + td[i]), cm.seq.push_back(2), cm.kv_len.push_back(290);
      for (int w = 0; w < kTreeMaskWords; ++w) cm.mask.push_back(w == 0 ? tm[i] : 0u);
    }
    batches.push_back(cm);
  }

  double worst_fa_vs_fp32 = 0;
  for (const FaBatch& fb : batches) {
    SCOPED_TRACE(fb.what);
    const int n = static_cast<int>(fb.pos.size());
    const auto q = randn(static_cast<size_t>(n * qw), static_cast<uint32_t>(77 + n));
    // 0: CPU, 1: CUDA FP32 kernel, 2: CUDA tensor-core kernel, 3: the same with the fused split combine.
    std::vector<float> out[4];
    for (int run = 0; run < 4; ++run) {
      test::KvSide& s = sides[run == 0 ? 0 : 1];
      if (run > 0) {
        CudaOptions o = fa_options(run >= 2 ? 1 : 0);
        o.fa_decode = run >= 2;  // tree batches (verification) reach the tensor-core kernel only with fa_decode
        o.fa_fused_combine = run == 3;
        gpu->set_options(o);
      }
      std::vector<Tensor> keep;
      AttentionBatch b = test::paged_batch(s, layout, fb.pos, fb.seq, keep);
      if (!fb.kv_len.empty()) {
        b.kv_len = make_tensor(*s.be, DType::I32, n, 1, fb.kv_len.data());
        b.tree_mask = make_tensor(*s.be, DType::I32, kTreeMaskWords, n, fb.mask.data());
        keep.push_back(b.kv_len);
        keep.push_back(b.tree_mask);
        int mx = 0;
        for (int r = 0; r < n; ++r)
          mx = std::max(mx, cuda::fa::tree_hi(fb.kv_len[static_cast<size_t>(r)], fb.mask.data() + static_cast<size_t>(r) * kTreeMaskWords,
                                              kTreeMaskWords));
        b.max_kv_len = mx;
      }
      Tensor qt = make_tensor(*s.be, DType::F32, qw, n, q.data());
      const std::vector<float> poison(static_cast<size_t>(n * qw), std::nanf(""));
      Tensor ot = make_tensor(*s.be, DType::F32, qw, n, poison.data());
      s.be->attention(qt, s.kv, b, ap, ot);
      out[run] = fetch(*s.be, ot);
      for (auto& t : keep) s.be->free(t);
      s.be->free(qt);
      s.be->free(ot);
    }
    const ErrStats e32 = compare(out[1], out[0]);
    EXPECT_EQ(e32.bad, 0u);
    EXPECT_LE(e32.rel, typed ? 5e-5 : 2e-5) << "FP32 kernel vs CPU, max_abs " << e32.max_abs;
    const ErrStats efa = compare(out[2], out[0]);
    EXPECT_EQ(efa.bad, 0u) << "tensor-core kernel: NaN/Inf or unwritten outputs";
    EXPECT_LE(efa.rel, 2e-3) << "tensor-core kernel vs CPU, max_abs " << efa.max_abs;
    // The fused combine runs the combine kernel's code in the kernel's last split: the same bits.
    EXPECT_EQ(0, std::memcmp(out[3].data(), out[2].data(), out[2].size() * sizeof(float))) << "fused split combine differs";
    const ErrStats ex = compare(out[2], out[1]);
    EXPECT_LE(ex.rel, 2e-3) << "tensor-core vs FP32 kernel, max_abs " << ex.max_abs;
    worst_fa_vs_fp32 = std::max(worst_fa_vs_fp32, ex.max_abs);
  }
  // FP16 rounding makes the two kernels differ somewhere: identical outputs would mean the option did
  // not route any batch to the new kernel.
  EXPECT_GT(worst_fa_vs_fp32, 0.0) << "fa_prefill_min_rows = 1 gave bit-identical results: the tensor-core kernel did not run";
  std::printf("%s/%s h%d/kv%d d%d w%d cap%g: max |fa − fp32| %.3g\n", kv_type_name(c.k).c_str(), kv_type_name(c.v).c_str(), c.n_head,
              c.n_head_kv, c.head_dim, c.window, c.softcap, worst_fa_vs_fp32);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionPrefill,
                         testing::Values(FaCase{4, 4, 64, 0, 0.0f},      // GQA 1
                                         FaCase{16, 4, 64, 0, 30.0f},    // GQA 4, softcap
                                         FaCase{64, 1, 64, 0, 0.0f},     // GQA 64: one batch row per block
                                         FaCase{32, 8, 128, 0, 0.0f},    // qwen3-8b
                                         FaCase{32, 4, 128, 100, 0.0f},  // GQA 8, sliding window
                                         FaCase{28, 4, 128, 0, 0.0f},    // GQA 7: 63 of 64 query rows used
                                         FaCase{8, 8, 128, 37, 0.0f},    // GQA 1, window not a tile multiple
                                         FaCase{24, 4, 256, 0, 0.0f},    // qwen35-27b
                                         FaCase{8, 4, 256, 1024, 50.0f}, // gemma3: 256, window, softcap
                                         FaCase{16, 2, 256, 0, 0.0f}),   // GQA 8 at 256
                         case_name);

// Typed caches (issue 12: the kernel reads the cache's own blocks): every decoder, TQ3_0's query rotation
// and output un-rotation (with and without split-K at depth 3000), the padded widths of TQ3_0 at head 64
// ((128, 128), (128, 64), (64, 128)), mixed pairs.
INSTANTIATE_TEST_SUITE_P(TypedKv, CudaAttentionPrefill,
                         testing::Values(FaCase{32, 8, 128, 0, 0.0f, DType::Q8_0, DType::Q8_0},       // qwen3-8b, q8_0
                                         FaCase{16, 4, 64, 0, 30.0f, DType::Q4_0, DType::Q4_0},       // softcap
                                         FaCase{32, 4, 128, 100, 0.0f, DType::TQ3_0, DType::TQ3_0},   // window
                                         FaCase{4, 4, 64, 0, 0.0f, DType::TQ3_0, DType::TQ3_0},       // padded 64 → 128
                                         FaCase{28, 4, 128, 0, 0.0f, DType::F16, DType::Q8_0},        // mixed, GQA 7
                                         FaCase{24, 4, 256, 0, 0.0f, DType::BF16, DType::BF16},       // qwen35-27b, bf16
                                         FaCase{8, 4, 256, 1024, 50.0f, DType::Q8_0, DType::TQ3_0},   // gemma3-like
                                         FaCase{64, 1, 64, 0, 0.0f, DType::Q4_1, DType::Q5_0},        // GQA 64
                                         FaCase{16, 2, 64, 0, 0.0f, DType::TQ3_0, DType::Q8_0},       // widths 128 / 64
                                         FaCase{8, 2, 64, 37, 0.0f, DType::Q5_1, DType::TQ3_0}),      // widths 64 / 128
                         case_name);

TEST(CudaAttentionPrefillOptions, ShapesOutsideTheKernelKeepTheFp32Kernel) {
  // Host-side predicate only (no GPU needed to evaluate it, but it lives in the CUDA library).
  cuda::AttentionArgs a;
  a.kv_f16 = true;
  a.n_head = 32, a.n_head_kv = 8, a.head_dim = 128;
  EXPECT_TRUE(cuda::attention_prefill_supported(a));
  a.head_dim = 80;
  EXPECT_FALSE(cuda::attention_prefill_supported(a)) << "head 80";
  a.head_dim = 128;
  a.kv_f16 = false;
  EXPECT_FALSE(cuda::attention_prefill_supported(a)) << "F32 cache";
  a.kv_f16 = true;
  const uint32_t mask[4] = {};
  a.tree_mask = mask;
  EXPECT_TRUE(cuda::attention_prefill_supported(a)) << "token tree (verification: CudaOptions::fa_decode routes it)";
  a.tree_mask = nullptr;
  a.n_head = 128, a.n_head_kv = 1;
  EXPECT_FALSE(cuda::attention_prefill_supported(a)) << "GQA 128";
  // Typed caches: every KV type pair without F32, at head 64/128/256.
  a.n_head = 32, a.n_head_kv = 8, a.typed = true;
  a.k_type = DType::Q8_0, a.v_type = DType::TQ3_0;
  a.k_row_bytes = kv_row_bytes(a.k_type, a.n_head_kv, 128), a.v_row_bytes = kv_row_bytes(a.v_type, a.n_head_kv, 128);
  EXPECT_TRUE(cuda::attention_prefill_supported(a)) << "q8_0/tq3_0";
  a.head_dim = 64;
  EXPECT_TRUE(cuda::attention_prefill_supported(a)) << "q8_0/tq3_0 at head 64 (V padded to 128)";
  a.head_dim = 128;
  a.k_type = DType::F32;
  EXPECT_FALSE(cuda::attention_prefill_supported(a)) << "an F32 side";
  a.k_type = DType::Q4_K;
  EXPECT_FALSE(cuda::attention_prefill_supported(a)) << "not a KV type";
}

// ---- whole models ---------------------------------------------------------------------------------------

// Random prompt tokens of the tiny vocabulary (512), fixed seed.
std::vector<int32_t> prompt_tokens(int n) {
  std::mt19937 rng(5);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % 500) + 3;
  return t;
}

// All logits of a prompt of `tokens`, fed in chunks of `chunk` rows (later chunks attend to the cached
// earlier ones), plus 8 decode steps feeding fixed tokens.
std::vector<float> run_prompt(Backend& be, const std::string& path, const std::vector<int32_t>& tokens, int chunk, DType k = DType::F16,
                              DType v = DType::F16) {
  auto model = Model::load(path, be);
  KvCacheOptions o{1, 512, k, 16};
  o.type_k = k;
  o.type_v = v;
  auto cache = model->make_cache(o);
  std::vector<float> all, out;
  Batch b;
  const int n = static_cast<int>(tokens.size());
  for (int p0 = 0; p0 < n; p0 += chunk) {
    b.clear();
    for (int p = p0; p < std::min(n, p0 + chunk); ++p) b.add(tokens[static_cast<size_t>(p)], p, 0, true);
    model->forward(b, *cache, out);
    all.insert(all.end(), out.begin(), out.end());
  }
  for (int s = 0; s < 8; ++s) {
    b.clear();
    b.add(static_cast<int32_t>(10 + 37 * s), n + s, 0, true);
    model->forward(b, *cache, out);
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

struct LogitDiff {
  double max = 0, rms = 0;
};
LogitDiff logit_diff(const std::vector<float>& a, const std::vector<float>& ref) {
  LogitDiff d;
  double sq = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    const double e = std::isfinite(a[i]) ? std::fabs(static_cast<double>(a[i]) - ref[i]) : INFINITY;
    d.max = std::max(d.max, e);
    sq += e * e;
  }
  d.rms = a.empty() ? 0 : std::sqrt(sq / static_cast<double>(a.size()));
  if (a.size() != ref.size()) d.max = INFINITY;
  return d;
}

struct ModelCase {
  const char* stem;
  DType k = DType::F16, v = DType::F16;  // KV cache types (the same on the CPU)
};

class CudaAttentionPrefillModel : public testing::TestWithParam<ModelCase> {};

// F16 files, CUDA default mode vs the CPU's exact mode (same KV types: F16, or a typed pair), option on vs
// off: on vs off within the F16-file bound of test_cuda_model.cpp (max 0.05; the attention is the only
// difference), on vs CPU within that bound on top of off vs CPU (which for a typed cache also holds the
// quantizer's neighbouring-quantum flips of test_cuda_kv_types' model test). Measured values are printed.
TEST_P(CudaAttentionPrefillModel, LogitsOnVsOffVsCpu) {
  PG_REQUIRE_GPU();
  const ModelCase mc = GetParam();
  const std::string stem = mc.stem;
  const std::string path = test::shared_path("golden/models/" + stem + ".gguf").string();
  CpuOptions co;
  co.n_threads = 2;
  co.exact_f32 = true;
  CpuBackend cpu(co);
  for (int len : {24, 300}) {
    const auto tokens = prompt_tokens(len);
    for (int chunk : {len, 64}) {
      if (chunk == 64 && len <= 64) continue;
      char what[160];
      std::snprintf(what, sizeof what, "%s %s/%s: prompt %d in chunks of %d", stem.c_str(), kv_type_name(mc.k).c_str(), kv_type_name(mc.v).c_str(),
                    len, chunk);
      SCOPED_TRACE(what);
      const auto ref = run_prompt(cpu, path, tokens, chunk, mc.k, mc.v);
      CudaBackend off(0, fa_options(0));
      const auto l_off = run_prompt(off, path, tokens, chunk, mc.k, mc.v);
      CudaBackend on(0, fa_options(16));
      const auto l_on = run_prompt(on, path, tokens, chunk, mc.k, mc.v);
      ASSERT_EQ(l_on.size(), ref.size());
      const LogitDiff d_on = logit_diff(l_on, ref), d_off = logit_diff(l_off, ref), d_x = logit_diff(l_on, l_off);
      // Long prompts in one batch take the FP16 GEMM (activations rounded to FP16), so the FP32 kernel's own
      // distance to the CPU is the baseline: the option may add at most the F16-file bound to it.
      EXPECT_LE(d_on.max, 0.05 + d_off.max) << "on vs CPU";
      EXPECT_LE(d_on.rms, 0.01 + d_off.rms) << "on vs CPU";
      // On vs off for a cache of ≤ 4 bits per value (q4_0, q4_1, tq3_0): a K or V row computed after an FP16
      // attention may land in the neighbouring quantum of its type, a step ≥ 8× a q8_0 one. H200 run 25:
      // tiny-qwen3 tq3_0 on vs off 0.073–0.099, tiny-llama q4_0 0.052–0.058 (off vs CPU itself 0.28–0.56).
      const auto low = [](DType t) { return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::TQ3_0; };
      const bool low_bit = low(mc.k) || low(mc.v);
      EXPECT_LE(d_x.max, low_bit ? 0.15 : 0.05) << "on vs off";
      EXPECT_GT(d_x.max, 0.0) << "on and off bit-identical: the tensor-core kernel did not run";
      std::printf("%-18s %s/%s len %3d chunk %3d | off vs cpu max %.2e rms %.2e | on vs cpu max %.2e rms %.2e | on vs off max %.2e\n",
                  stem.c_str(), kv_type_name(mc.k).c_str(), kv_type_name(mc.v).c_str(), len, chunk, d_off.max, d_off.rms, d_on.max, d_on.rms, d_x.max);
    }
  }
}

std::string model_name(const testing::TestParamInfo<ModelCase>& i) {
  std::string s = i.param.stem;
  if (typed_pair(i.param.k, i.param.v)) s.append("_").append(kv_type_name(i.param.k)).append("_").append(kv_type_name(i.param.v));
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// F16 golden models with attention layers (all head 64, GQA 2): qwen3 (qk-norm), gemma3 (sliding window 8 on
// alternate layers), llama, qwen2, qwen3moe, and qwen35's gated full-attention layers.
INSTANTIATE_TEST_SUITE_P(Golden, CudaAttentionPrefillModel,
                         testing::Values(ModelCase{"tiny-qwen3-f16"}, ModelCase{"tiny-gemma3-f16"}, ModelCase{"tiny-llama-f16"},
                                         ModelCase{"tiny-qwen2-f16"}, ModelCase{"tiny-qwen3moe-f16"}, ModelCase{"tiny-qwen35-f16"}),
                         model_name);

// Quantized caches (head 64: TQ3_0 pads to 128) through whole models, prefill on the typed tensor-core path.
INSTANTIATE_TEST_SUITE_P(TypedKv, CudaAttentionPrefillModel,
                         testing::Values(ModelCase{"tiny-qwen3-f16", DType::Q8_0, DType::Q8_0},
                                         ModelCase{"tiny-qwen3-f16", DType::TQ3_0, DType::TQ3_0},
                                         ModelCase{"tiny-llama-f16", DType::Q4_0, DType::Q4_0},
                                         ModelCase{"tiny-gemma3-f16", DType::F16, DType::Q8_0},
                                         ModelCase{"tiny-qwen35-f16", DType::Q8_0, DType::TQ3_0}),
                         model_name);

}  // namespace
}  // namespace pg
