// The CUDA block decoders (backend/cuda/common.cuh), compiled for the host through a shim of the few
// intrinsics they use, against core's reference dequantize_row: every run and every chunk of every
// weight type must reproduce it bit for bit, and the chunks of a block must cover each element once.
// Needs no GPU (runs in CI): it pins down the bit-level layout work that the GPU tests then build on.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_quant.cuh"
#include "core/kv_quant.h"
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

// ---- KV-cache codecs (backend/cuda/kv_quant.cuh, QTQ3_0) ---------------------------------------------------

// Rows with the shapes that stress each encoder: Gaussian values, a few large outliers, an all-zero 32-block,
// a block of tiny values (subnormal fp16 scales), exact ties of the largest magnitude, and a constant block
// (d = 0 for the affine types).
std::vector<float> kv_test_row(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> f(n);
  for (auto& v : f) v = nd(rng);
  for (int i = 0; i < 6; ++i) f[rng() % n] *= 30.0f;
  for (size_t i = 0; i < n; ++i) {
    const size_t blk = i / 32;
    if (blk % 7 == 3) f[i] = 0.0f;
    if (blk % 7 == 5) f[i] *= 1e-6f;
    if (blk % 7 == 6) f[i] = 0.75f;
  }
  if (n >= 64) f[40] = 2.5f, f[41] = -2.5f;  // a tie of magnitudes: the first one's sign wins
  return f;
}

TEST(CudaKvCodecs, Tq3DecoderBitExact) {
  const int64_t n = 128 * 6;
  const auto f = kv_test_row(static_cast<size_t>(n), 5);
  std::vector<BlockTQ3_0> blocks(static_cast<size_t>(n / 32));
  tq3_quantize(f.data(), blocks.data(), n);
  std::vector<float> ref(static_cast<size_t>(n));
  tq3_dequantize(blocks.data(), ref.data(), n);
  const auto* bytes = reinterpret_cast<const uint8_t*>(blocks.data());
  size_t mismatches = 0;
  for (int64_t b = 0; b < n / 32; ++b)
    for (int r = 0; r < 2; ++r) {
      float w[16];
      cuda::QTQ3_0::run(bytes + 14 * b, r, w);
      for (int i = 0; i < 16; ++i) mismatches += std::memcmp(&w[i], &ref[static_cast<size_t>(32 * b + 16 * r + i)], 4) != 0;
    }
  EXPECT_EQ(mismatches, 0u);
  for (uint32_t k = 0; k < 8; ++k) EXPECT_EQ(cuda::tq3_centroid(k), kTq3Centroids[k]) << k;
}

TEST(CudaKvCodecs, SignWordsMatchCore) {
  for (int which = 0; which < 2; ++which)
    for (int i = 0; i < kTq3Group; ++i) EXPECT_EQ(cuda::tq3_sign_neg(which, i), tq3_signs(which)[i] < 0) << which << " " << i;
  EXPECT_EQ(cuda::kTq3InvSqrt128, static_cast<float>(1.0 / std::sqrt(128.0)));
}

// Every KV type and head size: the device encoders, unit by unit as the kv_store kernel calls them, write
// exactly the bytes of core's kv_quantize_row (padding of short heads included).
TEST(CudaKvCodecs, EncodersMatchKvQuantizeRow) {
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0};
  for (DType t : types)
    for (int hd : {8, 32, 64, 80, 128, 200, 256}) {
      SCOPED_TRACE(kv_type_name(t) + " head_dim " + std::to_string(hd));
      const int nh = 3;
      const size_t rb = kv_row_bytes(t, nh, hd), hb = kv_head_bytes(t, hd);
      const int w = kv_head_width(t, hd);
      for (uint32_t seed = 1; seed <= 8; ++seed) {
        const auto f = kv_test_row(static_cast<size_t>(nh * hd), seed * 31 + static_cast<uint32_t>(hd));
        std::vector<uint8_t> want(rb, 0xAA), got(rb + 16, 0x55);
        kv_quantize_row(t, f.data(), nh, hd, want.data());
        uint8_t* g = got.data() + (16 - reinterpret_cast<uintptr_t>(got.data()) % 16) % 16;
        const int ue = cuda::kvq_unit_elems(t);
        ASSERT_GT(ue, 0);
        ASSERT_EQ(w % ue, 0);
        ASSERT_EQ(static_cast<size_t>(cuda::kvq_unit_bytes(t)) * static_cast<size_t>(w / ue), hb);
        for (int h = 0; h < nh; ++h)
          for (int u = 0; u < w / ue; ++u) cuda::kvq_encode_unit(t, f.data() + h * hd, hd, u, g + h * hb);
        size_t diff = 0, first = rb;
        for (size_t i = 0; i < rb; ++i)
          if (g[i] != want[i]) ++diff, first = std::min(first, i);
        EXPECT_EQ(diff, 0u) << "seed " << seed << ", first differing byte " << first;
      }
    }
}

// The identities the CUDA attention relies on for a TQ3_0 cache, checked on core's reference functions:
// q·k = R(q)·k_rot (scores need the query rotated once, the keys never un-rotated), and
// R⁻¹(Σ wⱼ v_rot,ⱼ) = Σ wⱼ vⱼ (the output is un-rotated once, after the weighted sum), where k_rot / v_rot
// are the stored (rotated-domain) values and k / v their decoded originals (kv_decode_row).
TEST(CudaKvCodecs, Tq3RotationIdentities) {
  for (int hd : {64, 128, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(hd));
    const int w = kv_head_width(DType::TQ3_0, hd), n_keys = 40;
    const size_t hb = kv_head_bytes(DType::TQ3_0, hd);
    std::vector<uint8_t> cache(hb * n_keys);
    for (int j = 0; j < n_keys; ++j) {
      const auto x = kv_test_row(static_cast<size_t>(hd), 900u + static_cast<uint32_t>(j));
      kv_quantize_row(DType::TQ3_0, x.data(), 1, hd, cache.data() + hb * j);
    }
    const auto q = kv_test_row(static_cast<size_t>(hd), 77);
    std::vector<float> qr(static_cast<size_t>(w), 0.0f);
    std::copy(q.begin(), q.end(), qr.begin());
    tq3_rotate(qr.data(), w);
    std::vector<double> wsum_orig(static_cast<size_t>(hd), 0.0);
    std::vector<float> wsum_rot(static_cast<size_t>(w), 0.0f);
    for (int j = 0; j < n_keys; ++j) {
      std::vector<float> rot(static_cast<size_t>(w)), orig(static_cast<size_t>(hd));
      kv_dequantize_head(DType::TQ3_0, cache.data() + hb * j, hd, rot.data());
      kv_decode_row(DType::TQ3_0, cache.data() + hb * j, 1, hd, orig.data());
      double s_rot = 0, s_orig = 0, mag = 0;
      for (int d = 0; d < w; ++d) s_rot += static_cast<double>(qr[static_cast<size_t>(d)]) * rot[static_cast<size_t>(d)];
      for (int d = 0; d < hd; ++d) {
        s_orig += static_cast<double>(q[static_cast<size_t>(d)]) * orig[static_cast<size_t>(d)];
        mag += std::fabs(static_cast<double>(q[static_cast<size_t>(d)]) * orig[static_cast<size_t>(d)]);
      }
      // Both sides are float roundings of one exact value (R is orthogonal): a few ulps of Σ|q·k|.
      EXPECT_LE(std::fabs(s_rot - s_orig), 1e-5 * mag + 1e-6) << "key " << j;
      const float wj = 0.3f + 0.05f * static_cast<float>(j % 7);
      for (int d = 0; d < w; ++d) wsum_rot[static_cast<size_t>(d)] += wj * rot[static_cast<size_t>(d)];
      for (int d = 0; d < hd; ++d) wsum_orig[static_cast<size_t>(d)] += static_cast<double>(wj) * orig[static_cast<size_t>(d)];
    }
    tq3_rotate_inverse(wsum_rot.data(), w);
    double num = 0, den = 0;
    for (int d = 0; d < hd; ++d) {
      const double e = wsum_rot[static_cast<size_t>(d)] - wsum_orig[static_cast<size_t>(d)];
      num += e * e;
      den += wsum_orig[static_cast<size_t>(d)] * wsum_orig[static_cast<size_t>(d)];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-6);
    // The padding of a 64-wide head un-rotates to (numerically) zero: the output keeps only hd values.
    for (int d = hd; d < w; ++d) EXPECT_LE(std::fabs(wsum_rot[static_cast<size_t>(d)]), 1e-4) << d;
  }
}

// The shared-memory rotation the attention kernel applies to queries (TQ3_0 K) and outputs (TQ3_0 V), run
// serially (one thread, no-op barrier): bit-identical to core's tq3_rotate / tq3_rotate_inverse over
// several groups, which pins the butterfly index mapping that the parallel form distributes.
TEST(CudaKvCodecs, SharedMemoryRotationBitExact) {
  for (bool inverse : {false, true}) {
    const int n = 128 * 5;
    const auto x = kv_test_row(static_cast<size_t>(n), inverse ? 3 : 4);
    std::vector<float> want(x), got(x);
    if (inverse)
      tq3_rotate_inverse(want.data(), n);
    else
      tq3_rotate(want.data(), n);
    cuda::tq3_rotate_par(got.data(), n, inverse, 0, 1, [] {});
    EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * static_cast<size_t>(n)), 0) << "inverse " << inverse;
    // Three real threads with a barrier between phases, as the block / warp forms run (uneven split of
    // the 320 butterflies per stage): the same bits.
    std::vector<float> par(x);
    std::barrier<> bar(3);
    std::vector<std::thread> th;
    for (int tid = 0; tid < 3; ++tid)
      th.emplace_back([&, tid] { cuda::tq3_rotate_par(par.data(), n, inverse, tid, 3, [&] { bar.arrive_and_wait(); }); });
    for (auto& t : th) t.join();
    EXPECT_EQ(std::memcmp(par.data(), want.data(), sizeof(float) * static_cast<size_t>(n)), 0) << "3 threads, inverse " << inverse;
  }
}

// The attention kernel's tile decoder (kvq_load: 8 values per step for F32/F16/BF16, 16 for block types)
// over every step of a head reproduces core's kv_dequantize_head bit for bit (storage domain: rotated for
// TQ3_0), for every KV type and head size, padding included.
TEST(CudaKvCodecs, TileDecoderMatchesDequantizeHead) {
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0};
  for (DType t : types)
    for (int hd : {8, 64, 80, 128, 256}) {
      SCOPED_TRACE(kv_type_name(t) + " head_dim " + std::to_string(hd));
      const int nh = 3, w = kv_head_width(t, hd);
      const size_t hb = kv_head_bytes(t, hd);
      const auto f = kv_test_row(static_cast<size_t>(nh * hd), 17u + static_cast<uint32_t>(hd));
      std::vector<uint8_t> store(kv_row_bytes(t, nh, hd) + 16);
      uint8_t* row = store.data() + (16 - reinterpret_cast<uintptr_t>(store.data()) % 16) % 16;
      kv_quantize_row(t, f.data(), nh, hd, row);
      const int e = cuda::kvq_plain(t) ? 8 : 16;
      ASSERT_EQ(w % e, 0);
      size_t mismatches = 0;
      for (int h = 0; h < nh; ++h) {
        std::vector<float> want(static_cast<size_t>(w));
        kv_dequantize_head(t, row + h * hb, hd, want.data());
        for (int u = 0; u < w / e; ++u) {
          float got[16];
          std::fill(std::begin(got), std::end(got), std::nanf(""));  // a value the decoder does not write stays NaN
          cuda::kvq_load(t, row + h * hb, u, got);
          for (int i = 0; i < e; ++i) mismatches += std::memcmp(&got[i], &want[static_cast<size_t>(u * e + i)], 4) != 0;
        }
      }
      EXPECT_EQ(mismatches, 0u);
    }
}

}  // namespace
}  // namespace pg
