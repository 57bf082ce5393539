// The SIMT flash-decoding attention (backend/cuda/attention_decode.cu, CudaOptions::fa_vec) on the GPU:
// against the CPU reference (exact mode), against the default decode route (tensor-core kernel) and the FP32
// kernel on the same device cache, and a CUDA graph replayed at another KV length than at capture against the
// eager launch (bit-identical). Rows 1..8 of one or several sequences, head_dim 64/128/256, GQA 1/3/4/8,
// window, soft-cap, token trees, depths 0..3299 (split and unsplit plans); F16 caches and (issue 12) Q8_0 caches
// and the mixed pairs F16/Q8_0, Q8_0/F16, then q4_0 / q4_1 / q5_0 / q5_1 / tq3_0 / bf16 caches (K = V) and an F16
// K with each low-bit V, written by each backend's own kv_store (bytes checked equal first).
// Host emulation of the same code: test_cuda_favec_emulated.cpp. Written without device time (label `cuda`);
// the typed cases not yet run on a GPU.
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
#include "testutil.h"

namespace pg {
namespace {

using test::compare;
using test::ErrStats;
using test::fetch;
using test::make_tensor;
using test::randn;

struct VecCase {
  int n_head, n_head_kv, head_dim, window;
  float softcap;
  DType k = DType::F16, v = DType::F16;  // cache element types
};

std::string vec_case_name(const testing::TestParamInfo<VecCase>& i) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "h%d_kv%d_d%d_w%d_cap%d", i.param.n_head, i.param.n_head_kv, i.param.head_dim, i.param.window,
                static_cast<int>(i.param.softcap));
  std::string name = buf;
  if (i.param.k != DType::F16 || i.param.v != DType::F16) {
    // Appended piece by piece: GCC 12 at -O3 flags `"_" + std::string&&` with a false -Wrestrict.
    name += '_';
    name += kv_type_name(i.param.k);
    name += '_';
    name += kv_type_name(i.param.v);
  }
  return name;
}

CudaOptions vec_options(bool fa_vec) {
  CudaOptions o;  // default routing: decode calls on the tensor-core kernel (fa_decode) unless fa_vec takes them
  o.fa_vec = fa_vec;
  o.fa_vec_typed = fa_vec;  // the typed cases (q8_0 and mixed pairs) too
  o.fa_vec_max_rows = 8;         // every shape the kernel takes, not only the default's one-row, head ≤ 128 calls
  o.fa_vec_max_head_dim = 256;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_CHUNK"); e && *e) o.fa_vec_min_chunk = std::max(1, std::atoi(e));
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_STAGES"); e && *e) o.fa_vec_stages = std::clamp(std::atoi(e), 2, 4);
  if (const char* e = std::getenv("PEREGRINE_CUDA_PDL"); e && std::string(e) == "0") o.pdl = false;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_BLOCKS"); e && *e) o.fa_vec_blocks_per_sm = std::max(1, std::atoi(e));
  return o;
}

class CudaFaVec : public testing::TestWithParam<VecCase> {};

TEST_P(CudaFaVec, MatchesCpuTensorCoresAndGraphReplay) {
  PG_REQUIRE_GPU();
  const VecCase c = GetParam();
  auto cpu = test::make_cpu_exact();
  auto gpu = std::make_unique<CudaBackend>(0, vec_options(true));
  const int n_seq = 3, lens[n_seq] = {3300, 400, 300};
  const test::PagedKvLayout layout(n_seq, 3300, 16, 11);
  const int64_t kvw = static_cast<int64_t>(c.n_head_kv) * c.head_dim, qw = static_cast<int64_t>(c.n_head) * c.head_dim;
  const bool typed = c.k != DType::F16 || c.v != DType::F16;
  test::KvSide sides[2] = {{cpu.get(), {}, {}}, {gpu.get(), {}, {}}};
  for (auto& s : sides) {
    s.kv.k = s.be->alloc(c.k, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.k, c.head_dim), layout.n_cells());
    s.kv.v = s.be->alloc(c.v, static_cast<int64_t>(c.n_head_kv) * kv_head_width(c.v, c.head_dim), layout.n_cells());
    s.kv.n_head_kv = c.n_head_kv, s.kv.head_dim = c.head_dim, s.kv.head_dim_v = c.head_dim;
    const std::vector<uint8_t> zk(s.kv.k.nbytes(), 0), zv(s.kv.v.nbytes(), 0);  // same initial bytes on both sides
    s.be->upload(s.kv.k, zk.data(), zk.size());
    s.be->upload(s.kv.v, zv.data(), zv.size());
    s.table = test::upload_block_table(*s.be, layout);
  }
  for (int sq = 0; sq < n_seq; ++sq)
    for (int p0 = 0; p0 < lens[sq]; p0 += 512) {
      std::vector<int32_t> pos, seq;
      for (int p = p0; p < std::min(lens[sq], p0 + 512); ++p) pos.push_back(p), seq.push_back(sq);
      const int n = static_cast<int>(pos.size());
      const auto k = randn(static_cast<size_t>(n * kvw), static_cast<uint32_t>(3000 + sq * 31 + p0), 2.0f);
      const auto v = randn(static_cast<size_t>(n * kvw), static_cast<uint32_t>(4000 + sq * 31 + p0));
      for (auto& s : sides) test::store_kv_rows(s, layout, pos, seq, kvw, k, v);
    }
  // The comparisons below are of kernels on identical inputs: the CUDA store writes kv_quantize_row's bytes.
  ASSERT_TRUE(test::fetch_bytes(*cpu, sides[0].kv.k) == test::fetch_bytes(*gpu, sides[1].kv.k)) << "K caches differ";
  ASSERT_TRUE(test::fetch_bytes(*cpu, sides[0].kv.v) == test::fetch_bytes(*gpu, sides[1].kv.v)) << "V caches differ";
  AttentionParams ap;
  ap.n_head = c.n_head;
  ap.n_head_kv = c.n_head_kv;
  ap.head_dim = c.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ap.sliding_window = c.window;
  ap.logit_softcap = c.softcap;

  struct VB {
    std::string what;
    std::vector<int32_t> pos, seq;
    std::vector<int32_t> kv_len = {};
    std::vector<uint32_t> mask = {};
  };
  std::vector<VB> batches;
  batches.push_back(VB{"depth 0", {0}, {2}});
  batches.push_back(VB{"depth 3", {3}, {1}});
  batches.push_back(VB{"depth 311", {311}, {2}});
  batches.push_back(VB{"depth 3299", {3299}, {0}});
  batches.push_back(VB{"decode rows of 3 sequences", {3299, 399, 299}, {0, 1, 2}});
  {
    VB ch{"chain of 8 rows at 2000", {}, {}};
    for (int p = 2000; p < 2008; ++p) ch.pos.push_back(p), ch.seq.push_back(0);
    batches.push_back(ch);
    VB m{"8 rows of 3 sequences", {10, 3200, 390, 0, 299, 3250, 200, 1}, {1, 0, 1, 2, 2, 0, 2, 0}};
    batches.push_back(m);
    std::mt19937 rng(9);
    for (int rows : {2, 5, 8}) {
      VB t{"tree of " + std::to_string(rows) + " rows at depth 3200", {}, {}};
      std::vector<int> parent(static_cast<size_t>(rows), -1), depth(static_cast<size_t>(rows), 0);
      std::vector<std::vector<uint32_t>> mk(static_cast<size_t>(rows), std::vector<uint32_t>(kTreeMaskWords, 0u));
      for (int i = 0; i < rows; ++i) {
        if (i > 0) {
          parent[static_cast<size_t>(i)] = static_cast<int>(rng() % static_cast<uint32_t>(i));
          mk[static_cast<size_t>(i)] = mk[static_cast<size_t>(parent[static_cast<size_t>(i)])];
          depth[static_cast<size_t>(i)] = depth[static_cast<size_t>(parent[static_cast<size_t>(i)])] + 1;
        }
        mk[static_cast<size_t>(i)][0] |= 1u << i;
        t.pos.push_back(3200 + depth[static_cast<size_t>(i)]), t.seq.push_back(0), t.kv_len.push_back(3200);
        for (uint32_t w : mk[static_cast<size_t>(i)]) t.mask.push_back(w);
      }
      batches.push_back(t);
    }
  }
  for (const VB& vb : batches) {
    SCOPED_TRACE(vb.what);
    const int n = static_cast<int>(vb.pos.size());
    const auto q = randn(static_cast<size_t>(n * qw), static_cast<uint32_t>(91 + n));
    // 0: CPU, 1: fa_vec, 2: default decode route (tensor cores), 3: FP32 kernel (attention.cu).
    std::vector<float> out[4];
    for (int run = 0; run < 4; ++run) {
      test::KvSide& s = sides[run == 0 ? 0 : 1];
      if (run > 0) {
        CudaOptions o = vec_options(run == 1);
        if (run == 3) o.fa_decode = false, o.fa_prefill_min_rows = 0;
        gpu->set_options(o);
      }
      std::vector<Tensor> keep;
      AttentionBatch b = test::paged_batch(s, layout, vb.pos, vb.seq, keep);
      if (!vb.kv_len.empty()) {
        b.kv_len = make_tensor(*s.be, DType::I32, n, 1, vb.kv_len.data());
        b.tree_mask = make_tensor(*s.be, DType::I32, kTreeMaskWords, n, vb.mask.data());
        keep.push_back(b.kv_len);
        keep.push_back(b.tree_mask);
        int mx = 0;
        for (int r = 0; r < n; ++r)
          mx = std::max(mx, cuda::fa::tree_hi(vb.kv_len[static_cast<size_t>(r)], vb.mask.data() + static_cast<size_t>(r) * kTreeMaskWords,
                                              kTreeMaskWords));
        b.max_kv_len = mx;
      }
      Tensor qt = make_tensor(*s.be, DType::F32, qw, n, q.data());
      const std::vector<float> poison(static_cast<size_t>(n * qw), std::nanf(""));
      Tensor ot = make_tensor(*s.be, DType::F32, qw, n, poison.data());
      if (run == 1) {
        cuda::AttentionArgs probe;  // the shape must be one fa_vec takes, else run 1 silently tests another kernel
        probe.q = qt.as<float>(), probe.q_stride = qw, probe.k = s.kv.k.data, probe.v = s.kv.v.data;
        probe.n = n, probe.n_head = c.n_head, probe.n_head_kv = c.n_head_kv, probe.head_dim = c.head_dim, probe.block_size = 16;
        // (typed fields as CudaBackend::attention sets them)
        probe.kv_f16 = c.k == DType::F16, probe.typed = typed, probe.k_type = c.k, probe.v_type = c.v;
        probe.k_row_bytes = s.kv.k.row_bytes(), probe.v_row_bytes = s.kv.v.row_bytes();
        EXPECT_TRUE(cuda::attention_decode_supported(probe));
      }
      s.be->attention(qt, s.kv, b, ap, ot);
      out[run] = fetch(*s.be, ot);
      for (auto& t : keep) s.be->free(t);
      s.be->free(qt);
      s.be->free(ot);
    }
    const ErrStats ev = compare(out[1], out[0]);
    EXPECT_EQ(ev.bad, 0u) << "fa_vec: NaN/Inf or unwritten outputs";
    // FP32 arithmetic (on the same values as core's dequantizers: each one rounding, as the CPU): the FP32 kernel's bound.
    EXPECT_LE(ev.rel, 2e-5) << "fa_vec vs CPU, max_abs " << ev.max_abs;
    const ErrStats et = compare(out[1], out[2]);
    EXPECT_LE(et.rel, 2e-3) << "fa_vec vs tensor-core route, max_abs " << et.max_abs;
    const ErrStats e32 = compare(out[1], out[3]);  // typed caches: attention.cu's attn_kvq_kernel
    EXPECT_LE(e32.rel, 2e-5) << "fa_vec vs FP32 kernel, max_abs " << e32.max_abs;
    std::printf("%s: fa_vec vs cpu %.2e, vs tensor cores %.2e, vs fp32 kernel %.2e\n", vb.what.c_str(), ev.rel, et.rel, e32.rel);
  }

  // Graph replay at another length than at capture: one decode row of seq 0, captured at position 700 with the
  // grid sized for a 4096 bucket, replayed at 3299 (more non-empty splits), 100 and 0 (fewer, no split), each
  // against the eager launch at that position — the same bits.
  {
    gpu->set_options(vec_options(true));
    std::vector<Tensor> keep;
    test::KvSide& s = sides[1];
    AttentionBatch b = test::paged_batch(s, layout, {700}, {0}, keep);
    const auto q = randn(static_cast<size_t>(qw), 123);
    Tensor qt = make_tensor(*gpu, DType::F32, qw, 1, q.data());
    Tensor ot = gpu->alloc(DType::F32, qw, 1);
    gpu->set_attention_kv_capacity(4096);
    b.max_kv_len = 701;
    gpu->attention(qt, s.kv, b, ap, ot);  // warm-up: scratch sized outside the capture
    gpu->synchronize();
    gpu->begin_capture();
    gpu->attention(qt, s.kv, b, ap, ot);
    const int graph = gpu->end_capture();
    for (int p : {3299, 100, 0, 700}) {
      SCOPED_TRACE("replay at position " + std::to_string(p));
      gpu->upload(b.positions, &p, 4);
      gpu->replay(graph);
      const std::vector<float> rep = fetch(*gpu, ot);
      gpu->set_attention_kv_capacity(0);
      AttentionBatch e = b;
      e.max_kv_len = p + 1;
      gpu->attention(qt, s.kv, e, ap, ot);
      const std::vector<float> eager = fetch(*gpu, ot);
      gpu->set_attention_kv_capacity(4096);
      EXPECT_EQ(0, std::memcmp(rep.data(), eager.data(), rep.size() * sizeof(float))) << "graph replay differs from the eager launch";
    }
    gpu->drop_graphs();
    gpu->set_attention_kv_capacity(0);
    for (auto& t : keep) gpu->free(t);
    gpu->free(qt);
    gpu->free(ot);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFaVec,
                         testing::Values(VecCase{32, 8, 128, 0, 0.0f},   // qwen3-8b
                                         VecCase{24, 4, 256, 0, 0.0f},   // head 256, GQA 6 (slots 8)
                                         VecCase{8, 1, 64, 50, 20.0f},   // GQA 8, window, softcap
                                         VecCase{6, 2, 64, 0, 0.0f},     // GQA 3
                                         VecCase{4, 4, 128, 0, 30.0f},   // GQA 1, softcap
                                         VecCase{16, 2, 256, 100, 0.0f},  // head 256, GQA 8, window
                                         // Q8_0 caches and the mixed pairs (issue 12):
                                         VecCase{32, 8, 128, 0, 0.0f, DType::Q8_0, DType::Q8_0},    // qwen3-8b -ctk/-ctv q8_0
                                         VecCase{24, 4, 256, 0, 0.0f, DType::Q8_0, DType::Q8_0},    // head 256, GQA 6
                                         VecCase{8, 1, 64, 50, 20.0f, DType::Q8_0, DType::Q8_0},    // GQA 8, window, softcap
                                         VecCase{4, 4, 128, 0, 30.0f, DType::Q8_0, DType::Q8_0},    // GQA 1, softcap
                                         VecCase{16, 2, 256, 100, 0.0f, DType::Q8_0, DType::Q8_0},  // head 256, GQA 8, window
                                         VecCase{32, 8, 128, 0, 0.0f, DType::F16, DType::Q8_0},     // mixed pairs
                                         VecCase{6, 2, 64, 0, 0.0f, DType::Q8_0, DType::F16},
                                         VecCase{24, 4, 256, 0, 0.0f, DType::Q8_0, DType::F16},
                                         // The other types (issue 12, second part): K = V, and an F16 K with a low-bit V
                                         // (tq3_0: head_dim 128 / 256 only).
                                         VecCase{32, 8, 128, 0, 0.0f, DType::Q4_0, DType::Q4_0},    // qwen3-8b -ctk/-ctv q4_0
                                         VecCase{8, 1, 64, 50, 20.0f, DType::Q4_0, DType::Q4_0},    // GQA 8, window, softcap
                                         VecCase{32, 8, 128, 0, 0.0f, DType::Q4_1, DType::Q4_1},
                                         VecCase{6, 2, 64, 0, 0.0f, DType::Q4_1, DType::Q4_1},      // GQA 3
                                         VecCase{32, 8, 128, 0, 0.0f, DType::Q5_0, DType::Q5_0},
                                         VecCase{24, 4, 256, 0, 0.0f, DType::Q5_0, DType::Q5_0},    // head 256, GQA 6
                                         VecCase{32, 8, 128, 0, 0.0f, DType::Q5_1, DType::Q5_1},
                                         VecCase{4, 4, 128, 0, 30.0f, DType::Q5_1, DType::Q5_1},    // GQA 1, softcap
                                         VecCase{32, 8, 128, 0, 0.0f, DType::TQ3_0, DType::TQ3_0},
                                         VecCase{16, 2, 256, 100, 0.0f, DType::TQ3_0, DType::TQ3_0},  // head 256, GQA 8, window
                                         VecCase{32, 8, 128, 0, 0.0f, DType::BF16, DType::BF16},
                                         VecCase{8, 1, 64, 50, 20.0f, DType::BF16, DType::BF16},
                                         VecCase{32, 8, 128, 0, 0.0f, DType::F16, DType::Q4_0},
                                         VecCase{6, 2, 64, 0, 0.0f, DType::F16, DType::Q4_1},
                                         VecCase{24, 4, 256, 0, 0.0f, DType::F16, DType::Q5_0},
                                         VecCase{8, 1, 64, 50, 20.0f, DType::F16, DType::Q5_1},
                                         VecCase{32, 8, 128, 0, 0.0f, DType::F16, DType::TQ3_0},
                                         VecCase{4, 4, 128, 0, 30.0f, DType::F16, DType::TQ3_0}),
                         vec_case_name);

}  // namespace
}  // namespace pg
