// Quantized / mixed KV-cache types on CUDA (issue 12 §1) against the CPU backend, which is the reference for
// every type (core/kv_quant.h, backend/cpu/kv_attn.h). Written before any GPU run: these tests are what the
// next device session runs to prove the path (label `cuda`).
//  - kv_store: the bytes the GPU writes into the cache equal the CPU's kv_quantize_row bytes exactly, for
//    every type, head sizes 8..256 (padded heads included). Both sides run the same algorithm in the same
//    operation order (backend/cuda/kv_quant.cuh), so anything but identity is a bug. (The encoders are also
//    checked on the host without a GPU: test_cuda_decoders' CudaKvCodecs.)
//  - attention: on caches holding identical bytes (checked), CUDA's typed kernel vs CpuBackend::attention
//    (exact-F32 mode), over decode (split-K, contexts of 2500), multi-row prefill-like batches, token trees,
//    GQA, sliding windows and softcap: ‖cuda − cpu‖/‖cpu‖ ≤ 5e-5. Why that bound: both sides decode the
//    same bytes to bit-identical FP32 values (common.cuh's decoders reproduce core's dequantizers, tested
//    on the host), so only FP32 summation order remains — dot products over ≤ 256 values, the online
//    softmax vs the CPU's two-pass softmax with a double sum — which CudaAttention.MatchesCpu bounds by
//    2e-5 on F16/F32 caches; TQ3_0 adds the query rotation and the output un-rotation (7 butterfly stages
//    each, one rounding per stage), hence 2.5× that.
//  - whole models: the tiny golden models forwarded with q8_0, q4_0, tq3_0 and mixed caches, CUDA exact mode
//    vs CPU exact mode with the same types: max |Δlogit| ≤ 0.02 and at most half of the type's own drift
//    from an F32 cache. Not bit-level: the K/V rows entering the quantizer differ in the last bits between
//    CPU and GPU (FP32 summation order in the projections), and a value within that distance of a rounding
//    boundary lands in the neighbouring quantum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

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

// K rows with a few persistent large channels (as real K caches have), V rows Gaussian.
std::vector<float> kv_rows(size_t n, int width, uint32_t seed, bool outliers) {
  auto v = randn(n, seed);
  if (outliers)
    for (size_t i = 0; i < n; ++i)
      if (i % static_cast<size_t>(width) % 37 == 5) v[i] *= 8.0f;
  return v;
}

// ---- kv_store -----------------------------------------------------------------------------------------

// Both store kernels (CudaOptions::kv_store_parallel off: one thread per unit; on: one warp per block /
// group), every type as K and as V, padded and unpadded heads, one-row decode batches and 37-row batches,
// 1, 2 and 8 KV heads (the warp items of a row cross K/V and head boundaries inside one thread block).
class CudaKvStore : public testing::TestWithParam<bool> {};

TEST_P(CudaKvStore, BytesEqualCpuQuantizer) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  CudaOptions o;
  o.kv_store_parallel = GetParam();
  auto gpu = std::make_unique<CudaBackend>(0, o);
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0};
  struct Shape {
    int nh, n;
  };
  for (DType kt : types)
    for (int hd : {8, 64, 80, 128, 256})
      for (const Shape sh : {Shape{2, 37}, Shape{8, 1}, Shape{1, 5}}) {
      // V in another type (the next one in the list), so K and V of every pair kind go through one call.
      const DType vt = types[(static_cast<size_t>(std::find(std::begin(types), std::end(types), kt) - std::begin(types)) + 1) % 9];
      SCOPED_TRACE("K " + kv_type_name(kt) + " V " + kv_type_name(vt) + " head_dim " + std::to_string(hd) + " heads " +
                   std::to_string(sh.nh) + " rows " + std::to_string(sh.n));
      const int nh = sh.nh, n = sh.n, cells = 64;
      std::vector<int32_t> cell(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) cell[static_cast<size_t>(i)] = (i * 29 + 3) % cells;  // scattered, distinct
      const auto k = kv_rows(static_cast<size_t>(n * nh * hd), nh * hd, static_cast<uint32_t>(hd) + 1, true);
      const auto v = kv_rows(static_cast<size_t>(n * nh * hd), nh * hd, static_cast<uint32_t>(hd) + 2, false);
      std::vector<uint8_t> got[2][2];
      Backend* sides[2] = {cpu.get(), gpu.get()};
      for (int si = 0; si < 2; ++si) {
        Backend& be = *sides[si];
        KvLayer kv;
        kv.k = be.alloc(kt, static_cast<int64_t>(nh) * kv_head_width(kt, hd), cells);
        kv.v = be.alloc(vt, static_cast<int64_t>(nh) * kv_head_width(vt, hd), cells);
        kv.n_head_kv = nh, kv.head_dim = hd, kv.head_dim_v = hd;
        ASSERT_EQ(kv.k.row_bytes(), kv_row_bytes(kt, nh, hd));
        // Same initial bytes on both sides (alloc zero-fills on CUDA; make it explicit on both).
        const std::vector<uint8_t> zk(kv.k.nbytes(), 0), zv(kv.v.nbytes(), 0);
        be.upload(kv.k, zk.data(), zk.size());
        be.upload(kv.v, zv.data(), zv.size());
        AttentionBatch b;
        b.n_tokens = n;
        b.cells = make_tensor(be, DType::I32, n, 1, cell.data());
        Tensor kt_ = make_tensor(be, DType::F32, static_cast<int64_t>(nh) * hd, n, k.data());
        Tensor vt_ = make_tensor(be, DType::F32, static_cast<int64_t>(nh) * hd, n, v.data());
        be.kv_store(kv, kt_, vt_, b);
        be.synchronize();
        got[si][0] = fetch_bytes(be, kv.k);
        got[si][1] = fetch_bytes(be, kv.v);
        for (Tensor* t : {&kv.k, &kv.v, &b.cells, &kt_, &vt_}) be.free(*t);
      }
      for (int w = 0; w < 2; ++w) {
        ASSERT_EQ(got[0][w].size(), got[1][w].size());
        size_t diff = 0, first = got[0][w].size();
        for (size_t i = 0; i < got[0][w].size(); ++i)
          if (got[0][w][i] != got[1][w][i]) ++diff, first = std::min(first, i);
        EXPECT_EQ(diff, 0u) << (w ? "V" : "K") << " cache: first differing byte " << first;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaKvStore, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "Parallel" : "PerThread"; });

// ---- attention ---------------------------------------------------------------------------------------------

struct KvAttnCase {
  DType k, v;
  int n_head, n_head_kv, head_dim;
  int window;
  float softcap;
};

std::string case_name(const testing::TestParamInfo<KvAttnCase>& i) {
  const KvAttnCase& c = i.param;
  return kv_type_name(c.k) + "_" + kv_type_name(c.v) + "_h" + std::to_string(c.n_head) + "_kv" + std::to_string(c.n_head_kv) + "_d" +
         std::to_string(c.head_dim) + (c.window ? "_w" + std::to_string(c.window) : "") + (c.softcap > 0 ? "_cap" : "");
}

class CudaKvAttention : public testing::TestWithParam<KvAttnCase> {};

TEST_P(CudaKvAttention, MatchesCpu) {
  PG_REQUIRE_GPU();
  const KvAttnCase c = GetParam();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false, false);  // attention.cu at every row count (the FA path: test_cuda_attention_prefill)
  const int n_seq = 3;
  const int lens[n_seq] = {2500, 45, 300};
  const test::PagedKvLayout layout(n_seq, 2500, 16, 42);
  const int hd = c.head_dim;
  const int64_t kvw = static_cast<int64_t>(c.n_head_kv) * hd, qw = static_cast<int64_t>(c.n_head) * hd;

  test::KvSide sides[2] = {{cpu.get(), {}, {}}, {gpu.get(), {}, {}}};
  for (auto& s : sides) {
    s.kv.k = s.be->alloc(c.k, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.k, hd), layout.n_cells());
    s.kv.v = s.be->alloc(c.v, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.v, hd), layout.n_cells());
    s.kv.n_head_kv = c.n_head_kv, s.kv.head_dim = hd, s.kv.head_dim_v = hd;
    const std::vector<uint8_t> zk(s.kv.k.nbytes(), 0), zv(s.kv.v.nbytes(), 0);
    s.be->upload(s.kv.k, zk.data(), zk.size());
    s.be->upload(s.kv.v, zv.data(), zv.size());
    s.table = test::upload_block_table(*s.be, layout);
  }
  // Fill both caches through each side's own kv_store, then check that they hold the same bytes: the
  // attention comparison below is then one of kernels on identical inputs.
  for (int sq = 0; sq < n_seq; ++sq)
    for (int p0 = 0; p0 < lens[sq]; p0 += 512) {
      std::vector<int32_t> pos, seq;
      for (int p = p0; p < std::min(lens[sq], p0 + 512); ++p) pos.push_back(p), seq.push_back(sq);
      const int n = static_cast<int>(pos.size());
      const auto k = kv_rows(static_cast<size_t>(n * kvw), static_cast<int>(kvw), static_cast<uint32_t>(100 + sq * 7 + p0), true);
      const auto v = kv_rows(static_cast<size_t>(n * kvw), static_cast<int>(kvw), static_cast<uint32_t>(200 + sq * 7 + p0), false);
      for (auto& s : sides) test::store_kv_rows(s, layout, pos, seq, kvw, k, v);
    }
  ASSERT_TRUE(fetch_bytes(*cpu, sides[0].kv.k) == fetch_bytes(*gpu, sides[1].kv.k)) << "K caches differ after kv_store";
  ASSERT_TRUE(fetch_bytes(*cpu, sides[0].kv.v) == fetch_bytes(*gpu, sides[1].kv.v)) << "V caches differ after kv_store";

  AttentionParams ap;
  ap.n_head = c.n_head;
  ap.n_head_kv = c.n_head_kv;
  ap.head_dim = hd;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ap.sliding_window = c.window;
  ap.logit_softcap = c.softcap;
  struct AttnBatch {
    std::vector<int32_t> pos, seq, kv_len;
    std::vector<uint32_t> mask;
  };
  std::vector<AttnBatch> batches;
  // Row counts in ascending order (the shared-memory opt-in must follow the largest launch), sequence 0
  // at depth ~2500 for odd counts, the three sequences interleaved for even ones.
  for (int n : {1, 2, 3, 5, 8, 13, 22, 32, 33, 64}) {
    AttnBatch b;
    for (int i = 0; i < n; ++i) {
      const int sq = n % 2 ? 0 : i % 3;
      b.pos.push_back(sq == 0 ? 2500 - n + i : sq == 1 ? 44 - i % 20 : 299 - i % 50);
      b.seq.push_back(sq);
    }
    batches.push_back(b);
  }
  {
    AttnBatch b;  // prefill-like: runs of consecutive positions of three sequences
    for (int p = 2400; p < 2500; ++p) b.pos.push_back(p), b.seq.push_back(0);
    for (int p = 0; p < 45; ++p) b.pos.push_back(p), b.seq.push_back(1);
    for (int p = 100; p < 140; ++p) b.pos.push_back(p), b.seq.push_back(2);
    batches.push_back(b);
    batches.push_back({{2499, 44, 299}, {0, 1, 2}, {}, {}});  // decode: one row per sequence (split-K)
    batches.push_back({{1023}, {0}, {}, {}});
    batches.push_back({{5}, {1}, {}, {}});
  }
  std::mt19937 trng(11);
  auto add_tree = [&](AttnBatch& b, int sq, int base, int size) {
    std::vector<int> depth(static_cast<size_t>(size));
    std::vector<std::vector<uint32_t>> anc(static_cast<size_t>(size), std::vector<uint32_t>(kTreeMaskWords, 0u));
    for (int i = 0; i < size; ++i) {
      const int par = i == 0 ? -1 : static_cast<int>(trng() % static_cast<uint32_t>(i + 1)) - 1;
      depth[static_cast<size_t>(i)] = par < 0 ? 0 : depth[static_cast<size_t>(par)] + 1;
      if (par >= 0) anc[static_cast<size_t>(i)] = anc[static_cast<size_t>(par)];
      anc[static_cast<size_t>(i)][static_cast<size_t>(i / 32)] |= 1u << (i % 32);
      b.pos.push_back(base + depth[static_cast<size_t>(i)]);
      b.seq.push_back(sq);
      b.kv_len.push_back(base);
      b.mask.insert(b.mask.end(), anc[static_cast<size_t>(i)].begin(), anc[static_cast<size_t>(i)].end());
    }
  };
  {
    AttnBatch b;  // token trees (speculative verification) beside causal rows of another sequence
    add_tree(b, 0, 2380, 100);
    for (int p = 40; p < 45; ++p) {
      b.pos.push_back(p), b.seq.push_back(1), b.kv_len.push_back(p + 1);
      b.mask.insert(b.mask.end(), kTreeMaskWords, 0u);
    }
    add_tree(b, 2, 250, 40);
    batches.push_back(b);
    AttnBatch one;
    add_tree(one, 2, 270, 22);
    batches.push_back(one);
  }
  double worst = 0;
  for (const AttnBatch& ab : batches) {
    SCOPED_TRACE("batch of " + std::to_string(ab.pos.size()) + " rows" + (ab.mask.empty() ? "" : " (tree)"));
    const int n = static_cast<int>(ab.pos.size());
    const auto q = randn(static_cast<size_t>(n * qw), static_cast<uint32_t>(n) + 5, 2.0f);  // sharp attention
    std::vector<float> out[2];
    for (int si = 0; si < 2; ++si) {
      test::KvSide& s = sides[si];
      std::vector<Tensor> keep;
      AttentionBatch b = test::paged_batch(s, layout, ab.pos, ab.seq, keep);
      if (!ab.mask.empty()) {
        b.kv_len = make_tensor(*s.be, DType::I32, n, 1, ab.kv_len.data());
        b.tree_mask = make_tensor(*s.be, DType::I32, kTreeMaskWords, n, ab.mask.data());
        keep.insert(keep.end(), {b.kv_len, b.tree_mask});
        int mx = 0;
        for (int r = 0; r < n; ++r) {
          int hi = ab.kv_len[static_cast<size_t>(r)];
          for (int j = 0; j < kMaxTreeRows; ++j)
            if (ab.mask[static_cast<size_t>(r * kTreeMaskWords + j / 32)] >> (j % 32) & 1u) hi = ab.kv_len[static_cast<size_t>(r)] + j + 1;
          mx = std::max(mx, hi);
        }
        b.max_kv_len = mx;
      }
      Tensor qt = make_tensor(*s.be, DType::F32, qw, n, q.data());
      const std::vector<float> poison(static_cast<size_t>(n * qw), std::nanf(""));
      Tensor ot = make_tensor(*s.be, DType::F32, qw, n, poison.data());
      s.be->attention(qt, s.kv, b, ap, ot);
      out[si] = fetch(*s.be, ot);
      for (auto& t : keep) s.be->free(t);
      s.be->free(qt);
      s.be->free(ot);
    }
    const ErrStats e = compare(out[1], out[0]);
    worst = std::max(worst, e.rel);
    EXPECT_EQ(e.bad, 0u);
    EXPECT_LE(e.rel, 5e-5) << "max_abs " << e.max_abs;
  }
  std::printf("%s: worst relative error %.2e over %zu batches\n", case_name({c, 0}).c_str(), worst, batches.size());
  for (auto& s : sides) {
    s.be->free(s.kv.k);
    s.be->free(s.kv.v);
    s.be->free(s.table);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, CudaKvAttention,
    testing::Values(
        // the diagonal at head_dim 128, GQA 4:1 (F32/F16 keep the original kernel: included as the baseline)
        KvAttnCase{DType::F32, DType::F32, 8, 2, 128, 0, 0.0f}, KvAttnCase{DType::F16, DType::F16, 8, 2, 128, 0, 0.0f},
        KvAttnCase{DType::BF16, DType::BF16, 8, 2, 128, 0, 0.0f}, KvAttnCase{DType::Q8_0, DType::Q8_0, 8, 2, 128, 0, 0.0f},
        KvAttnCase{DType::Q4_0, DType::Q4_0, 8, 2, 128, 0, 0.0f}, KvAttnCase{DType::Q4_1, DType::Q4_1, 8, 2, 128, 0, 0.0f},
        KvAttnCase{DType::Q5_0, DType::Q5_0, 8, 2, 128, 0, 0.0f}, KvAttnCase{DType::Q5_1, DType::Q5_1, 8, 2, 128, 0, 0.0f},
        KvAttnCase{DType::TQ3_0, DType::TQ3_0, 8, 2, 128, 0, 0.0f},
        // head sizes 64 / 256 (tq3_0 at 64: padded to one 128-group), qwen3-8b's 32/8 × 128, qwen35-27b's 24/4 × 256
        KvAttnCase{DType::Q8_0, DType::Q8_0, 4, 2, 64, 0, 0.0f}, KvAttnCase{DType::Q4_0, DType::Q4_0, 4, 2, 64, 0, 0.0f},
        KvAttnCase{DType::TQ3_0, DType::TQ3_0, 4, 2, 64, 0, 0.0f}, KvAttnCase{DType::Q8_0, DType::Q8_0, 32, 8, 128, 0, 0.0f},
        KvAttnCase{DType::TQ3_0, DType::TQ3_0, 32, 8, 128, 0, 0.0f}, KvAttnCase{DType::Q8_0, DType::Q8_0, 24, 4, 256, 0, 0.0f},
        KvAttnCase{DType::Q4_0, DType::Q4_0, 24, 4, 256, 0, 0.0f}, KvAttnCase{DType::TQ3_0, DType::TQ3_0, 24, 4, 256, 0, 0.0f},
        // padded heads: 8 (stories260K) in 32-blocks, 80 in q4_1 (96) and tq3_0 (128)
        KvAttnCase{DType::Q8_0, DType::Q8_0, 6, 6, 8, 0, 0.0f}, KvAttnCase{DType::Q4_1, DType::Q5_0, 6, 6, 80, 0, 0.0f},
        KvAttnCase{DType::TQ3_0, DType::Q8_0, 6, 3, 80, 0, 0.0f},
        // mixed pairs: f16 with q8_0, f16/f32 with tq3_0, and quantized with each other
        KvAttnCase{DType::F16, DType::Q8_0, 8, 2, 128, 0, 0.0f}, KvAttnCase{DType::Q8_0, DType::F16, 8, 2, 128, 0, 0.0f},
        KvAttnCase{DType::TQ3_0, DType::F16, 8, 2, 128, 0, 0.0f}, KvAttnCase{DType::F16, DType::TQ3_0, 8, 2, 128, 0, 0.0f},
        KvAttnCase{DType::Q8_0, DType::TQ3_0, 8, 2, 256, 0, 0.0f}, KvAttnCase{DType::TQ3_0, DType::Q4_0, 8, 2, 128, 0, 0.0f},
        KvAttnCase{DType::F32, DType::F16, 4, 4, 64, 0, 0.0f}, KvAttnCase{DType::BF16, DType::Q5_1, 4, 1, 128, 0, 0.0f},
        // sliding window and softcap (gemma-like), and a wide GQA group (one KV head for 32 query heads)
        KvAttnCase{DType::Q8_0, DType::Q8_0, 8, 4, 256, 64, 50.0f}, KvAttnCase{DType::TQ3_0, DType::TQ3_0, 8, 4, 256, 37, 30.0f},
        KvAttnCase{DType::Q4_0, DType::TQ3_0, 32, 1, 64, 0, 0.0f}),
    case_name);

// ---- whole models ------------------------------------------------------------------------------------------

const std::vector<int32_t> kPrompt = {1, 5, 300, 17, 42, 511, 260, 99, 3, 128, 256, 400, 77, 12, 333, 450, 6, 210, 64, 499, 31, 385, 150, 270};

// The 24-token prompt in one forward, then 15 decode steps feeding `feed` (the CPU's greedy tokens of the
// F32 run, so both sides see the same inputs); returns every logit row.
std::vector<float> run_model(Backend& be, const std::string& path, DType k, DType v, const std::vector<int32_t>& feed,
                             std::vector<int32_t>* greedy) {
  auto model = Model::load(path, be);
  KvCacheOptions o{1, 128, k, 16};
  o.type_k = k;
  o.type_v = v;
  auto cache = model->make_cache(o);
  const int V = model->config().n_vocab;
  Batch b;
  for (size_t i = 0; i < kPrompt.size(); ++i) b.add(kPrompt[i], static_cast<int>(i), 0, true);
  std::vector<float> all, last;
  model->forward(b, *cache, all);
  last.assign(all.end() - V, all.end());
  for (int s = 0; s < 15; ++s) {
    const int32_t tok = feed.empty() ? static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()) : feed[static_cast<size_t>(s)];
    if (greedy) greedy->push_back(tok);
    b.clear();
    b.add(tok, static_cast<int>(kPrompt.size()) + s, 0, true);
    model->forward(b, *cache, last);
    all.insert(all.end(), last.begin(), last.end());
  }
  return all;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::isfinite(a[i]) ? std::fabs(static_cast<double>(a[i]) - b[i]) : INFINITY);
  return m;
}

struct ModelCase {
  const char* stem;
  DType k, v;
};

class CudaKvModel : public testing::TestWithParam<ModelCase> {};

TEST_P(CudaKvModel, LogitsMatchCpuWithSameTypes) {
  PG_REQUIRE_GPU();
  const ModelCase c = GetParam();
  const std::string path = test::shared_path(std::string("golden/models/") + c.stem + ".gguf").string();
  auto cpu = test::make_cpu_exact();
  std::vector<int32_t> feed;
  const auto ref32 = run_model(*cpu, path, DType::F32, DType::F32, {}, &feed);
  const auto ref = run_model(*cpu, path, c.k, c.v, feed, nullptr);
  auto gpu = test::make_cuda(true);
  const auto got = run_model(*gpu, path, c.k, c.v, feed, nullptr);
  const double drift = max_diff(ref, ref32), d = max_diff(got, ref);
  std::printf("%-18s K %-5s V %-5s: CUDA vs CPU max |Δ| %.2e; the type's own drift vs F32 %.2e\n", c.stem, kv_type_name(c.k).c_str(),
              kv_type_name(c.v).c_str(), d, drift);
  EXPECT_LE(d, 0.02);
  EXPECT_LE(d, std::max(0.5 * drift, 2e-3)) << "CUDA does not reproduce the CPU's quantized cache (drift " << drift << ")";
}

std::string model_case_name(const testing::TestParamInfo<ModelCase>& i) {
  std::string s = std::string(i.param.stem) + "_" + kv_type_name(i.param.k) + "_" + kv_type_name(i.param.v);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Golden, CudaKvModel,
    testing::Values(ModelCase{"tiny-qwen3-f16", DType::Q8_0, DType::Q8_0}, ModelCase{"tiny-qwen3-f16", DType::TQ3_0, DType::TQ3_0},
                    ModelCase{"tiny-qwen3-f16", DType::Q4_0, DType::Q4_0}, ModelCase{"tiny-qwen3-f16", DType::F16, DType::Q8_0},
                    ModelCase{"tiny-llama-f16", DType::Q8_0, DType::Q8_0}, ModelCase{"tiny-llama-f16", DType::TQ3_0, DType::TQ3_0},
                    ModelCase{"tiny-gemma3-f16", DType::Q8_0, DType::Q8_0}, ModelCase{"tiny-gemma3-f16", DType::TQ3_0, DType::TQ3_0},
                    ModelCase{"tiny-qwen35-f16", DType::Q8_0, DType::Q8_0}, ModelCase{"tiny-qwen35-f16", DType::TQ3_0, DType::TQ3_0},
                    ModelCase{"tiny-qwen35moe-f16", DType::Q8_0, DType::TQ3_0}),
    model_case_name);

// Decode steps with a typed cache recorded as CUDA graphs and replayed, against the same steps run eagerly
// (CudaGraphs.ReplayMatchesEager's check for F16 caches): the typed kv_store / attention launch with shapes
// fixed by the tensors and the KV bucket, so a replay must equal eager execution up to the split-K grid,
// which eager attention sizes for the exact length (≤ 1e-4).
class CudaKvGraphs : public testing::TestWithParam<ModelCase> {};

TEST_P(CudaKvGraphs, ReplayMatchesEager) {
  PG_REQUIRE_GPU();
  const ModelCase c = GetParam();
  const std::string path = test::shared_path(std::string("golden/models/") + c.stem + ".gguf").string();
  auto gpu = test::make_cuda(false);
  CudaOptions o;
  o.graphs = false;
  gpu->set_options(o);
  std::vector<int32_t> feed;
  const auto eager = run_model(*gpu, path, c.k, c.v, {}, &feed);
  o.graphs = true;
  gpu->set_options(o);
  const auto replay = run_model(*gpu, path, c.k, c.v, feed, nullptr);
  const double d = max_diff(replay, eager);
  std::printf("%s K %s V %s: graphs vs eager max %.2e\n", c.stem, kv_type_name(c.k).c_str(), kv_type_name(c.v).c_str(), d);
  EXPECT_LE(d, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Decode, CudaKvGraphs,
                         testing::Values(ModelCase{"tiny-qwen3-Q4_K_M", DType::Q8_0, DType::Q8_0},
                                         ModelCase{"tiny-qwen3-Q4_K_M", DType::TQ3_0, DType::TQ3_0},
                                         ModelCase{"tiny-qwen35-f16", DType::Q4_0, DType::TQ3_0}),
                         model_case_name);

}  // namespace
}  // namespace pg
