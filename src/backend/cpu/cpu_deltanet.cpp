// Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention) on the CPU: the causal depthwise conv with its
// rolling state, the gate nonlinearities, and the gated delta rule in two forms — token by token (the
// default for every segment: decode, verification rows and prefill), and a chunked parallel form (the
// WY/UT-transform form of the Gated DeltaNet paper, Yang et al. 2024, as used by flash-linear-attention),
// opt-in with CpuOptions::deltanet_chunk > 1.
//
// Why token by token for prefill too: the scheduler cuts a prompt into steps by the room other
// sequences' decode and verify rows leave, so the cut differs between plain and speculative runs. The
// token-by-token form does the same float operations per token whatever the cut; the chunked form's
// rounding depends on where its chunks start (at the segment start), and aligning chunks to absolute
// positions would not help: a cut inside a chunk still replaces that chunk's computation by two others.
// Measured (one thread, d_k = d_v = 128, 32 value heads, 512-token segment, CPU time; docs/benchmarks.md):
// token by token 72-77 µs/token, chunked C=64 (the former default) 96-106, C=16 70-85; decode 60-70 µs vs
// 105-116 µs for the former token-by-token loop. The delta rule is ~1% of a 27B model's prefill flops.
//
// The chunked form, for one value head. Row-vector convention: the state S is (d_k, d_v); a token writes
// k (d_k) and v (d_v), reads with q (d_k). One recurrent step is
//     γ_t = exp(g_t),   δ_t = β_t (v_t − γ_t Sᵀk_t),   S ← γ_t S + k_t δ_tᵀ,   o_t = Sᵀq_t.
// Take a chunk of c tokens starting from state S₀ and let G_i = g_1 + … + g_i (log of the cumulative
// decay Γ_i; only differences of G are exponentiated, so nothing overflows or divides by an underflowed
// product). By induction the state after token i is
//     S_i = e^{G_i} S₀ + Σ_{j≤i} e^{G_i−G_j} k_j δ_jᵀ,
// so the write vectors satisfy a unit lower-triangular system (the UT transform):
//     δ_i + Σ_{j<i} A_ij δ_j = β_i (v_i − e^{G_i} S₀ᵀk_i),   A_ij = β_i e^{G_i−G_j} (k_i·k_j),
// solved by forward substitution (T = (I + A)⁻¹ applied without forming T). Then
//     o_i = e^{G_i} S₀ᵀq_i + Σ_{j≤i} e^{G_i−G_j} (q_i·k_j) δ_j,
//     S_c = e^{G_c} S₀ + Σ_j e^{G_c−G_j} k_j δ_jᵀ.
// The state is read once and written once per chunk instead of twice per token; the rest is dense
// (c × c) and (c × d) work. Both forms compute the same function up to float rounding (tests check
// ≤ 1e-5 over 1000+ tokens), but the chunked form's rounding depends on where the chunks start.
#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/fp16.h"

namespace pg {
namespace {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

inline void axpy(int n, float a, const float* x, float* y) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

inline float dot(int n, const float* a, const float* b) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// C (M×N) = A (M×K) · B (K×N) (+ C when accumulate), row-major with leading dimensions. A 4×16 register
// tile (8 accumulators of 8 floats) lets each pair of B loads feed eight FMAs; the chunked delta rule
// spends its time here.
void gemm(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc, bool accumulate) {
  int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 4 <= M; i += 4) {
    int j = 0;
    for (; j + 16 <= N; j += 16) {
      __m256 acc[4][2];
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) acc[r][h] = accumulate ? _mm256_loadu_ps(C + (i + r) * ldc + j + 8 * h) : _mm256_setzero_ps();
      for (int k = 0; k < K; ++k) {
        const __m256 b0 = _mm256_loadu_ps(B + k * ldb + j), b1 = _mm256_loadu_ps(B + k * ldb + j + 8);
        for (int r = 0; r < 4; ++r) {
          const __m256 a = _mm256_broadcast_ss(A + (i + r) * lda + k);
          acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
      }
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(C + (i + r) * ldc + j + 8 * h, acc[r][h]);
    }
    for (; j < N; ++j)
      for (int r = 0; r < 4; ++r) {
        float s = accumulate ? C[(i + r) * ldc + j] : 0.0f;
        for (int k = 0; k < K; ++k) s += A[(i + r) * lda + k] * B[k * ldb + j];
        C[(i + r) * ldc + j] = s;
      }
  }
#endif
  for (; i < M; ++i) {
    float* c = C + i * ldc;
    if (!accumulate) std::fill(c, c + N, 0.0f);
    for (int k = 0; k < K; ++k) axpy(N, A[i * lda + k], B + k * ldb, c);
  }
}

// The token-by-token delta rule for value columns [j0, j0 + w) of one head over the rows of a segment.
// Value columns are independent (kv_j = Σ_a k_a S_aj, δ_j, S[:, j] and o_j involve column j only), so a
// block's state S[:, j0 : j0+w] (d_k × 16 floats, 8 KiB at d_k = 128) stays in L1 for the whole
// segment. Every token does the same float operations in the same order whatever the segment's length
// and whatever came before it in the step, so a prompt prefilled in any split (steps of the scheduler,
// a decode of its last token) gives the outputs and the state of one long segment bit for bit: greedy
// speculative decoding relies on it (the scheduler splits prompts by the room verify rows leave).
struct DeltaBlockArgs {
  const float *q, *k, *v, *g, *beta;  // q, k (n, hk·d_k); v, out (n, hv·d_v); g, beta (n, hv)
  float* out;
  int64_t qw, vw;
  int hv, d_k, d_v;
  float scale;
};

constexpr int kDeltaCols = 16;      // value columns per block: one 64-byte line of each state row
constexpr int kDeltaCopyRows = 8;  // segments this long or longer work on a contiguous copy of the block

// rows × w floats from src (row stride lds) to dst (row stride ldd).
void copy_block(const float* src, int64_t lds, float* dst, int64_t ldd, int rows, int w) {
  for (int a = 0; a < rows; ++a) {
    const float* s = src + a * lds;
    float* d = dst + a * ldd;
    int j = 0;
#if defined(__AVX2__)
    for (; j + 8 <= w; j += 8) _mm256_storeu_ps(d + j, _mm256_loadu_ps(s + j));
#endif
    for (; j < w; ++j) d[j] = s[j];
  }
}

// S: the block's state, row a at S + a·ld (w columns). cap_base: state tensor base; a captured row r
// stores the block into slot cap (row stride d_v, the slot's layout) at column j0 of head h.
void delta_block(const DeltaBlockArgs& p, int64_t h, int64_t kh, int j0, int w, float* S, int64_t ld, const int32_t* rows,
                 int n_rows, const int32_t* capture, float* cap_base, int64_t hs) {
  const int d_k = p.d_k;
  for (int t = 0; t < n_rows; ++t) {
    const int32_t r = rows[t];
    const float* kr = p.k + r * p.qw + kh * d_k;
    const float* qr = p.q + r * p.qw + kh * d_k;
    const float* vr = p.v + r * p.vw + h * p.d_v + j0;
    float* orow = p.out + r * p.vw + h * p.d_v + j0;
    const float gamma = std::exp(p.g[r * p.hv + h]), b = p.beta[r * p.hv + h];
#if defined(__AVX2__) && defined(__FMA__)
    if (w == kDeltaCols) {
      // kv = Sᵀk with four partial sums over a (FMA latency), added in a fixed order.
      __m256 k0[4], k1[4];
      for (int u = 0; u < 4; ++u) k0[u] = k1[u] = _mm256_setzero_ps();
      int a = 0;
      for (; a + 4 <= d_k; a += 4)
        for (int u = 0; u < 4; ++u) {
          const float* row = S + (a + u) * ld;
          const __m256 ka = _mm256_broadcast_ss(kr + a + u);
          k0[u] = _mm256_fmadd_ps(ka, _mm256_loadu_ps(row), k0[u]);
          k1[u] = _mm256_fmadd_ps(ka, _mm256_loadu_ps(row + 8), k1[u]);
        }
      for (; a < d_k; ++a) {
        const __m256 ka = _mm256_broadcast_ss(kr + a);
        k0[0] = _mm256_fmadd_ps(ka, _mm256_loadu_ps(S + a * ld), k0[0]);
        k1[0] = _mm256_fmadd_ps(ka, _mm256_loadu_ps(S + a * ld + 8), k1[0]);
      }
      const __m256 vg = _mm256_set1_ps(gamma), vb = _mm256_set1_ps(b);
      const __m256 kv0 = _mm256_add_ps(_mm256_add_ps(k0[0], k0[1]), _mm256_add_ps(k0[2], k0[3]));
      const __m256 kv1 = _mm256_add_ps(_mm256_add_ps(k1[0], k1[1]), _mm256_add_ps(k1[2], k1[3]));
      // δ = β(v − γ·kv)
      const __m256 d0 = _mm256_mul_ps(vb, _mm256_fnmadd_ps(vg, kv0, _mm256_loadu_ps(vr)));
      const __m256 d1 = _mm256_mul_ps(vb, _mm256_fnmadd_ps(vg, kv1, _mm256_loadu_ps(vr + 8)));
      // S ← γS + kδᵀ and o = Sᵀq in the same pass.
      __m256 o0[4], o1[4];
      for (int u = 0; u < 4; ++u) o0[u] = o1[u] = _mm256_setzero_ps();
      a = 0;
      for (; a + 4 <= d_k; a += 4)
        for (int u = 0; u < 4; ++u) {
          float* row = S + (a + u) * ld;
          const __m256 ka = _mm256_broadcast_ss(kr + a + u), qa = _mm256_broadcast_ss(qr + a + u);
          const __m256 s0 = _mm256_fmadd_ps(ka, d0, _mm256_mul_ps(vg, _mm256_loadu_ps(row)));
          const __m256 s1 = _mm256_fmadd_ps(ka, d1, _mm256_mul_ps(vg, _mm256_loadu_ps(row + 8)));
          _mm256_storeu_ps(row, s0);
          _mm256_storeu_ps(row + 8, s1);
          o0[u] = _mm256_fmadd_ps(qa, s0, o0[u]);
          o1[u] = _mm256_fmadd_ps(qa, s1, o1[u]);
        }
      for (; a < d_k; ++a) {
        float* row = S + a * ld;
        const __m256 ka = _mm256_broadcast_ss(kr + a), qa = _mm256_broadcast_ss(qr + a);
        const __m256 s0 = _mm256_fmadd_ps(ka, d0, _mm256_mul_ps(vg, _mm256_loadu_ps(row)));
        const __m256 s1 = _mm256_fmadd_ps(ka, d1, _mm256_mul_ps(vg, _mm256_loadu_ps(row + 8)));
        _mm256_storeu_ps(row, s0);
        _mm256_storeu_ps(row + 8, s1);
        o0[0] = _mm256_fmadd_ps(qa, s0, o0[0]);
        o1[0] = _mm256_fmadd_ps(qa, s1, o1[0]);
      }
      const __m256 sc = _mm256_set1_ps(p.scale);
      _mm256_storeu_ps(orow, _mm256_mul_ps(sc, _mm256_add_ps(_mm256_add_ps(o0[0], o0[1]), _mm256_add_ps(o0[2], o0[3]))));
      _mm256_storeu_ps(orow + 8, _mm256_mul_ps(sc, _mm256_add_ps(_mm256_add_ps(o1[0], o1[1]), _mm256_add_ps(o1[2], o1[3]))));
    } else
#endif
    {
      // Narrow blocks (d_v not a multiple of 16) and builds without AVX2: the same recurrence per column.
      float kv[kDeltaCols], acc[kDeltaCols];
      for (int j = 0; j < w; ++j) kv[j] = acc[j] = 0.0f;
      for (int a = 0; a < d_k; ++a)
        for (int j = 0; j < w; ++j) kv[j] += kr[a] * S[a * ld + j];
      for (int j = 0; j < w; ++j) kv[j] = b * (vr[j] - gamma * kv[j]);
      for (int a = 0; a < d_k; ++a) {
        float* row = S + a * ld;
        for (int j = 0; j < w; ++j) {
          row[j] = gamma * row[j] + kr[a] * kv[j];
          acc[j] += qr[a] * row[j];
        }
      }
      for (int j = 0; j < w; ++j) orow[j] = p.scale * acc[j];
    }
    const int32_t cap = capture[r];
    if (cap >= 0) {
      copy_block(S, ld, cap_base + cap * p.hv * hs + h * hs + j0, p.d_v, d_k, w);
    }
  }
}

struct Segment {
  int start, len, src, dst;
};

Segment segment(const RecurrentBatch& rb, int s) {
  const int32_t* p = rb.h_seg.data() + 4 * static_cast<size_t>(s);
  return {p[0], p[1], p[2], p[3]};
}

void check_batch(const RecurrentBatch& rb, int64_t n_rows, int64_t n_slots, const char* op) {
  const std::string o(op);
  PG_CHECK(rb.n_tokens == n_rows,
           o + ": recurrent batch has " + std::to_string(rb.n_tokens) + " rows, tensors have " + std::to_string(n_rows));
  PG_CHECK(rb.h_rows.size() <= static_cast<size_t>(rb.n_tokens) && rb.h_capture.size() == static_cast<size_t>(rb.n_tokens) &&
               rb.h_seg.size() == 4 * static_cast<size_t>(rb.n_segments),
           o + ": malformed recurrent batch");
  const int listed = static_cast<int>(rb.h_rows.size());
  int covered = 0;
  for (int s = 0; s < rb.n_segments; ++s) {
    const Segment g = segment(rb, s);
    PG_CHECK(g.start >= 0 && g.len > 0 && g.start + g.len <= listed, o + ": segment out of range");
    PG_CHECK(g.src >= 0 && g.src < n_slots && g.dst >= -1 && g.dst < n_slots, o + ": state slot out of range");
    covered += g.len;
  }
  PG_CHECK(covered <= listed, o + ": segments overlap");
  for (int i = 0; i < listed; ++i)
    PG_CHECK(rb.h_rows[static_cast<size_t>(i)] >= 0 && rb.h_rows[static_cast<size_t>(i)] < n_rows,
             o + ": row index out of range");
  for (int i = 0; i < rb.n_tokens; ++i)
    PG_CHECK(rb.h_capture[static_cast<size_t>(i)] >= -1 && rb.h_capture[static_cast<size_t>(i)] < n_slots,
             o + ": capture slot out of range");
}

}  // namespace

void CpuBackend::mul_rows_sigmoid(Tensor& x, const Tensor& gate) {
  PG_CHECK(gate.rows() == x.rows() && gate.cols() == 1, "mul_rows_sigmoid: gate must be (rows, 1)");
  const int64_t d = x.cols();
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float s = 1.0f / (1.0f + std::exp(-gate.as<float>()[r]));
    float* row = x.as<float>() + r * d;
    for (int64_t i = 0; i < d; ++i) row[i] *= s;
  }
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  PG_CHECK(src.nbytes() == dst.nbytes(), "copy: size mismatch");
  if (src.data != dst.data) std::memmove(dst.data, src.data, src.nbytes());
}

void CpuBackend::deltanet_gates(Tensor& alpha, Tensor& beta, const Tensor& dt_bias, const Tensor& a) {
  const int64_t h = alpha.cols();
  PG_CHECK(beta.cols() == h && beta.rows() == alpha.rows() && dt_bias.n_elements() == h && a.n_elements() == h,
           "deltanet_gates: shape mismatch");
  float* al = alpha.as<float>();
  float* be = beta.as<float>();
  for (int64_t r = 0; r < alpha.rows(); ++r) {
    for (int64_t i = 0; i < h; ++i) {
      const float x = al[r * h + i] + dt_bias.as<float>()[i];
      const float sp = x > 20.0f ? x : std::log(1.0f + std::exp(x));
      al[r * h + i] = sp * a.as<float>()[i];
      be[r * h + i] = 1.0f / (1.0f + std::exp(-be[r * h + i]));
    }
  }
}

void CpuBackend::ssm_conv(const Tensor& x, const Tensor& w, Tensor& conv_state, const RecurrentBatch& rb, bool silu_out,
                          Tensor& out) {
  const int64_t C = x.cols();
  const int K = static_cast<int>(w.ne[0]);
  PG_CHECK(K >= 1 && w.ne[1] == C, "ssm_conv: weight shape does not match the input width");
  PG_CHECK(w.type == DType::F32 || w.type == DType::F16, "ssm_conv: weight must be F32 or F16");
  PG_CHECK(conv_state.type == DType::F32 && conv_state.cols() == static_cast<int64_t>(K - 1) * C,
           "ssm_conv: conv state shape mismatch");
  PG_CHECK(out.cols() == C && out.rows() == x.rows(), "ssm_conv: output shape mismatch");
  const int64_t n_slots = conv_state.rows();
  check_batch(rb, x.rows(), n_slots, "ssm_conv");
  const int H = K - 1;  // history length
  const float* xp = x.as<float>();
  float* op = out.as<float>();
  float* st = conv_state.as<float>();
  const int64_t slot_w = static_cast<int64_t>(H) * C;
  constexpr int64_t kBlock = 256;  // channels per task: history and weights of a block stay in L1
  const int64_t n_blocks = (C + kBlock - 1) / kBlock;

  for (int s = 0; s < rb.n_segments; ++s) {
    const Segment g = segment(rb, s);
    pool_.parallel_for(n_blocks, 1, [&](int64_t b0, int64_t b1, int tid) {
      auto& buf = scratch(static_cast<size_t>((H + K) * kBlock) * sizeof(float), tid);
      float* hist = reinterpret_cast<float*>(buf.data());  // (H, kBlock) oldest first
      float* wt = hist + H * kBlock;                       // (K, kBlock) transposed weights
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t c0 = blk * kBlock, bw = std::min(kBlock, C - c0);
        for (int j = 0; j < H; ++j)
          std::memcpy(hist + j * kBlock, st + g.src * slot_w + j * C + c0, static_cast<size_t>(bw) * sizeof(float));
        for (int64_t c = 0; c < bw; ++c)
          for (int j = 0; j < K; ++j) {
            const size_t wi = static_cast<size_t>((c0 + c) * K + j);
            wt[j * kBlock + c] = w.type == DType::F16 ? fp16_to_f32(w.as<uint16_t>()[wi]) : w.as<float>()[wi];
          }
        for (int i = 0; i < g.len; ++i) {
          const int32_t r = rb.h_rows[static_cast<size_t>(g.start + i)];
          const float* xr = xp + r * C + c0;
          float* orow = op + r * C + c0;
          for (int64_t c = 0; c < bw; ++c) {
            // Oldest input first, the order ggml sums in.
            float sum = 0.0f;
            for (int j = 0; j < H; ++j) sum += hist[j * kBlock + c] * wt[j * kBlock + c];
            sum += xr[c] * wt[H * kBlock + c];
            orow[c] = silu_out ? silu(sum) : sum;
          }
          if (H > 0) {
            std::memmove(hist, hist + kBlock, static_cast<size_t>((H - 1) * kBlock) * sizeof(float));
            std::memcpy(hist + (H - 1) * kBlock, xr, static_cast<size_t>(bw) * sizeof(float));
          }
          const int32_t cap = rb.h_capture[static_cast<size_t>(r)];
          if (cap >= 0)
            for (int j = 0; j < H; ++j)
              std::memcpy(st + cap * slot_w + j * C + c0, hist + j * kBlock, static_cast<size_t>(bw) * sizeof(float));
        }
        if (g.dst >= 0)
          for (int j = 0; j < H; ++j)
            std::memcpy(st + g.dst * slot_w + j * C + c0, hist + j * kBlock, static_cast<size_t>(bw) * sizeof(float));
      }
    });
  }
}

void CpuBackend::gated_delta_net(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                                 Tensor& state, const RecurrentBatch& rb, int d_k, int d_v, float scale, Tensor& out) {
  PG_CHECK(d_k > 0 && d_v > 0 && q.cols() % d_k == 0 && v.cols() % d_v == 0, "gated_delta_net: head size mismatch");
  const int hk = static_cast<int>(q.cols() / d_k), hv = static_cast<int>(v.cols() / d_v);
  PG_CHECK(k.cols() == q.cols() && hv % hk == 0, "gated_delta_net: value heads must be a multiple of key heads");
  const int64_t n = q.rows();
  PG_CHECK(k.rows() == n && v.rows() == n && out.rows() == n && out.cols() == v.cols(), "gated_delta_net: row count mismatch");
  PG_CHECK(g.cols() == hv && beta.cols() == hv && g.rows() == n && beta.rows() == n, "gated_delta_net: gate shape mismatch");
  const int64_t hs = static_cast<int64_t>(d_k) * d_v;  // floats per head state
  PG_CHECK(state.type == DType::F32 && state.cols() == hv * hs, "gated_delta_net: state shape mismatch");
  check_batch(rb, n, state.rows(), "gated_delta_net");

  const float *qp = q.as<float>(), *kp = k.as<float>(), *vp = v.as<float>(), *gp = g.as<float>(), *bp = beta.as<float>();
  float* op = out.as<float>();
  float* sp = state.as<float>();
  const int64_t qw = q.cols(), vw = v.cols();
  const int chunk = std::max(1, opt_.deltanet_chunk);

  for (int si = 0; si < rb.n_segments; ++si) {
    const Segment sg = segment(rb, si);
    bool any_capture = false;
    for (int i = 0; i < sg.len; ++i)
      any_capture |= rb.h_capture[static_cast<size_t>(rb.h_rows[static_cast<size_t>(sg.start + i)])] >= 0;
    const bool chunked = chunk > 1 && sg.len > 1 && !any_capture;
    const int C = chunked ? std::min(chunk, sg.len) : 1;

    if (!chunked) {
      // Token by token: one task per (head, block of value columns).
      const int nb = (d_v + kDeltaCols - 1) / kDeltaCols;
      const DeltaBlockArgs da{qp, kp, vp, gp, bp, op, qw, vw, hv, d_k, d_v, scale};
      const int32_t* seg_rows = rb.h_rows.data() + sg.start;
      pool_.parallel_for(static_cast<int64_t>(hv) * nb, 1, [&](int64_t t0, int64_t t1, int tid) {
        auto& buf = scratch(static_cast<size_t>(d_k) * kDeltaCols * sizeof(float), tid);
        float* work = reinterpret_cast<float*>(buf.data());  // (d_k, kDeltaCols) the block's state
        for (int64_t task = t0; task < t1; ++task) {
          const int64_t h = task / nb, kh = h % hk;
          const int j0 = static_cast<int>(task % nb) * kDeltaCols, w = std::min(kDeltaCols, d_v - j0);
          const float* s_src = sp + sg.src * hv * hs + h * hs + j0;
          float* s_dst = sg.dst >= 0 ? sp + sg.dst * hv * hs + h * hs + j0 : nullptr;
          if (s_dst && sg.len < kDeltaCopyRows) {
            // Decode and short verify chains: in place in the slot (the state is read from memory
            // once either way).
            if (s_dst != s_src) copy_block(s_src, d_v, s_dst, d_v, d_k, w);
            delta_block(da, h, kh, j0, w, s_dst, d_v, seg_rows, sg.len, rb.h_capture.data(), sp, hs);
          } else {
            // Longer segments work on a contiguous copy: rows of the slot's layout are d_v floats apart,
            // which maps a block's d_k lines onto a few L1 sets.
            copy_block(s_src, d_v, work, kDeltaCols, d_k, w);
            delta_block(da, h, kh, j0, w, work, kDeltaCols, seg_rows, sg.len, rb.h_capture.data(), sp, hs);
            if (s_dst) copy_block(work, kDeltaCols, s_dst, d_v, d_k, w);
          }
        }
      });
      continue;
    }
    pool_.parallel_for(hv, 1, [&](int64_t h0, int64_t h1, int tid) {
      // Scratch: working state when there is no dst slot, and the per-chunk buffers.
      const size_t floats = static_cast<size_t>(hs) + static_cast<size_t>(C) * (3 * d_k + 3 * d_v + 2 * C + 2);
      auto& buf = scratch(floats * sizeof(float), tid);
      float* work = reinterpret_cast<float*>(buf.data());  // (d_k, d_v)
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t kh = h % hk;  // tiled key-head mapping
        const float* s_src = sp + sg.src * hv * hs + h * hs;
        float* S;
        if (sg.dst >= 0) {
          S = sp + sg.dst * hv * hs + h * hs;
          if (S != s_src) std::memcpy(S, s_src, static_cast<size_t>(hs) * sizeof(float));
        } else {
          S = work;
          std::memcpy(S, s_src, static_cast<size_t>(hs) * sizeof(float));
        }

        {
          float* Kc = work + hs;                          // (C, d_k) keys, rows of the chunk
          float* Qc = Kc + static_cast<size_t>(C) * d_k;  // (C, d_k) queries
          float* KT = Qc + static_cast<size_t>(C) * d_k;  // (d_k, C) keys transposed (then decay-scaled)
          float* U = KT + static_cast<size_t>(C) * d_k;   // (C, d_v) right-hand side, then δ
          float* KS = U + static_cast<size_t>(C) * d_v;   // (C, d_v) S₀ᵀk_i
          float* QS = KS + static_cast<size_t>(C) * d_v;  // (C, d_v) S₀ᵀq_i, then the outputs
          float* A = QS + static_cast<size_t>(C) * d_v;   // (C, C) k_i·k_j, then β_i e^{G_i−G_j} k_i·k_j (j < i)
          float* P = A + static_cast<size_t>(C) * C;      // (C, C) q_i·k_j, then e^{G_i−G_j} q_i·k_j (j ≤ i), 0 above
          float* G = P + static_cast<size_t>(C) * C;      // (C) cumulative log-decay
          float* B = G + C;                               // (C) β
          for (int c0 = 0; c0 < sg.len; c0 += C) {
            const int c = std::min(C, sg.len - c0);
            float cum = 0.0f;
            for (int i = 0; i < c; ++i) {
              const int32_t r = rb.h_rows[static_cast<size_t>(sg.start + c0 + i)];
              const float* kr = kp + r * qw + kh * d_k;
              std::memcpy(Kc + i * d_k, kr, static_cast<size_t>(d_k) * sizeof(float));
              std::memcpy(Qc + i * d_k, qp + r * qw + kh * d_k, static_cast<size_t>(d_k) * sizeof(float));
              std::memcpy(U + i * d_v, vp + r * vw + h * d_v, static_cast<size_t>(d_v) * sizeof(float));
              for (int a = 0; a < d_k; ++a) KT[a * C + i] = kr[a];
              cum += gp[r * hv + h];
              G[i] = cum;
              B[i] = bp[r * hv + h];
            }
            // S₀ᵀk_i and S₀ᵀq_i for the whole chunk, and the Gram matrices k_i·k_j and q_i·k_j.
            gemm(c, d_v, d_k, Kc, d_k, S, d_v, KS, d_v, false);
            gemm(c, d_v, d_k, Qc, d_k, S, d_v, QS, d_v, false);
            gemm(c, c, d_k, Kc, d_k, KT, C, A, C, false);
            gemm(c, c, d_k, Qc, d_k, KT, C, P, C, false);
            // Right-hand side β_i(v_i − e^{G_i} S₀ᵀk_i); decay masks on A (strictly lower) and P (lower).
            for (int i = 0; i < c; ++i) {
              const float eg = std::exp(G[i]);
              float* u = U + i * d_v;
              const float* ks = KS + i * d_v;
              for (int j = 0; j < d_v; ++j) u[j] = B[i] * (u[j] - eg * ks[j]);
              for (int j = 0; j <= i; ++j) {
                const float dec = std::exp(G[i] - G[j]);
                A[i * C + j] *= B[i] * dec;
                P[i * C + j] *= dec;
              }
              for (int j = i + 1; j < c; ++j) P[i * C + j] = 0.0f;
            }
            // Forward substitution: δ_i = rhs_i − Σ_{j<i} A_ij δ_j.
            for (int i = 1; i < c; ++i)
              for (int j = 0; j < i; ++j) axpy(d_v, -A[i * C + j], U + j * d_v, U + i * d_v);
            // Outputs o_i = e^{G_i} S₀ᵀq_i + Σ_{j≤i} P_ij δ_j.
            for (int i = 0; i < c; ++i) {
              const float eg = std::exp(G[i]);
              for (int j = 0; j < d_v; ++j) QS[i * d_v + j] *= eg;
            }
            gemm(c, d_v, c, P, C, U, d_v, QS, d_v, true);
            for (int i = 0; i < c; ++i) {
              const int32_t r = rb.h_rows[static_cast<size_t>(sg.start + c0 + i)];
              float* orow = op + r * vw + h * d_v;
              for (int j = 0; j < d_v; ++j) orow[j] = scale * QS[i * d_v + j];
            }
            // State at the end of the chunk: S = e^{G_c} S₀ + Σ_i (e^{G_c−G_i} k_i) δ_iᵀ.
            const float egc = std::exp(G[c - 1]);
            for (int i = 0; i < c; ++i) {
              const float dec = std::exp(G[c - 1] - G[i]);
              for (int a = 0; a < d_k; ++a) KT[a * C + i] *= dec;
            }
            for (int64_t e = 0; e < hs; ++e) S[e] *= egc;
            gemm(d_k, d_v, c, KT, C, U, d_v, S, d_v, true);
          }
        }
      }
    });
  }
}

}  // namespace pg
