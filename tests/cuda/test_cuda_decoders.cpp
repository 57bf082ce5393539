// The CUDA block decoders (backend/cuda/common.cuh), compiled for the host through a shim of the few
// intrinsics they use, against core's reference dequantize_row: every run and every chunk of every
// weight type must reproduce it bit for bit, and the chunks of a block must cover each element once.
// Needs no GPU (runs in CI): it pins down the bit-level layout work that the GPU tests then build on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/common.cuh"
#include "core/quant.h"

namespace pg {
namespace {

template <class Q>
void check_decoder(DType t) {
  SCOPED_TRACE(std::string(dtype_name(t)));
  const int64_t blocks = 24, n = blocks * Q::kElems;
  std::mt19937 rng(static_cast<uint32_t>(t) + 1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> f(static_cast<size_t>(n));
  for (auto& v : f) v = nd(rng);
  for (int i = 0; i < 8; ++i) f[static_cast<size_t>(rng() % n)] *= 40.0f;  // outliers stress the scales
  const size_t rb = row_bytes(t, n);
  // 16-byte aligned copy of the row, as in device memory.
  std::vector<uint8_t> store(rb + 16);
  uint8_t* bytes = store.data() + (16 - reinterpret_cast<uintptr_t>(store.data()) % 16) % 16;
  quantize_row(t, f.data(), bytes, n);
  std::vector<float> ref(static_cast<size_t>(n));
  dequantize_row(t, bytes, ref.data(), n);
  size_t mismatches = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = bytes + b * Q::kBytes;
    ASSERT_EQ(reinterpret_cast<uintptr_t>(blk) % Q::kAlign, 0u) << "kAlign promises more than the layout gives";
    const float* r = ref.data() + b * Q::kElems;
    for (int run = 0; run < Q::kElems / 16; ++run) {
      float w[16];
      Q::run(blk, run, w);
      for (int i = 0; i < 16; ++i) mismatches += std::memcmp(&w[i], &r[16 * run + i], 4) != 0;
    }
    std::vector<int> covered(static_cast<size_t>(Q::kElems), 0);
    for (int c = 0; c < Q::kElems / 32; ++c) {
      float w[32];
      int off0 = -1, off1 = -1;
      cuda::decode_chunk<Q>(blk, c, w, off0, off1);
      ASSERT_TRUE(off0 >= 0 && off0 + 16 <= Q::kElems && off1 >= 0 && off1 + 16 <= Q::kElems);
      ASSERT_EQ(off0 % 16, 0);
      ASSERT_EQ(off1 % 16, 0);
      for (int i = 0; i < 16; ++i) {
        mismatches += std::memcmp(&w[i], &r[off0 + i], 4) != 0;
        mismatches += std::memcmp(&w[16 + i], &r[off1 + i], 4) != 0;
        ++covered[static_cast<size_t>(off0 + i)];
        ++covered[static_cast<size_t>(off1 + i)];
      }
    }
    for (int e = 0; e < Q::kElems; ++e) ASSERT_EQ(covered[static_cast<size_t>(e)], 1) << "element " << e << " of block " << b;
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(CudaDecoders, BitExactWithDequantizeRow) {
  const DType types[] = {DType::F32,  DType::F16,    DType::BF16,   DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                         DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  int n = 0;
  for (DType t : types) {
    const bool ok = cuda::dispatch_type(t, [&]<class Q>() { check_decoder<Q>(t); });
    EXPECT_TRUE(ok) << dtype_name(t);
    n += ok;
  }
  EXPECT_EQ(n, 15);
}

// The GEMV's fused chunk dot (d·Σq·x − m·Σx) against a double-precision dot with dequantize_row's
// weights: |error| ≤ 2e-6 · Σ|w·x| for every chunk and both activation rows.
template <class Q>
void check_dot(DType t) {
  if constexpr (Q::kDot) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t blocks = 16, n = blocks * Q::kElems;
    std::mt19937 rng(static_cast<uint32_t>(t) + 7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> f(static_cast<size_t>(n)), xa(static_cast<size_t>(n)), xb(static_cast<size_t>(n));
    for (auto& v : f) v = nd(rng);
    for (auto& v : xa) v = nd(rng);
    for (auto& v : xb) v = 3.0f * nd(rng) + 1.0f;
    std::vector<uint8_t> store(row_bytes(t, n) + 16);
    uint8_t* bytes = store.data() + (16 - reinterpret_cast<uintptr_t>(store.data()) % 16) % 16;
    quantize_row(t, f.data(), bytes, n);
    std::vector<float> ref(static_cast<size_t>(n));
    dequantize_row(t, bytes, ref.data(), n);
    double worst = 0;
    for (int64_t b = 0; b < blocks; ++b)
      for (int c = 0; c < Q::kElems / 32; ++c) {
        int off0, off1;
        Q::offsets(c, off0, off1);
        float x[2][32], xs[2][2] = {{0, 0}, {0, 0}}, acc[2] = {0, 0};
        double want[2] = {0, 0}, mag[2] = {0, 0};
        for (int a = 0; a < 2; ++a) {
          const std::vector<float>& src = a ? xb : xa;
          for (int i = 0; i < 16; ++i) {
            x[a][i] = src[static_cast<size_t>(b * Q::kElems + off0 + i)];
            x[a][16 + i] = src[static_cast<size_t>(b * Q::kElems + off1 + i)];
            xs[a][0] += x[a][i];
            xs[a][1] += x[a][16 + i];
            for (int h = 0; h < 2; ++h) {
              const double w = ref[static_cast<size_t>(b * Q::kElems + (h ? off1 : off0) + i)];
              want[a] += w * x[a][16 * h + i];
              mag[a] += std::fabs(w * x[a][16 * h + i]);
            }
          }
        }
        Q::template dot<2>(bytes + b * Q::kBytes, c, x, xs, acc);
        for (int a = 0; a < 2; ++a) {
          const double e = std::fabs(acc[a] - want[a]) / std::max(mag[a], 1e-30);
          worst = std::max(worst, e);
          EXPECT_LE(e, 2e-6) << "block " << b << " chunk " << c << " row " << a;
        }
      }
    std::printf("%-7s fused chunk dot: worst relative error %.2e\n", std::string(dtype_name(t)).c_str(), worst);
  }
}

TEST(CudaDecoders, FusedChunkDot) {
  const DType types[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  for (DType t : types) {
    bool has = false;
    cuda::dispatch_type(t, [&]<class Q>() {
      has = Q::kDot;
      check_dot<Q>(t);
    });
    EXPECT_TRUE(has) << dtype_name(t);
  }
}

TEST(CudaDecoders, Iq4LevelTable) {
  for (uint32_t v = 0; v < 16; ++v) EXPECT_EQ(cuda::iq4nl_level(v), static_cast<float>(kIQ4NLValues[v])) << v;
}

}  // namespace
}  // namespace pg
