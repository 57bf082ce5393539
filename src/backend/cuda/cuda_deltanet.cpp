// Host side of the Gated DeltaNet ops (kernels in deltanet.cu): shape checks, the recurrent batch's
// host mirror validated like the CPU backend does, and whether segments must run in order.
#include <cuda_runtime_api.h>

#include <set>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace pg {
namespace {

using cuda::activate;

cudaStream_t stream_of(CUstream_st* s) { return s; }

void check_f32_tensor(const Tensor& t, const char* op) { PG_CHECK(t.type == DType::F32, std::string(op) + ": expected an F32 tensor"); }

// The same validation as the CPU backend: a malformed batch is an error, never an out-of-range access.
void check_batch(const RecurrentBatch& rb, int64_t n_rows, int64_t n_slots, const char* op) {
  const std::string o(op);
  PG_CHECK(rb.n_tokens == n_rows, o + ": recurrent batch has " + std::to_string(rb.n_tokens) + " rows, tensors have " + std::to_string(n_rows));
  PG_CHECK(rb.h_rows.size() <= static_cast<size_t>(rb.n_tokens) && rb.h_capture.size() == static_cast<size_t>(rb.n_tokens) &&
               rb.h_seg.size() == 4 * static_cast<size_t>(rb.n_segments),
           o + ": malformed recurrent batch");
  PG_CHECK(rb.rows.valid() && rb.seg.valid() && rb.capture.valid(), o + ": the recurrent batch has no device tensors");
  const int listed = static_cast<int>(rb.h_rows.size());
  int covered = 0;
  for (int s = 0; s < rb.n_segments; ++s) {
    const int32_t* g = rb.h_seg.data() + 4 * static_cast<size_t>(s);
    PG_CHECK(g[0] >= 0 && g[1] > 0 && g[0] + g[1] <= listed, o + ": segment out of range");
    PG_CHECK(g[2] >= 0 && g[2] < n_slots && g[3] >= -1 && g[3] < n_slots, o + ": state slot out of range");
    covered += g[1];
  }
  PG_CHECK(covered <= listed, o + ": segments overlap");
  for (int i = 0; i < listed; ++i)
    PG_CHECK(rb.h_rows[static_cast<size_t>(i)] >= 0 && rb.h_rows[static_cast<size_t>(i)] < n_rows, o + ": row index out of range");
  for (int i = 0; i < rb.n_tokens; ++i)
    PG_CHECK(rb.h_capture[static_cast<size_t>(i)] >= -1 && rb.h_capture[static_cast<size_t>(i)] < n_slots, o + ": capture slot out of range");
}

// Segments run concurrently unless one starts from a slot that another writes (its dst or a capture):
// tree verification, where a child chain starts from its parent's captured state.
bool segments_serial(const RecurrentBatch& rb) {
  if (rb.n_segments <= 1) return false;
  std::multiset<int32_t> written;
  std::vector<std::set<int32_t>> own(static_cast<size_t>(rb.n_segments));
  for (int s = 0; s < rb.n_segments; ++s) {
    const int32_t* g = rb.h_seg.data() + 4 * static_cast<size_t>(s);
    if (g[3] >= 0) own[static_cast<size_t>(s)].insert(g[3]);
    for (int i = 0; i < g[1]; ++i) {
      const int32_t cap = rb.h_capture[static_cast<size_t>(rb.h_rows[static_cast<size_t>(g[0] + i)])];
      if (cap >= 0) own[static_cast<size_t>(s)].insert(cap);
    }
    for (int32_t slot : own[static_cast<size_t>(s)]) written.insert(slot);
  }
  for (int s = 0; s < rb.n_segments; ++s) {
    const int32_t src = rb.h_seg[4 * static_cast<size_t>(s) + 2];
    const size_t by_self = own[static_cast<size_t>(s)].count(src);
    if (written.count(src) > by_self) return true;
  }
  return false;
}

}  // namespace

void CudaBackend::mul_rows_sigmoid(Tensor& x, const Tensor& gate) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "mul_rows_sigmoid");
  check_own(gate, "mul_rows_sigmoid");
  check_f32_tensor(x, "mul_rows_sigmoid");
  check_f32_tensor(gate, "mul_rows_sigmoid");
  PG_CHECK(gate.rows() == x.rows() && gate.cols() == 1, "mul_rows_sigmoid: gate must be (rows, 1)");
  cuda::mul_rows_sigmoid(x.as<float>(), gate.as<float>(), x.rows(), x.cols(), stream_of(stream_));
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(src, "copy");
  check_own(dst, "copy");
  PG_CHECK(src.nbytes() == dst.nbytes(), "copy: size mismatch");
  if (src.data == dst.data) return;
  cuda::check(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream_of(stream_)), "copy (device to device)");
}

void CudaBackend::deltanet_gates(Tensor& alpha, Tensor& beta, const Tensor& dt_bias, const Tensor& a) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  for (const Tensor* t : {static_cast<const Tensor*>(&alpha), static_cast<const Tensor*>(&beta), &dt_bias, &a}) {
    check_own(*t, "deltanet_gates");
    check_f32_tensor(*t, "deltanet_gates");
  }
  const int64_t h = alpha.cols();
  PG_CHECK(beta.cols() == h && beta.rows() == alpha.rows() && dt_bias.n_elements() == h && a.n_elements() == h,
           "deltanet_gates: shape mismatch");
  cuda::deltanet_gates(alpha.as<float>(), beta.as<float>(), dt_bias.as<float>(), a.as<float>(), alpha.rows(), static_cast<int>(h),
                       stream_of(stream_));
}

void CudaBackend::ssm_conv(const Tensor& x, const Tensor& w, Tensor& conv_state, const RecurrentBatch& rb, bool silu, Tensor& out) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  for (const Tensor* t : {&x, &w, static_cast<const Tensor*>(&conv_state), static_cast<const Tensor*>(&out)}) check_own(*t, "ssm_conv");
  check_f32_tensor(x, "ssm_conv");
  check_f32_tensor(out, "ssm_conv");
  const int64_t C = x.cols();
  const int K = static_cast<int>(w.ne[0]);
  PG_CHECK(K >= 1 && w.ne[1] == C, "ssm_conv: weight shape does not match the input width");
  PG_CHECK(w.type == DType::F32 || w.type == DType::F16, "ssm_conv: weight must be F32 or F16");
  PG_CHECK(conv_state.type == DType::F32 && conv_state.cols() == static_cast<int64_t>(K - 1) * C, "ssm_conv: conv state shape mismatch");
  PG_CHECK(out.cols() == C && out.rows() == x.rows(), "ssm_conv: output shape mismatch");
  check_batch(rb, x.rows(), conv_state.rows(), "ssm_conv");
  cuda::SsmConvArgs a;
  a.x = x.as<float>();
  a.w = w.data;
  a.w_f16 = w.type == DType::F16;
  a.kernel = K;
  a.state = conv_state.as<float>();
  a.rows = rb.rows.as<int32_t>();
  a.seg = rb.seg.as<int32_t>();
  a.capture = rb.capture.as<int32_t>();
  a.n_segments = rb.n_segments;
  a.serial = segments_serial(rb);
  a.C = C;
  a.silu = silu;
  a.out = out.as<float>();
  cuda::ssm_conv(a, stream_of(stream_));
}

void CudaBackend::gated_delta_net(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& state,
                                  const RecurrentBatch& rb, int d_k, int d_v, float scale, Tensor& out) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  for (const Tensor* t : {&q, &k, &v, &g, &beta, static_cast<const Tensor*>(&state), static_cast<const Tensor*>(&out)}) {
    check_own(*t, "gated_delta_net");
    check_f32_tensor(*t, "gated_delta_net");
  }
  PG_CHECK(d_k > 0 && d_v > 0 && q.cols() % d_k == 0 && v.cols() % d_v == 0, "gated_delta_net: head size mismatch");
  const int hk = static_cast<int>(q.cols() / d_k), hv = static_cast<int>(v.cols() / d_v);
  PG_CHECK(k.cols() == q.cols() && hv % hk == 0, "gated_delta_net: value heads must be a multiple of key heads");
  const int64_t n = q.rows();
  PG_CHECK(k.rows() == n && v.rows() == n && out.rows() == n && out.cols() == v.cols(), "gated_delta_net: row count mismatch");
  PG_CHECK(g.cols() == hv && beta.cols() == hv && g.rows() == n && beta.rows() == n, "gated_delta_net: gate shape mismatch");
  PG_CHECK(state.cols() == static_cast<int64_t>(hv) * d_k * d_v, "gated_delta_net: state shape mismatch");
  check_batch(rb, n, state.rows(), "gated_delta_net");
  cuda::GatedDeltaArgs a;
  a.q = q.as<float>();
  a.k = k.as<float>();
  a.v = v.as<float>();
  a.g = g.as<float>();
  a.beta = beta.as<float>();
  a.state = state.as<float>();
  a.rows = rb.rows.as<int32_t>();
  a.seg = rb.seg.as<int32_t>();
  a.capture = rb.capture.as<int32_t>();
  a.n_segments = rb.n_segments;
  a.serial = segments_serial(rb);
  a.hk = hk;
  a.hv = hv;
  a.d_k = d_k;
  a.d_v = d_v;
  a.scale = scale;
  a.out = out.as<float>();
  cuda::gated_delta_net(a, stream_of(stream_));
}

}  // namespace pg
