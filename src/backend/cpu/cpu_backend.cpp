#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"

namespace pg {
namespace {

constexpr size_t kAlign = 64;

void* aligned_zalloc(size_t bytes) {
  const size_t n = std::max<size_t>((bytes + kAlign - 1) / kAlign * kAlign, kAlign);
  void* p = std::aligned_alloc(kAlign, n);
  if (!p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, n);
  return p;
}

inline float load_f(const Tensor& t, size_t i) {
  return t.type == DType::F16 ? fp16_to_f32(t.as<uint16_t>()[i]) : t.as<float>()[i];
}

void check_f32(const Tensor& t, const char* op) { PG_CHECK(t.type == DType::F32, std::string(op) + ": expected an F32 tensor"); }

}  // namespace

CpuBackend::CpuBackend(const CpuOptions& opt) : opt_(opt), pool_(opt.n_threads) {
  scratch_.resize(static_cast<size_t>(pool_.size()) + 4);
}

CpuBackend::~CpuBackend() = default;

std::vector<uint8_t>& CpuBackend::scratch(size_t bytes, int slot) {
  auto& s = scratch_[static_cast<size_t>(slot)];
  if (s.size() < bytes) s.resize(bytes);
  return s;
}

Tensor CpuBackend::alloc(DType t, int64_t cols, int64_t rows, int64_t ne2) {
  Tensor x;
  x.type = t;
  x.ne[0] = cols;
  x.ne[1] = rows;
  x.ne[2] = ne2;
  x.backend = this;
  x.data = aligned_zalloc(x.nbytes());
  return x;
}

void CpuBackend::free(Tensor& t) {
  std::free(t.data);
  t.data = nullptr;
}

Tensor CpuBackend::load_weight(DType t, const int64_t ne[4], const void* host_data) {
  // Weights stay in the memory map: no copy, and pages load on first use.
  Tensor x;
  x.type = t;
  for (int i = 0; i < 4; ++i) x.ne[i] = ne[i];
  x.data = const_cast<void*>(host_data);
  x.backend = this;
  return x;
}

void CpuBackend::upload(Tensor& dst, const void* src, size_t bytes, size_t off) {
  std::memcpy(static_cast<uint8_t*>(dst.data) + off, src, bytes);
}
void CpuBackend::download(const Tensor& src, void* dst, size_t bytes, size_t off) {
  std::memcpy(dst, static_cast<const uint8_t*>(src.data) + off, bytes);
}

void CpuBackend::get_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
  check_f32(out, "get_rows");
  const int64_t n = ids.n_elements(), d = table.ne[0];
  const int64_t n_rows = table.rows();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids.as<int32_t>()[i];
    PG_CHECK(id >= 0 && id < n_rows, "token id " + std::to_string(id) + " out of range (vocabulary " + std::to_string(n_rows) + ")");
    dequantize_row(table.type, static_cast<const uint8_t*>(table.data) + static_cast<size_t>(id) * table.row_bytes(),
                   out.as<float>() + i * d, d);
  }
}

void CpuBackend::matmul_rows(const Tensor& w, const float* x, int64_t n, int64_t x_stride, float* y, int64_t y_stride) {
  const int64_t in = w.ne[0], out = w.ne[1];
  const size_t w_row = w.row_bytes();
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1));

  if (opt_.exact_f32 || w.type == DType::F32) {
    // F32 path: dequantize each weight row once and dot it with every activation row.
    pool_.parallel_for(out, grain, [&](int64_t o0, int64_t o1, int tid) {
      auto& buf = scratch(static_cast<size_t>(in) * sizeof(float), tid);
      float* wf = reinterpret_cast<float*>(buf.data());
      for (int64_t o = o0; o < o1; ++o) {
        const float* wr;
        if (w.type == DType::F32) {
          wr = reinterpret_cast<const float*>(wp + static_cast<size_t>(o) * w_row);
        } else {
          dequantize_row(w.type, wp + static_cast<size_t>(o) * w_row, wf, in);
          wr = wf;
        }
        for (int64_t t = 0; t < n; ++t) y[t * y_stride + o] = vec_dot(DType::F32, in, wr, x + t * x_stride);
      }
    });
    return;
  }

  // Native path: convert activations to vec_dot_type once, then integer / half dot products.
  const DType vt = vec_dot_type(w.type);
  const size_t xq_row = row_bytes(vt, in);
  auto& xq = scratch(xq_row * static_cast<size_t>(n), pool_.size());
  pool_.parallel_for(n, 1, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) quantize_row(vt, x + t * x_stride, xq.data() + static_cast<size_t>(t) * xq_row, in);
  });
  // Tiles of weight rows × activation rows keep a weight tile in cache while it meets every activation.
  constexpr int64_t kTileT = 16;
  pool_.parallel_for(out, grain, [&](int64_t o0, int64_t o1, int) {
    for (int64_t t0 = 0; t0 < n; t0 += kTileT) {
      const int64_t t1 = std::min(n, t0 + kTileT);
      for (int64_t o = o0; o < o1; ++o) {
        const uint8_t* wr = wp + static_cast<size_t>(o) * w_row;
        for (int64_t t = t0; t < t1; ++t) y[t * y_stride + o] = vec_dot(w.type, in, wr, xq.data() + static_cast<size_t>(t) * xq_row);
      }
    }
  });
}

void CpuBackend::matmul(const Tensor& w, const Tensor& x, Tensor& y) {
  check_f32(x, "matmul");
  check_f32(y, "matmul");
  PG_CHECK(x.cols() == w.ne[0], "matmul: input width " + std::to_string(x.cols()) + " != weight rows " + std::to_string(w.ne[0]));
  PG_CHECK(y.cols() == w.ne[1] && y.rows() == x.rows(), "matmul: output shape mismatch");
  matmul_rows(w, x.as<float>(), x.rows(), x.cols(), y.as<float>(), y.cols());
}

void CpuBackend::add_bias(Tensor& y, const Tensor& bias) {
  const int64_t d = y.cols();
  float* p = y.as<float>();
  for (int64_t r = 0; r < y.rows(); ++r)
    for (int64_t i = 0; i < d; ++i) p[r * d + i] += load_f(bias, static_cast<size_t>(i));
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, Tensor& y, float eps) {
  const int64_t d = x.cols(), n = x.rows();
  const float* xp = x.as<float>();
  float* yp = y.as<float>();
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * d;
    float* yr = yp + r * d;
    double sum = 0;  // ggml accumulates norms in double
    for (int64_t i = 0; i < d; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(d));
    const float s = 1.0f / std::sqrt(mean + eps);
    if (w.valid()) {
      for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * s) * load_f(w, static_cast<size_t>(i));
    } else {
      for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * s;
    }
  }
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& y) {
  const int64_t n = a.n_elements();
  const float *ap = a.as<float>(), *bp = b.as<float>();
  float* yp = y.as<float>();
  for (int64_t i = 0; i < n; ++i) yp[i] = ap[i] + bp[i];
}

void CpuBackend::scale(Tensor& x, float s) {
  float* p = x.as<float>();
  for (int64_t i = 0; i < x.n_elements(); ++i) p[i] *= s;
}

float CpuBackend::gelu_ggml(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const float h = round_fp16(x);
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoef = 0.044715f;
  const float g = 0.5f * h * (1.0f + std::tanh(kSqrt2OverPi * h * (1.0f + kCoef * h * h)));
  return round_fp16(g);
}

void CpuBackend::glu(const Tensor& gate, const Tensor& up, Tensor& y, Activation act) {
  const int64_t n = gate.n_elements();
  const float *g = gate.as<float>(), *u = up.as<float>();
  float* yp = y.as<float>();
  pool_.parallel_for(n, 16384, [&](int64_t i0, int64_t i1, int) {
    if (act == Activation::Silu) {
      for (int64_t i = i0; i < i1; ++i) yp[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    } else {
      for (int64_t i = i0; i < i1; ++i) yp[i] = gelu_ggml(g[i]) * u[i];
    }
  });
}

void CpuBackend::rope(Tensor& x, const Tensor& pos, int n_heads, int head_dim, int n_rot, float base, RopeStyle style) {
  const int64_t n = x.rows();
  float* xp = x.as<float>();
  const int32_t* pp = pos.as<int32_t>();
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));
  std::vector<float> cs(static_cast<size_t>(n_rot));  // cos, sin pairs for one position
  for (int64_t r = 0; r < n; ++r) {
    float theta = static_cast<float>(pp[r]);
    for (int i = 0; i < n_rot / 2; ++i) {
      cs[2 * i] = std::cos(theta);
      cs[2 * i + 1] = std::sin(theta);
      theta *= theta_scale;  // the same running product ggml uses, for bit-closeness
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = xp + r * x.cols() + static_cast<int64_t>(h) * head_dim;
      for (int i = 0; i < n_rot / 2; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const int i0 = style == RopeStyle::Norm ? 2 * i : i;
        const int i1 = style == RopeStyle::Norm ? 2 * i + 1 : i + n_rot / 2;
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
      }
    }
  }
}

void CpuBackend::kv_store(KvLayer& kv, const Tensor& k, const Tensor& v, const AttentionBatch& batch) {
  const int64_t w = k.cols();
  const int32_t* cells = batch.cells.as<int32_t>();
  for (int r = 0; r < batch.n_tokens; ++r) {
    const int64_t c = cells[r];
    for (int which = 0; which < 2; ++which) {
      const Tensor& src = which ? v : k;
      Tensor& dst = which ? kv.v : kv.k;
      const float* s = src.as<float>() + r * w;
      if (dst.type == DType::F16) {
        uint16_t* d = dst.as<uint16_t>() + c * w;
        for (int64_t i = 0; i < w; ++i) d[i] = f32_to_fp16(s[i]);
      } else {
        std::memcpy(dst.as<float>() + c * w, s, static_cast<size_t>(w) * sizeof(float));
      }
    }
  }
}

void CpuBackend::attention(const Tensor& q, const KvLayer& kv, const AttentionBatch& batch, const AttentionParams& p,
                           Tensor& out) {
  const int n = batch.n_tokens, hd = p.head_dim;
  const int group = p.n_head / p.n_head_kv;  // consecutive query heads share a KV head
  const int64_t kv_w = static_cast<int64_t>(p.n_head_kv) * hd;
  const int32_t* pos = batch.positions.as<int32_t>();
  const int32_t* seq = batch.seq.as<int32_t>();
  const int32_t* bt = batch.block_table.as<int32_t>();
  const bool f16 = kv.k.type == DType::F16;
  pool_.parallel_for(static_cast<int64_t>(n) * p.n_head, 1, [&](int64_t i0, int64_t i1, int tid) {
    auto& buf = scratch((static_cast<size_t>(batch.max_kv_len) + static_cast<size_t>(hd)) * sizeof(float) * 2, tid);
    float* scores = reinterpret_cast<float*>(buf.data());
    float* acc = scores + batch.max_kv_len;
    for (int64_t i = i0; i < i1; ++i) {
      const int r = static_cast<int>(i / p.n_head), h = static_cast<int>(i % p.n_head), hk = h / group;
      const float* qr = q.as<float>() + static_cast<int64_t>(r) * q.cols() + static_cast<int64_t>(h) * hd;
      const int end = pos[r] + 1;
      const int begin = p.sliding_window > 0 ? std::max(0, end - p.sliding_window) : 0;
      const int32_t* table = bt + static_cast<int64_t>(seq[r]) * batch.max_blocks;
      float mx = -INFINITY;
      for (int j = begin; j < end; ++j) {
        const int64_t cell = static_cast<int64_t>(table[j / batch.block_size]) * batch.block_size + j % batch.block_size;
        const size_t off = static_cast<size_t>(cell * kv_w + static_cast<int64_t>(hk) * hd);
        float s = 0;
        if (f16) {
          const uint16_t* kr = kv.k.as<uint16_t>() + off;
          for (int d = 0; d < hd; ++d) s += qr[d] * fp16_to_f32(kr[d]);
        } else {
          s = vec_dot(DType::F32, hd, kv.k.as<float>() + off, qr);
        }
        s *= p.scale;
        if (p.logit_softcap > 0) s = p.logit_softcap * std::tanh(s / p.logit_softcap);
        scores[j - begin] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (int j = 0; j < end - begin; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      std::fill(acc, acc + hd, 0.0f);
      for (int j = begin; j < end; ++j) {
        const int64_t cell = static_cast<int64_t>(table[j / batch.block_size]) * batch.block_size + j % batch.block_size;
        const size_t off = static_cast<size_t>(cell * kv_w + static_cast<int64_t>(hk) * hd);
        const float w = scores[j - begin];
        if (f16) {
          const uint16_t* vr = kv.v.as<uint16_t>() + off;
          for (int d = 0; d < hd; ++d) acc[d] += w * fp16_to_f32(vr[d]);
        } else {
          const float* vr = kv.v.as<float>() + off;
          for (int d = 0; d < hd; ++d) acc[d] += w * vr[d];
        }
      }
      float* o = out.as<float>() + static_cast<int64_t>(r) * out.cols() + static_cast<int64_t>(h) * hd;
      for (int d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
  });
}

void CpuBackend::mul_sigmoid(Tensor& x, const Tensor& gate) {
  float* xp = x.as<float>();
  const float* g = gate.as<float>();
  for (int64_t i = 0; i < x.n_elements(); ++i) xp[i] *= 1.0f / (1.0f + std::exp(-g[i]));
}

void CpuBackend::softcap(Tensor& x, float cap) {
  float* p = x.as<float>();
  for (int64_t i = 0; i < x.n_elements(); ++i) p[i] = cap * std::tanh(p[i] / cap);
}

void CpuBackend::gather_cols(const Tensor& src, int group, int col0, Tensor& dst) {
  const int64_t n = src.rows(), groups = src.cols() / group, w = dst.cols() / groups;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < groups; ++g)
      std::memcpy(dst.as<float>() + r * dst.cols() + g * w, src.as<float>() + r * src.cols() + g * group + col0,
                  static_cast<size_t>(w) * sizeof(float));
}

void CpuBackend::moe_route(const Tensor& logits, int k, ExpertGating gating, bool norm, float scale, Tensor& ids,
                           Tensor& weights) {
  const int64_t n = logits.rows(), ne = logits.cols();
  std::vector<float> p(static_cast<size_t>(ne));
  std::vector<int> order(static_cast<size_t>(ne));
  for (int64_t r = 0; r < n; ++r) {
    const float* l = logits.as<float>() + r * ne;
    if (gating == ExpertGating::Softmax) {
      const float mx = *std::max_element(l, l + ne);
      double sum = 0;
      for (int64_t e = 0; e < ne; ++e) sum += (p[static_cast<size_t>(e)] = std::exp(l[e] - mx));
      for (auto& v : p) v = static_cast<float>(v / sum);
    } else {
      for (int64_t e = 0; e < ne; ++e) p[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] || (p[static_cast<size_t>(a)] == p[static_cast<size_t>(b)] && a < b);
    });
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
    sum = std::max(sum, 6.103515625e-5f);
    for (int j = 0; j < k; ++j) {
      const int e = order[static_cast<size_t>(j)];
      float w = p[static_cast<size_t>(e)];
      if (norm) w /= sum;
      if (scale != 0.0f) w *= scale;
      ids.as<int32_t>()[r * k + j] = e;
      weights.as<float>()[r * k + j] = w;
    }
  }
}

void CpuBackend::moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_exps,
                         const Tensor& up_exps, const Tensor& down_exps, Activation act, Tensor& out) {
  const bool fused = !up_exps.valid();  // gate_exps holds [gate | up] rows per expert
  const int64_t n = x.rows(), d = x.cols(), k = ids.cols(), ff = gate_exps.ne[1] / (fused ? 2 : 1), n_exp = gate_exps.ne[2];
  std::fill(out.as<float>(), out.as<float>() + n * d, 0.0f);
  // Group rows by expert so each expert's weights stream once per batch rather than once per token.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(n_exp));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids.as<int32_t>()[r * k + j];
      PG_CHECK(e >= 0 && e < n_exp, "moe_ffn: expert id out of range");
      routed[static_cast<size_t>(e)].push_back({r, weights.as<float>()[r * k + j]});
    }
  const int slot = pool_.size() + 1;
  for (int64_t e = 0; e < n_exp; ++e) {
    const auto& rows = routed[static_cast<size_t>(e)];
    if (rows.empty()) continue;
    const int64_t m = static_cast<int64_t>(rows.size());
    auto& buf = scratch(static_cast<size_t>(m * (d + 3 * ff + d)) * sizeof(float), slot);
    float* xs = reinterpret_cast<float*>(buf.data());  // (m, d)
    float* g = xs + m * d;                             // (m, ff)
    float* u = g + m * ff;                             // (m, ff)
    float* h = u + m * ff;                             // (m, ff)
    float* o = h + m * ff;                             // (m, d)
    for (int64_t i = 0; i < m; ++i) std::memcpy(xs + i * d, x.as<float>() + rows[static_cast<size_t>(i)].first * d, static_cast<size_t>(d) * 4);
    Tensor ge = gate_exps.slice3(e), ue;
    if (fused) {
      ue = ge;
      ue.data = static_cast<uint8_t*>(ge.data) + static_cast<size_t>(ff) * ge.row_bytes();
      ue.ne[1] = ge.ne[1] = ff;
    } else {
      ue = up_exps.slice3(e);
    }
    matmul_rows(ge, xs, m, d, g, ff);
    matmul_rows(ue, xs, m, d, u, ff);
    for (int64_t i = 0; i < m * ff; ++i) h[i] = (act == Activation::Silu ? g[i] / (1.0f + std::exp(-g[i])) : gelu_ggml(g[i])) * u[i];
    matmul_rows(down_exps.slice3(e), h, m, ff, o, d);
    for (int64_t i = 0; i < m; ++i) {
      float* dst = out.as<float>() + rows[static_cast<size_t>(i)].first * d;
      const float w = rows[static_cast<size_t>(i)].second;
      for (int64_t c = 0; c < d; ++c) dst[c] += w * o[i * d + c];
    }
  }
}

}  // namespace pg
