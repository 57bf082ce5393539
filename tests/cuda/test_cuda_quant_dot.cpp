// The 8-bit-activation weight decoders of the decode GEMVs (backend/cuda/quant_dot.cuh), compiled for the
// host through cuda_host_shim.h: their loads against the documented byte layout of each block type (at every
// 2-byte alignment a block can have in a row), and each piece's dot product against core's dequantized
// weights. Needs no GPU (runs in CI); the GPU tests then check the kernels built on these decoders.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/quant_dot.cuh"
#include "core/dtype.h"
#include "core/quant.h"

namespace pg {
namespace {

using namespace pg::cuda::wq;

uint32_t le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint32_t le16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// A 16-byte aligned buffer of random bytes with room for `bytes` at offset `off` and slack on both sides.
struct Buf {
  std::vector<uint8_t> store;
  uint8_t* base;
  Buf(size_t bytes, uint32_t seed) : store(bytes + 64) {
    base = store.data() + (16 - reinterpret_cast<uintptr_t>(store.data()) % 16) % 16 + 16;
    std::mt19937 rng(seed);
    for (auto& b : store) b = static_cast<uint8_t>(rng());
  }
};

template <int W>
void check_words(uint32_t seed) {
  Buf buf(64, seed);
  for (int off = 0; off < 16; off += 2) {
    const uint8_t* p = buf.base + off;
    uint32_t got[W], got_shared[W];
    ld_words_a2<W>(p, got);
    ld_words_a2<W, false>(p, got_shared);  // the shared-memory form (gemv_pipe.cuh)
    for (int i = 0; i < W; ++i) {
      EXPECT_EQ(got[i], le32(p + 4 * i)) << "W " << W << " offset " << off << " word " << i;
      EXPECT_EQ(got[i], ldg32a2(p + 4 * i)) << "W " << W << " offset " << off << " word " << i;
      EXPECT_EQ(got_shared[i], le32(p + 4 * i)) << "W " << W << " offset " << off << " word " << i;
    }
  }
}

TEST(CudaQuantDot, AlignedWordLoadsEqualHalfwordLoads) {
  check_words<1>(1);
  check_words<2>(2);
  check_words<4>(3);
  check_words<8>(4);
  check_words<9>(5);
}

// Rows of `blocks` blocks of T starting at every even offset mod 16 (a row of Q6_K/Q8_0/Q4_0 blocks is only
// 2-byte aligned in general): each piece's Raw equals the bytes the layout comment of quant_dot.cuh names.
TEST(CudaQuantDot, Q6KLoadsFollowTheBlockLayout) {
  constexpr int blocks = 5;
  Buf buf(blocks * K6::kBytes + 16, 7);
  for (int off = 0; off < 16; off += 2) {
    const uint8_t* row = buf.base + off;
    for (int pi = 0; pi < blocks * K6::kPieces; ++pi) {
      const K6::Raw r = K6::load(row, pi);
      const uint8_t* b = row + static_cast<size_t>(pi / 4) * K6::kBytes;
      const int hf = (pi / 2) % 2, lq = pi % 2;
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(r.ql0[i], le32(b + 64 * hf + 16 * lq + 4 * i)) << "offset " << off << " piece " << pi;
        EXPECT_EQ(r.ql1[i], le32(b + 64 * hf + 32 + 16 * lq + 4 * i)) << "offset " << off << " piece " << pi;
        EXPECT_EQ(r.qh[i], le32(b + 128 + 32 * hf + 16 * lq + 4 * i)) << "offset " << off << " piece " << pi;
      }
      const int s0 = 192 + 8 * hf + lq;  // the run scales 8hf + lq + {0, 2, 4, 6}
      EXPECT_EQ(r.sc, static_cast<uint32_t>(b[s0]) | static_cast<uint32_t>(b[s0 + 2]) << 8 | static_cast<uint32_t>(b[s0 + 4]) << 16 |
                          static_cast<uint32_t>(b[s0 + 6]) << 24);
      EXPECT_EQ(r.d, le16(b + 208));
    }
  }
}

template <class T, int W>
void check_d_q_loads(uint32_t seed) {
  constexpr int blocks = 9;
  Buf buf(blocks * T::kBytes + 16, seed);
  for (int off = 0; off < 16; off += 2) {
    const uint8_t* row = buf.base + off;
    for (int pi = 0; pi < blocks; ++pi) {
      const typename T::Raw r = T::load(row, pi);
      const uint8_t* b = row + static_cast<size_t>(pi) * T::kBytes;
      for (int i = 0; i < W; ++i) EXPECT_EQ(r.q[i], le32(b + 2 + 4 * i)) << "offset " << off << " block " << pi << " word " << i;
      EXPECT_EQ(r.d, le16(b));
    }
  }
}

TEST(CudaQuantDot, Q8_0AndQ4_0LoadsFollowTheBlockLayout) {
  check_d_q_loads<B8, 8>(11);
  check_d_q_loads<B4, 4>(12);
}

// Σ over a row's pieces of T::dot against NA = 1 row of 8-bit activations (int8 values, one FP32 scale per
// 32) equals Σ w·x with w from core's dequantize_row, to FP32 rounding: the decoders' bit layout and
// scale arithmetic, for every weight type, at a 2-byte-misaligned row start where the type allows one.
template <class T>
void check_dot(DType t, int64_t k, int off, bool act_q8_k) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " offset " + std::to_string(off));
  std::mt19937 rng(static_cast<uint32_t>(t) * 7 + static_cast<uint32_t>(off));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(k));
  for (auto& v : w) v = nd(rng);
  const size_t rb = row_bytes(t, k);
  Buf buf(rb + 16, 99);
  uint8_t* row = buf.base + off;
  quantize_row(t, w.data(), row, k);
  std::vector<float> wd(static_cast<size_t>(k));
  dequantize_row(t, row, wd.data(), k);
  std::vector<int8_t> xq(static_cast<size_t>(k));
  std::vector<float> xd(static_cast<size_t>(k / 32));
  std::vector<int32_t> xs(static_cast<size_t>(k / 32));
  std::uniform_int_distribution<int> qd(-127, 127);
  for (auto& q : xq) q = static_cast<int8_t>(qd(rng));
  // The scratch layout of act_quant.cuh: one scale per 32 (q8_0) or per 256 repeated 8 times (q8_K, the
  // K-quants' and IQ4_XS's rounding), Σq per 32.
  const int per = act_q8_k ? 8 : 1;
  for (size_t b = 0; b < xd.size(); ++b) xd[b] = b % per == 0 ? 0.01f + 0.02f * std::abs(nd(rng)) : xd[b - 1];
  for (size_t b = 0; b < xs.size(); ++b)
    for (int i = 0; i < 32; ++i) xs[b] += xq[32 * b + static_cast<size_t>(i)];
  // 16-byte aligned activations, as the scratch buffers are (ld_q8x16 loads 16 bytes).
  Buf xbuf(static_cast<size_t>(k), 5);
  std::memcpy(xbuf.base, xq.data(), xq.size());
  ActRows<1> x;
  x.q[0] = reinterpret_cast<const int8_t*>(xbuf.base);
  x.d[0] = xd.data();
  x.s[0] = xs.data();
  float acc[1] = {0.0f};
  const int n_pieces = pieces<T>(static_cast<int>(k / 32));
  float acc_a[1] = {0.0f}, acc_b[1] = {0.0f};  // dot_pair of this row and its reverse-order twin below
  for (int pi = 0; pi < n_pieces; ++pi) {
    T::template dot<1>(T::load(row, pi), pi, x, acc);
    dot_pair<T, 1>(T::load(row, pi), T::load(row, n_pieces - 1 - pi), pi, x, acc_a, acc_b);
  }
  // dot_pair gives each row dot()'s exact value (the two-row kernels' bit-identity with the one-row one).
  EXPECT_EQ(acc_a[0], acc[0]);
  float acc_r[1] = {0.0f};
  for (int pi = 0; pi < n_pieces; ++pi) T::template dot<1>(T::load(row, n_pieces - 1 - pi), pi, x, acc_r);
  EXPECT_EQ(acc_b[0], acc_r[0]);
  double ref = 0.0, mag = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    const double xi = static_cast<double>(xq[static_cast<size_t>(i)]) * xd[static_cast<size_t>(i / 32)];
    ref += static_cast<double>(wd[static_cast<size_t>(i)]) * xi;
    mag += std::abs(static_cast<double>(wd[static_cast<size_t>(i)]) * xi);
  }
  EXPECT_NEAR(acc[0], ref, 1e-5 * mag + 1e-6) << "sum of |w·x| " << mag;
}

TEST(CudaQuantDot, PieceDotsMatchDequantizedWeights) {
  for (int off : {0, 2, 6, 14}) {
    check_dot<K6>(DType::Q6_K, 1024, off, true);
    check_dot<B8>(DType::Q8_0, 1024, off, false);
    check_dot<B4>(DType::Q4_0, 1024, off, false);
  }
  check_dot<K4>(DType::Q4_K, 1024, 0, true);  // 16-byte aligned types
  check_dot<K5>(DType::Q5_K, 1024, 0, true);
  check_dot<XS4>(DType::IQ4_XS, 1024, 0, true);
}

}  // namespace
}  // namespace pg
