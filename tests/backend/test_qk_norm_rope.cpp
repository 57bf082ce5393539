// Backend::qk_norm_rope's default (backend.h): exactly rms_norm q, rms_norm k (each only when its weight is
// valid), rope q, rope k — checked bit for bit on the CPU reference against those ops called one by one, for
// full and partial rotary, both styles, F32/F16/absent weights (absent = rope only, not a weightless norm),
// GQA, 1 and 37 rows. The CUDA one-launch form is checked against the same ops on the GPU in
// tests/cuda/test_cuda_ops.cpp (CudaOps.QkNormRopeFusedBitIdentical).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/quant.h"

namespace pg {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor make(CpuBackend& be, DType t, int64_t cols, int64_t rows, const void* data) {
  Tensor x = be.alloc(t, cols, rows);
  be.upload(x, data, x.nbytes());
  return x;
}

std::vector<float> fetch(CpuBackend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  be.download(t, v.data(), v.size() * sizeof(float));
  return v;
}

TEST(QkNormRope, DefaultEqualsTheFourOps) {
  CpuOptions co;
  co.n_threads = 2;
  co.exact_f32 = true;
  CpuBackend be(co);
  struct Case {
    int n_head, n_head_kv, head_dim, n_rot;
  };
  const Case cases[] = {{8, 2, 64, 64}, {4, 4, 128, 128}, {6, 2, 128, 64}, {4, 1, 256, 64}, {3, 1, 80, 80}};
  int checked = 0;
  for (const Case& c : cases)
    for (const int n : {1, 37})
      for (RopeStyle style : {RopeStyle::Norm, RopeStyle::Neox})
        for (int wmode = 0; wmode < 4; ++wmode) {  // 0 F32 weights, 1 F16 weights, 2 none, 3 q only (F32)
          SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " n_rot " + std::to_string(c.n_rot) + " rows " + std::to_string(n) +
                       " neox " + std::to_string(style == RopeStyle::Neox) + " wmode " + std::to_string(wmode));
          const int64_t qw = static_cast<int64_t>(c.n_head) * c.head_dim, kw = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
          const auto qv = randn(static_cast<size_t>(n * qw), 1u + static_cast<uint32_t>(n), 3.0f);
          const auto kv = randn(static_cast<size_t>(n * kw), 2u + static_cast<uint32_t>(n), 3.0f);
          const auto wq = randn(static_cast<size_t>(c.head_dim), 3u, 1.0f), wk = randn(static_cast<size_t>(c.head_dim), 4u, 1.0f);
          std::vector<uint16_t> wqh(wq.size()), wkh(wk.size());
          quantize_row(DType::F16, wq.data(), wqh.data(), c.head_dim);
          quantize_row(DType::F16, wk.data(), wkh.data(), c.head_dim);
          std::vector<int32_t> pos(static_cast<size_t>(n));
          std::mt19937 rng(9);
          for (auto& p : pos) p = static_cast<int32_t>(rng() % 40000);
          pos[0] = 0;
          const bool f16 = wmode == 1, has_q = wmode != 2, has_k = wmode == 0 || wmode == 1;
          auto weight = [&](bool has, const std::vector<float>& w, const std::vector<uint16_t>& wh) {
            if (!has) return Tensor{};
            return f16 ? make(be, DType::F16, c.head_dim, 1, wh.data()) : make(be, DType::F32, c.head_dim, 1, w.data());
          };
          Tensor tq = weight(has_q, wq, wqh), tk = weight(has_k, wk, wkh);
          Tensor p = make(be, DType::I32, n, 1, pos.data());
          // The op.
          Tensor q1 = make(be, DType::F32, qw, n, qv.data()), k1 = make(be, DType::F32, kw, n, kv.data());
          be.qk_norm_rope(q1, k1, tq, tk, p, c.n_head, c.n_head_kv, c.head_dim, c.n_rot, 1e6f, style, 1e-6f);
          // The four ops, as the model called them before the op existed.
          Tensor q2 = make(be, DType::F32, qw, n, qv.data()), k2 = make(be, DType::F32, kw, n, kv.data());
          if (has_q) {
            Tensor qh = q2.reshape_2d(c.head_dim, static_cast<int64_t>(n) * c.n_head);
            be.rms_norm(qh, tq, qh, 1e-6f);
          }
          if (has_k) {
            Tensor kh = k2.reshape_2d(c.head_dim, static_cast<int64_t>(n) * c.n_head_kv);
            be.rms_norm(kh, tk, kh, 1e-6f);
          }
          be.rope(q2, p, c.n_head, c.head_dim, c.n_rot, 1e6f, style);
          be.rope(k2, p, c.n_head_kv, c.head_dim, c.n_rot, 1e6f, style);
          const auto a = fetch(be, q1), b = fetch(be, q2), ak = fetch(be, k1), bk = fetch(be, k2);
          EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "q";
          EXPECT_EQ(0, std::memcmp(ak.data(), bk.data(), ak.size() * sizeof(float))) << "k";
          // An absent weight is no norm: k of wmode 3 is rope of the raw input, so its head norms keep their scale.
          if (wmode == 3) {
            double s = 0;
            for (int i = 0; i < c.head_dim; ++i) s += static_cast<double>(ak[static_cast<size_t>(i)]) * ak[static_cast<size_t>(i)];
            EXPECT_GT(s / c.head_dim, 2.0) << "k was normalised although k_norm is absent";
          }
          for (Tensor* t : {&tq, &tk, &p, &q1, &k1, &q2, &k2})
            if (t->valid()) be.free(*t);
          ++checked;
        }
  EXPECT_EQ(checked, 5 * 2 * 2 * 4);
}

}  // namespace
}  // namespace pg
