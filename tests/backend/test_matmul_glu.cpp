// Backend::matmul_glu's default implementation (backend.h) is exactly matmul_shared(gate → y, up → u)
// followed by glu(y, u, y, act): on the CPU backend it must equal separate matmuls + glu bit for bit, for
// quantized and float weights, one row (decode) and several, SiLU and GELU, default and exact mode.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
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

// (M, K) weights of type t from random values, held by the caller (the CPU backend references them).
std::vector<uint8_t> make_weights(DType t, int64_t K, int64_t M, uint32_t seed) {
  const auto f = randn(static_cast<size_t>(K * M), seed, 0.1f);
  const size_t rb = row_bytes(t, K);
  std::vector<uint8_t> w(rb * static_cast<size_t>(M));
  for (int64_t r = 0; r < M; ++r) quantize_row(t, f.data() + r * K, w.data() + static_cast<size_t>(r) * rb, K);
  return w;
}

TEST(MatmulGlu, DefaultEqualsMatmulsThenGlu) {
  for (const bool exact : {false, true}) {
    CpuOptions o;
    o.n_threads = 2;
    o.exact_f32 = exact;
    CpuBackend be(o);
    for (const DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F32}) {
      for (const int64_t n : {1, 3}) {
        for (const Activation act : {Activation::Silu, Activation::GeluTanh}) {
          const int64_t K = 512, M = 37;
          const auto gb = make_weights(t, K, M, 1), ub = make_weights(t, K, M, 2);
          const int64_t ne[4] = {K, M, 1, 1};
          Tensor gw = be.load_weight(t, ne, gb.data()), uw = be.load_weight(t, ne, ub.data());
          const auto xv = randn(static_cast<size_t>(K * n), 3, 1.0f);
          Tensor x = be.alloc(DType::F32, K, n);
          be.upload(x, xv.data(), xv.size() * sizeof(float));
          Tensor y = be.alloc(DType::F32, M, n), u = be.alloc(DType::F32, M, n);  // (n, M)
          Tensor g2 = be.alloc(DType::F32, M, n), u2 = be.alloc(DType::F32, M, n), y2 = be.alloc(DType::F32, M, n);
          be.matmul_glu(x, gw, uw, act, y, u);
          be.matmul(gw, x, g2);
          be.matmul(uw, x, u2);
          be.glu(g2, u2, y2, act);
          EXPECT_EQ(std::memcmp(y.data, y2.data, y.nbytes()), 0) << dtype_name(t) << " n=" << n << " exact=" << exact;
          EXPECT_EQ(std::memcmp(u.data, u2.data, u.nbytes()), 0) << "u holds the up product";
          for (Tensor* p : {&x, &y, &u, &g2, &u2, &y2}) be.free(*p);  // not the weights: they reference gb/ub
        }
      }
    }
  }
}

}  // namespace
}  // namespace pg
