// KV types on real activations: the bundled demo target (models/, a trained qwen3: 7 layers, 5 query
// heads / 1 KV head of 64) prefills a text of its domain (ChatML turns with arithmetic and Python) on the
// CPU with an F32 cache; a forwarding backend records each layer's real queries (after q-norm and RoPE,
// exactly what attention receives). Then, per KV type: round-trip error of the real K and V rows, and the
// relative error of each head's causal attention output against the F32 cache — the numbers of
// docs/kv-cache-types.md §"real activations". Loose bounds are asserted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kv_attn.h"
#include "core/kv_quant.h"
#include "model/model.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace pg {
namespace {

// The real CPU backend with every op forwarded; attention() also records its queries per layer.
class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(CpuBackend& b) : b_(b) {}
  struct Call {
    const void* k_data;                 // identifies the layer
    std::vector<float> q;               // (n, n_head*hd)
    std::vector<int32_t> pos;           // (n)
    AttentionParams p;
  };
  std::vector<Call> calls;

  std::string name() const override { return b_.name(); }
  bool is_host() const override { return b_.is_host(); }
  Tensor alloc(DType t, int64_t cols, int64_t rows, int64_t ne2) override { return b_.alloc(t, cols, rows, ne2); }
  void free(Tensor& t) override { b_.free(t); }
  Tensor load_weight(DType t, const int64_t ne[4], const void* d) override { return b_.load_weight(t, ne, d); }
  void upload(Tensor& dst, const void* src, size_t n, size_t off) override { b_.upload(dst, src, n, off); }
  void download(const Tensor& src, void* dst, size_t n, size_t off) override { b_.download(src, dst, n, off); }
  void synchronize() override { b_.synchronize(); }
  void get_rows(const Tensor& t, const Tensor& ids, Tensor& out) override { b_.get_rows(t, ids, out); }
  void matmul(const Tensor& w, const Tensor& x, Tensor& y) override { b_.matmul(w, x, y); }
  void matmul_shared(const Tensor& x, std::initializer_list<MatmulOut> outs) override { b_.matmul_shared(x, outs); }
  void add_bias(Tensor& y, const Tensor& bias) override { b_.add_bias(y, bias); }
  void rms_norm(const Tensor& x, const Tensor& w, Tensor& y, float eps) override { b_.rms_norm(x, w, y, eps); }
  void add(const Tensor& a, const Tensor& b, Tensor& y) override { b_.add(a, b, y); }
  void scale(Tensor& x, float s) override { b_.scale(x, s); }
  void glu(const Tensor& g, const Tensor& u, Tensor& y, Activation a) override { b_.glu(g, u, y, a); }
  void rope(Tensor& x, const Tensor& pos, int nh, int hd, int nr, float base, RopeStyle st) override {
    b_.rope(x, pos, nh, hd, nr, base, st);
  }
  void kv_store(KvLayer& kv, const Tensor& k, const Tensor& v, const AttentionBatch& batch) override {
    b_.kv_store(kv, k, v, batch);
  }
  void attention(const Tensor& q, const KvLayer& kv, const AttentionBatch& batch, const AttentionParams& p,
                 Tensor& out) override {
    Call c{kv.k.data, std::vector<float>(q.as<float>(), q.as<float>() + q.n_elements()),
           std::vector<int32_t>(batch.positions.as<int32_t>(), batch.positions.as<int32_t>() + batch.n_tokens), p};
    calls.push_back(std::move(c));
    b_.attention(q, kv, batch, p, out);
  }
  void mul_sigmoid(Tensor& x, const Tensor& g) override { b_.mul_sigmoid(x, g); }
  void softcap(Tensor& x, float cap) override { b_.softcap(x, cap); }
  void argmax_rows(const Tensor& x, Tensor& ids) override { b_.argmax_rows(x, ids); }
  void topk_rows(const Tensor& x, int k, Tensor& ids, Tensor& lp) override { b_.topk_rows(x, k, ids, lp); }
  void kv_copy(KvLayer& kv, const Tensor& s, const Tensor& d) override { b_.kv_copy(kv, s, d); }
  void gather_cols(const Tensor& src, int group, int col0, Tensor& dst) override { b_.gather_cols(src, group, col0, dst); }
  void moe_route(const Tensor& l, int k, ExpertGating g, bool norm, float s, Tensor& ids, Tensor& w) override {
    b_.moe_route(l, k, g, norm, s, ids, w);
  }
  void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& w, const Tensor& ge, const Tensor& ue, const Tensor& de,
               Activation a, Tensor& out) override {
    b_.moe_ffn(x, ids, w, ge, ue, de, a, out);
  }
  void mul_rows_sigmoid(Tensor& x, const Tensor& g) override { b_.mul_rows_sigmoid(x, g); }
  void copy(const Tensor& s, Tensor& d) override { b_.copy(s, d); }
  void deltanet_gates(Tensor& a, Tensor& b, const Tensor& dt, const Tensor& aa) override { b_.deltanet_gates(a, b, dt, aa); }
  void ssm_conv(const Tensor& x, const Tensor& w, Tensor& cs, const RecurrentBatch& rb, bool silu, Tensor& out) override {
    b_.ssm_conv(x, w, cs, rb, silu, out);
  }
  void gated_delta_net(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& st,
                       const RecurrentBatch& rb, int dk, int dv, float s, Tensor& out) override {
    b_.gated_delta_net(q, k, v, g, beta, st, rb, dk, dv, s, out);
  }

 private:
  CpuBackend& b_;
};

// A text of the demo model's domain (its training data: ChatML turns with arithmetic, unit conversions,
// string tasks, Python functions from a specification).
std::string domain_text() {
  std::string s;
  const char* names[] = {"total", "window", "count", "merge", "parse", "value", "index", "buffer"};
  for (int i = 0; i < 8; ++i) {
    const int a = 137 * (i + 3), b = 58 * (i + 1) + 9;
    s += "<|im_start|>user\nWhat is " + std::to_string(a) + " + " + std::to_string(b) + "?<|im_end|>\n";
    s += "<|im_start|>assistant\n<think>\n" + std::to_string(a) + " + " + std::to_string(b) + ": add the ones, then the tens.\n</think>\n" +
         std::to_string(a + b) + "<|im_end|>\n";
    s += "<|im_start|>user\nWrite a Python function " + std::string(names[i]) + "_of(xs) that returns the sum of the even numbers in xs.<|im_end|>\n";
    s += "<|im_start|>assistant\n```python\ndef " + std::string(names[i]) +
         "_of(xs):\n    result = 0\n    for x in xs:\n        if x % 2 == 0:\n            result += x\n    return result\n```<|im_end|>\n";
  }
  return s;
}

TEST(KvRealActivations, BundledTargetPerType) {
  CpuOptions co;
  co.n_threads = 2;
  co.exact_f32 = true;
  CpuBackend cpu(co);
  RecordingBackend be(cpu);
  const auto path = std::filesystem::path(PEREGRINE_SOURCE_DIR) / "models" / "peregrine-demo-target-Q8_0.gguf";
  auto model = Model::load(path.string(), be);
  auto tok = tok::Tokenizer::from_gguf(model->file());
  std::vector<int32_t> ids = tok->encode(domain_text(), false, true);
  ASSERT_GT(ids.size(), 400u);
  if (ids.size() > 1000) ids.resize(1000);
  const int n = static_cast<int>(ids.size());
  auto cache = model->make_cache({1, 1024, DType::F32});
  Batch b;
  for (int i = 0; i < n; ++i) b.add(ids[static_cast<size_t>(i)], i, 0, i == n - 1);
  std::vector<float> logits;
  model->forward(b, *cache, logits);

  // Layers in first-call order; each layer's queries of all rows, by position.
  std::map<const void*, int> layer_of;
  std::vector<int> layer_ids;
  for (int il = 0; il < model->config().n_layer; ++il)
    if (cache->has_layer(il)) {
      layer_of[cache->layer(il).k.data] = il;
      layer_ids.push_back(il);
    }
  ASSERT_FALSE(be.calls.empty());
  const AttentionParams p = be.calls[0].p;
  const int hd = p.head_dim, nh = p.n_head, nkv = p.n_head_kv, group = nh / nkv;
  std::map<int, std::vector<float>> q_of;  // layer -> (n, nh*hd)
  for (const auto& c : be.calls) {
    auto& q = q_of[layer_of.at(c.k_data)];
    q.resize(static_cast<size_t>(n) * nh * hd);
    for (size_t r = 0; r < c.pos.size(); ++r)
      std::copy(c.q.begin() + static_cast<ptrdiff_t>(r * nh * hd), c.q.begin() + static_cast<ptrdiff_t>((r + 1) * nh * hd),
                q.begin() + static_cast<ptrdiff_t>(c.pos[r]) * nh * hd);
  }
  std::printf("\nbundled target: %d tokens, %zu attention layers, %d q heads / %d kv heads of %d, scale %.4f\n", n,
              layer_ids.size(), nh, nkv, hd, p.scale);
  std::printf("| type | bits/value | K rel RMS | K max abs (max |K| %s) | V rel RMS | attn rel err mean | p95 | max |\n",
              "");
  std::printf("|---|---|---|---|---|---|---|---|\n");

  const std::vector<DType> types = {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                    DType::Q5_0, DType::Q5_1, DType::TQ3_0};
  const int w_kv = nkv * hd;
  double q8_err = 0, q4_err = 0;
  for (DType t : types) {
    double ke2 = 0, kx2 = 0, kmax = 0, kabs = 0, ve2 = 0, vx2 = 0;
    std::vector<double> errs;
    for (int il : layer_ids) {
      const KvLayer& kv = cache->layer(il);
      // The F32 rows of this layer in position order, and their quantized copies.
      std::vector<float> kf(static_cast<size_t>(n) * w_kv), vf(kf.size());
      for (int pos = 0; pos < n; ++pos) {
        const int64_t c = cache->cell(0, pos);
        std::copy(kv.k.as<float>() + c * w_kv, kv.k.as<float>() + (c + 1) * w_kv, kf.begin() + static_cast<ptrdiff_t>(pos) * w_kv);
        std::copy(kv.v.as<float>() + c * w_kv, kv.v.as<float>() + (c + 1) * w_kv, vf.begin() + static_cast<ptrdiff_t>(pos) * w_kv);
      }
      const size_t rb = kv_row_bytes(t, nkv, hd);
      std::vector<uint8_t> kq(rb * static_cast<size_t>(n)), vq(kq.size());
      std::vector<float> kd(static_cast<size_t>(w_kv)), vd(kd.size());
      for (int pos = 0; pos < n; ++pos) {
        kv_quantize_row(t, kf.data() + static_cast<size_t>(pos) * w_kv, nkv, hd, kq.data() + pos * rb);
        kv_quantize_row(t, vf.data() + static_cast<size_t>(pos) * w_kv, nkv, hd, vq.data() + pos * rb);
        kv_decode_row(t, kq.data() + pos * rb, nkv, hd, kd.data());
        kv_decode_row(t, vq.data() + pos * rb, nkv, hd, vd.data());
        for (int i = 0; i < w_kv; ++i) {
          const double x = kf[static_cast<size_t>(pos) * w_kv + i], e = kd[static_cast<size_t>(i)] - x;
          ke2 += e * e;
          kx2 += x * x;
          kmax = std::max(kmax, std::fabs(e));
          kabs = std::max(kabs, std::fabs(x));
          const double y = vf[static_cast<size_t>(pos) * w_kv + i], f = vd[static_cast<size_t>(i)] - y;
          ve2 += f * f;
          vx2 += y * y;
        }
      }
      // Causal attention of every 4th position from 16 on, every query head, quantized vs F32.
      const auto& q = q_of.at(il);
      std::vector<size_t> ko(static_cast<size_t>(n)), fo(static_cast<size_t>(n));
      std::vector<float> o(static_cast<size_t>(hd)), of(static_cast<size_t>(hd));
      for (int pos = 16; pos < n; pos += 4)
        for (int h = 0; h < nh; ++h) {
          const int hk = h / group;
          for (int j = 0; j <= pos; ++j) {
            ko[static_cast<size_t>(j)] = j * rb + hk * kv_head_bytes(t, hd);
            fo[static_cast<size_t>(j)] = (static_cast<size_t>(j) * w_kv + static_cast<size_t>(hk) * hd) * sizeof(float);
          }
          const float* qr = q.data() + (static_cast<size_t>(pos) * nh + h) * hd;
          kv_attention_head(t, t, hd, qr, kq.data(), ko.data(), vq.data(), ko.data(), pos + 1, p.scale, o.data());
          kv_attention_head(DType::F32, DType::F32, hd, qr, reinterpret_cast<const uint8_t*>(kf.data()), fo.data(),
                            reinterpret_cast<const uint8_t*>(vf.data()), fo.data(), pos + 1, p.scale, of.data());
          double e2 = 0, n2 = 0;
          for (int d = 0; d < hd; ++d) {
            e2 += (o[static_cast<size_t>(d)] - of[static_cast<size_t>(d)]) * static_cast<double>(o[static_cast<size_t>(d)] - of[static_cast<size_t>(d)]);
            n2 += static_cast<double>(of[static_cast<size_t>(d)]) * of[static_cast<size_t>(d)];
          }
          errs.push_back(std::sqrt(e2 / std::max(n2, 1e-30)));
        }
    }
    std::sort(errs.begin(), errs.end());
    double mean = 0;
    for (double e : errs) mean += e;
    mean /= static_cast<double>(errs.size());
    const double p95 = errs[errs.size() * 95 / 100], mx = errs.back();
    std::printf("| %s | %.2f | %.4f | %.3f (%.2f) | %.4f | %.4f | %.4f | %.4f |\n", kv_type_name(t).c_str(),
                kv_bits_per_value(t, hd), std::sqrt(ke2 / kx2), kmax, kabs, std::sqrt(ve2 / vx2), mean, p95, mx);
    if (t == DType::Q8_0) q8_err = mean;
    if (t == DType::Q4_0) q4_err = mean;
    const double bound = (t == DType::F16 || t == DType::BF16) ? 0.01 : t == DType::Q8_0 ? 0.03 : 0.5;
    EXPECT_LT(mean, bound) << kv_type_name(t);
  }
  EXPECT_LT(q8_err, q4_err);
}

}  // namespace
}  // namespace pg
