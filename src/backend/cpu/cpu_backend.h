// The CPU backend: the reference every other backend is checked against, and the fallback.
//
// Matmuls run the way llama.cpp's CPU backend does (activations converted to the weight type's
// vec_dot_type, integer/half dot products), which reproduces llama.cpp's "native" logits. With
// `exact_f32` every weight row is dequantized to F32 and multiplied in F32 instead — the model's
// math on exactly the weights the file decodes to (golden "f32ref").
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/threadpool.h"

namespace pg {

class CpuRunner;  // cpu_backend.cpp: the parallel loops of the CPU kernels

struct CpuOptions {
  int n_threads = 0;       // 0 = all cores
  bool exact_f32 = false;  // F32 matmuls on dequantized weights
  // Gated DeltaNet: 1 = token by token for every segment (the default: the result does not depend on how
  // a prompt is split into steps, which greedy speculative decoding relies on). > 1 = long segments
  // without captures in the chunked form with chunks of this length, counted from the segment start: a
  // different rounding for each split, so only for measurements and the tests comparing the two forms.
  int deltanet_chunk = 1;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& opt = {});
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  bool supports_kv_type(DType t) const override;  // every KV type of core/kv_quant.h
  int n_threads() const { return pool_.size(); }
  ThreadPool& pool() { return pool_; }

  Tensor alloc(DType t, int64_t cols, int64_t rows = 1, int64_t ne2 = 1) override;
  void free(Tensor& t) override;
  Tensor load_weight(DType t, const int64_t ne[4], const void* host_data) override;
  void upload(Tensor& dst, const void* src, size_t bytes, size_t dst_offset = 0) override;
  void download(const Tensor& src, void* dst, size_t bytes, size_t src_offset = 0) override;

  void get_rows(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void matmul(const Tensor& w, const Tensor& x, Tensor& y) override;
  void add_bias(Tensor& y, const Tensor& bias) override;
  void rms_norm(const Tensor& x, const Tensor& w, Tensor& y, float eps) override;
  void add(const Tensor& a, const Tensor& b, Tensor& y) override;
  void scale(Tensor& x, float s) override;
  void glu(const Tensor& gate, const Tensor& up, Tensor& y, Activation act) override;
  void rope(Tensor& x, const Tensor& pos, int n_heads, int head_dim, int n_rot, float base, RopeStyle style) override;
  void kv_store(KvLayer& kv, const Tensor& k, const Tensor& v, const AttentionBatch& batch) override;
  void attention(const Tensor& q, const KvLayer& kv, const AttentionBatch& batch, const AttentionParams& p,
                 Tensor& out) override;
  void mul_sigmoid(Tensor& x, const Tensor& gate) override;
  void softcap(Tensor& x, float cap) override;
  void argmax_rows(const Tensor& x, Tensor& ids) override;
  void topk_rows(const Tensor& x, int k, Tensor& ids, Tensor& logprobs) override;
  void kv_copy(KvLayer& kv, const Tensor& src_cells, const Tensor& dst_cells) override;
  void gather_cols(const Tensor& src, int group, int col0, Tensor& dst) override;
  void moe_route(const Tensor& logits, int k, ExpertGating gating, bool norm, float scale, Tensor& ids,
                 Tensor& weights) override;
  void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_exps, const Tensor& up_exps,
               const Tensor& down_exps, Activation act, Tensor& out) override;

  void mul_rows_sigmoid(Tensor& x, const Tensor& gate) override;
  // Gated DeltaNet ops: cpu_deltanet.cpp.
  void copy(const Tensor& src, Tensor& dst) override;
  void deltanet_gates(Tensor& alpha, Tensor& beta, const Tensor& dt_bias, const Tensor& a) override;
  void ssm_conv(const Tensor& x, const Tensor& w, Tensor& conv_state, const RecurrentBatch& rb, bool silu,
                Tensor& out) override;
  void gated_delta_net(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& state,
                       const RecurrentBatch& rb, int d_k, int d_v, float scale, Tensor& out) override;

  // GELU (tanh form) as ggml-cpu computes it: fp16(gelu(fp16(x))) for |x| < 10 — reproduced so that
  // Gemma matches llama.cpp, whose CPU backend reads GELU from an FP16 table.
  static float gelu_ggml(float x);

 private:
  // y = x·Wᵀ on raw pointers; used by matmul and by the MoE expert loop.
  void matmul_rows(const Tensor& w, const float* x, int64_t n, int64_t x_stride, float* y, int64_t y_stride);
  // y (n, out) = W · x[t] for activation rows x[t] already in gemm_x_type(kt) (kt = F32 with exact_f32).
  void matmul_blocks(const Tensor& w, DType kt, const void* const* x, int64_t n, float* y, int64_t y_stride);
  std::vector<uint8_t>& scratch(size_t bytes, int slot);

  CpuOptions opt_;
  ThreadPool pool_;
  std::vector<std::vector<uint8_t>> scratch_;
  std::vector<const void*> xptr_;  // (n) activation rows of the current matmul
  std::vector<int> attn_order_;    // (n) attention rows, longest first
  std::unique_ptr<CpuRunner> runner_;
};

}  // namespace pg
