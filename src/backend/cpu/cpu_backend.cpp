#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/error.h"
#include "core/fp16.h"
#include "core/kv_quant.h"
#include "backend/cpu/kv_attn.h"
#include "core/quant.h"
#include "core/quant_dot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

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

// Runs the chunks of one parallel loop on the calling thread and n_threads − 1 workers, which claim
// chunks one at a time from a shared counter. Unlike ThreadPool::parallel_for, the caller never waits for
// a worker that has not started: once every chunk is claimed it detaches the job and waits only for
// chunks in progress. On a machine shared with other work a worker can take milliseconds to be scheduled,
// and decode runs about a hundred loops per token; ThreadPool's round trip (condition variable, wait for
// every worker) measured 24-46 us on the 2-core development machine. Workers do not spin while idle:
// there, under load from other jobs, a 50 us spin made decode 7% slower (it took the caller's core).
class CpuRunner {
 public:
  explicit CpuRunner(int n_threads) : n_(std::max(1, n_threads)) {
    for (int i = 1; i < n_; ++i) threads_.emplace_back([this, i] { worker(i); });
  }
  ~CpuRunner() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  CpuRunner(const CpuRunner&) = delete;
  CpuRunner& operator=(const CpuRunner&) = delete;

  int size() const { return n_; }

  // Calls body(chunk, thread) for every chunk in [0, n_chunks); thread is 0 for the caller, else 1..n-1.
  template <class F>
  void run(int64_t n_chunks, F& body) {
    if (n_chunks <= 1 || n_ <= 1) {
      for (int64_t c = 0; c < n_chunks; ++c) body(c, 0);
      return;
    }
    Job job;
    job.n = n_chunks;
    job.ctx = &body;
    job.call = [](void* ctx, int64_t c, int tid) { (*static_cast<F*>(ctx))(c, tid); };
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    drain(job, 0);
    {
      // From here no worker can attach; the ones that did hold `active` until their chunks are done.
      std::lock_guard<std::mutex> lock(mu_);
      job_ = nullptr;
    }
    for (int spin = 0; job.active.load(std::memory_order_acquire) != 0; ++spin) {
      if (spin < 4096) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    if (job.error) std::rethrow_exception(job.error);  // e.g. a pg::Error from a kernel, now on the caller's thread
  }

 private:
  struct Job {
    std::atomic<int64_t> next{0};
    std::atomic<int> active{0};
    int64_t n = 0;
    void* ctx = nullptr;
    void (*call)(void*, int64_t, int) = nullptr;
    std::mutex error_mu;
    std::exception_ptr error;  // the first exception of any chunk (guarded by error_mu)
  };

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }

  static void drain(Job& j, int tid) {
    for (int64_t c = j.next.fetch_add(1, std::memory_order_relaxed); c < j.n;
         c = j.next.fetch_add(1, std::memory_order_relaxed)) {
      try {
        j.call(j.ctx, c, tid);
      } catch (...) {
        std::lock_guard<std::mutex> lock(j.error_mu);
        if (!j.error) j.error = std::current_exception();
      }
    }
  }

  void worker(int tid) {
    uint64_t seen = 0;
    for (;;) {
      Job* j;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || gen_.load(std::memory_order_relaxed) != seen; });
        if (stop_) return;
        seen = gen_.load(std::memory_order_relaxed);
        j = job_;
        if (!j) continue;  // that job is already finished
        j->active.fetch_add(1, std::memory_order_relaxed);
      }
      drain(*j, tid);
      j->active.fetch_sub(1, std::memory_order_release);
    }
  }

  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  Job* job_ = nullptr;  // guarded by mu_
  bool stop_ = false;   // guarded by mu_
};

namespace {

template <class F>
void for_chunks(CpuRunner& runner, int64_t n_chunks, F&& body) {
  runner.run(n_chunks, body);
}

}  // namespace

CpuBackend::CpuBackend(const CpuOptions& opt)
    : opt_(opt), pool_(opt.n_threads), runner_(std::make_unique<CpuRunner>(pool_.size())) {
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
    PG_CHECK(id >= 0 && id < n_rows,
             "token id " + std::to_string(id) + " out of range (vocabulary " + std::to_string(n_rows) + ")");
    dequantize_row(table.type, static_cast<const uint8_t*>(table.data) + static_cast<size_t>(id) * table.row_bytes(),
                   out.as<float>() + i * d, d);
  }
}

void CpuBackend::matmul_rows(const Tensor& w, const float* x, int64_t n, int64_t x_stride, float* y, int64_t y_stride) {
  if (n <= 0) return;
  const int64_t in = w.ne[0];
  // --exact (and F32 weights): weight rows dequantized to F32, F32 dot products; else the native kernels
  // on activations converted the way llama.cpp converts them.
  const bool dequant = opt_.exact_f32 && w.type != DType::F32;
  const DType kt = dequant ? DType::F32 : w.type;
  auto& xp = xptr_;
  xp.resize(static_cast<size_t>(n));
  if (kt == DType::F32) {
    for (int64_t t = 0; t < n; ++t) xp[static_cast<size_t>(t)] = x + t * x_stride;
  } else {
    const size_t xrow = gemm_x_row_bytes(kt, in);
    uint8_t* xq = scratch(xrow * static_cast<size_t>(n), pool_.size()).data();  // (n, xrow bytes)
    for (int64_t t = 0; t < n; ++t) xp[static_cast<size_t>(t)] = xq + static_cast<size_t>(t) * xrow;
    const int64_t rows_per_chunk = n * in < 65536 ? n : std::max<int64_t>(1, 8192 / in);
    const int64_t chunks = (n + rows_per_chunk - 1) / rows_per_chunk;
    for_chunks(*runner_, chunks, [&](int64_t c, int) {
      const int64_t t1 = std::min(n, (c + 1) * rows_per_chunk);
      for (int64_t t = c * rows_per_chunk; t < t1; ++t)
        gemm_prepare_x(kt, x + t * x_stride, xq + static_cast<size_t>(t) * xrow, in);
    });
  }
  matmul_blocks(w, kt, xp.data(), n, y, y_stride);
}

void CpuBackend::matmul_blocks(const Tensor& w, DType kt, const void* const* x, int64_t n, float* y, int64_t y_stride) {
  const int64_t in = w.ne[0], out = w.ne[1];
  const size_t w_row = w.row_bytes();
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const bool dequant = kt != w.type;
  const int64_t nth = pool_.size();
  const size_t kbytes = dequant ? static_cast<size_t>(in) * sizeof(float) : w_row;  // bytes of a kernel weight row
  // Chunks of the loop are (weight block, activation block) pairs, weight-block-major, so a thread keeps a
  // weight block in L2 while activation blocks of 64 rows pass over it four rows at a time (gemm_rows).
  // Up to 4 activation rows (decode) the weights are read once, and each thread gets long contiguous
  // runs of rows: two blocks per thread. Measured on the 1B synth models, 2 threads: 16 KB blocks (the
  // first version) held decode to 14/22/10 tok/s (Q8_0/Q4_K_M/F16) against 42/58/23 with two blocks per
  // thread, apparently by cutting the hardware prefetcher's streams short; in prefill, 256 KB blocks of
  // whole float tiles (multiples of 12 rows) lifted F16 pp256 from 40 to 75 tok/s (64 KB: 71, 1 MB: 72).
  constexpr int64_t kXBlock = 64, kDecodeRows = 4;
  const int64_t n_xb = (n + kXBlock - 1) / kXBlock;
  int64_t wb;  // weight rows per block
  if (n <= kDecodeRows) {
    wb = (out + 2 * nth - 1) / (2 * nth);
  } else {
    wb = std::max<int64_t>(12, static_cast<int64_t>((256u << 10) / std::max<size_t>(kbytes, 1)) / 12 * 12);
    const int64_t want_wb = (2 * nth + n_xb - 1) / n_xb;  // weight blocks needed for two chunks per thread
    if ((out + wb - 1) / wb < want_wb) wb = std::max<int64_t>(1, (out + want_wb - 1) / want_wb);
  }
  const int64_t n_wb = (out + wb - 1) / wb;
  // Below ~2M multiply-adds a matmul runs on the calling thread: since the VNNI tiles, handing it to the pool
  // costs more than the math. Measured on the demo pair (2 threads, quiet machine, 20 prompts): AR 1 750–2 450
  // → 2 520–2 580 tok/s and chain n-max 8 1 260 → 1 500–1 600 tok/s against the old 256K threshold; DDTree
  // 22 within noise (830–1 005 vs 918–999).
  constexpr double kSerialMacs = 2.0e6;
  const bool serial = static_cast<double>(in) * static_cast<double>(out) * static_cast<double>(n) < kSerialMacs;
  const int64_t chunks = serial ? 1 : n_wb * n_xb;
  const int64_t dq_rows =
      std::max<int64_t>(1, static_cast<int64_t>((256u << 10) / kbytes));  // exact mode: rows dequantized at a time
  for_chunks(*runner_, chunks, [&](int64_t c, int tid) {
    const int64_t wbi = c / n_xb, xbi = c % n_xb;
    const int64_t xb0 = serial ? 0 : xbi * kXBlock, xb1 = serial ? n : std::min(n, xb0 + kXBlock);
    const int64_t o0 = serial ? 0 : wbi * wb, o1 = serial ? out : std::min(out, o0 + wb);
    if (!dequant) {
      gemm_rows(kt, in, wp + static_cast<size_t>(o0) * w_row, w_row, o1 - o0, x + xb0, xb1 - xb0, y + xb0 * y_stride + o0,
                y_stride);
      return;
    }
    const int64_t step = std::min(o1 - o0, dq_rows);
    float* wf = reinterpret_cast<float*>(scratch(static_cast<size_t>(step * in) * sizeof(float), tid).data());  // (step, in)
    for (int64_t b0 = o0; b0 < o1; b0 += step) {
      const int64_t b1 = std::min(o1, b0 + step);
      for (int64_t o = b0; o < b1; ++o) dequantize_row(w.type, wp + static_cast<size_t>(o) * w_row, wf + (o - b0) * in, in);
      gemm_rows(DType::F32, in, wf, static_cast<size_t>(in) * sizeof(float), b1 - b0, x + xb0, xb1 - xb0, y + xb0 * y_stride + b0,
                y_stride);
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
  constexpr int64_t kChunk = 16384;
  for_chunks(*runner_, (n + kChunk - 1) / kChunk, [&](int64_t c, int) {
    const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
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

bool CpuBackend::supports_kv_type(DType t) const { return is_kv_type(t); }

namespace {
bool plain_kv(DType t) { return t == DType::F32 || t == DType::F16; }
constexpr int kKvMaxGroup = 64;  // query heads per KV head the typed attention path keeps 1/sum for
}  // namespace

void CpuBackend::kv_store(KvLayer& kv, const Tensor& k, const Tensor& v, const AttentionBatch& batch) {
  const int32_t* cells = batch.cells.as<int32_t>();
  for (int which = 0; which < 2; ++which) {
    const Tensor& src = which ? v : k;  // (n_tokens, n_head_kv*head_dim) f32
    Tensor& dst = which ? kv.v : kv.k;  // (n_cells, row of dst.type)
    const int64_t w = src.cols();
    if (!plain_kv(dst.type)) {
      // Quantized rows: each head in whole blocks (core/kv_quant.h's layout), through the row codec.
      const int nh = kv.n_head_kv > 0 ? kv.n_head_kv : 1;
      const int hd = static_cast<int>(w / nh);
      const size_t rb = dst.row_bytes();
      for (int r = 0; r < batch.n_tokens; ++r)
        kv_quantize_row(dst.type, src.as<float>() + r * w, nh, hd, dst.as<uint8_t>() + static_cast<size_t>(cells[r]) * rb);
      continue;
    }
    for (int r = 0; r < batch.n_tokens; ++r) {
      const int64_t c = cells[r];
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

namespace {

// One attention item: query row r against one KV head, for the query heads that share that KV head.
struct AttnItem {
  const float* q;     // row r's queries (n_head·hd)
  float* out;         // row r's output (n_head·hd)
  const size_t* off;  // (len) element offset of each visible key/value row of this KV head
  int len;            // visible keys
};

struct AttnShape {
  int hd;
  float scale, softcap;
};

// Scale, soft-cap, then softmax in place over sc[0..len): exp(s - max) with a double sum, as the
// reference always did. Returns 1/sum, which the caller applies to the weighted V sum.
inline float attn_softmax(const AttnShape& a, float* sc, int len) {
  float mx = -INFINITY;
  for (int i = 0; i < len; ++i) {
    float s = sc[i] * a.scale;
    if (a.softcap > 0) s = a.softcap * std::tanh(s / a.softcap);
    sc[i] = s;
    mx = std::max(mx, s);
  }
  double sum = 0;
  for (int i = 0; i < len; ++i) {
    sc[i] = std::exp(sc[i] - mx);
    sum += sc[i];
  }
  return static_cast<float>(1.0 / sum);
}

// The reference form: one query head, scalar loops (F32 scores through vec_dot). Builds without AVX2,
// F32 caches and head sizes that are not a multiple of 8 use it. Every sum is an explicit FMA in key (or
// dimension) order, which is also what the vector form computes lane by lane, so both give the same bits.
void attn_head_ref(const AttnShape& a, const AttnItem& it, int h, const KvLayer& kv, float* scores, float* acc) {
  const int hd = a.hd;
  const bool f16 = kv.k.type == DType::F16, v16 = kv.v.type == DType::F16;  // K and V types are chosen separately
  const float* qr = it.q + static_cast<int64_t>(h) * hd;
  for (int j = 0; j < it.len; ++j) {
    float s = 0;
    if (f16) {
      const uint16_t* kr = kv.k.as<uint16_t>() + it.off[j];
      for (int d = 0; d < hd; ++d) s = std::fma(qr[d], fp16_to_f32(kr[d]), s);
    } else {
      s = vec_dot(DType::F32, hd, kv.k.as<float>() + it.off[j], qr);
    }
    scores[j] = s;
  }
  const float inv = attn_softmax(a, scores, it.len);
  std::fill(acc, acc + hd, 0.0f);
  for (int j = 0; j < it.len; ++j) {
    const float w = scores[j];
    if (v16) {
      const uint16_t* vr = kv.v.as<uint16_t>() + it.off[j];
      for (int d = 0; d < hd; ++d) acc[d] = std::fma(w, fp16_to_f32(vr[d]), acc[d]);
    } else {
      const float* vr = kv.v.as<float>() + it.off[j];
      for (int d = 0; d < hd; ++d) acc[d] = std::fma(w, vr[d], acc[d]);
    }
  }
  float* o = it.out + static_cast<int64_t>(h) * hd;
  for (int d = 0; d < hd; ++d) o[d] = acc[d] * inv;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PG_ATTN_AVX2 1

// 8 keys × 8 dims → 8 vectors of one dim each (lane i = key i): the layout in which each key's score
// accumulates over d in order, as in the reference, while 8 keys run side by side.
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

inline __m256 load_h8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// NG query heads h0.. of one item against an F16 cache, hd a multiple of 8: bit-identical to
// attn_head_ref per head. Each block of 8 keys is converted and transposed once for all NG heads, and each
// V row converted once for all NG accumulators. (Kept beside attn_head_ref, which it replaced on this path:
// about 17x fewer CPU samples in attention on pp512 of the 1B Q4_K_M model, where the scalar F16 conversions
// had made attention a third of the time.)
template <int NG>
void attn_heads_f16(const AttnShape& a, const AttnItem& it, int h0, const KvLayer& kv, float* scores) {
  const int hd = a.hd, len = it.len;
  const uint16_t* kbase = kv.k.as<uint16_t>();
  const uint16_t* vbase = kv.v.as<uint16_t>();
  const float* q[NG];
  float* sc[NG];  // (NG, len) scores, then probabilities
  for (int g = 0; g < NG; ++g) {
    q[g] = it.q + static_cast<int64_t>(h0 + g) * hd;
    sc[g] = scores + static_cast<size_t>(g) * static_cast<size_t>(len);
  }
  int j = 0;
  for (; j + 8 <= len; j += 8) {
    __m256 s[NG];
    for (int g = 0; g < NG; ++g) s[g] = _mm256_setzero_ps();
    for (int d0 = 0; d0 < hd; d0 += 8) {
      __m256 c[8];
      for (int i = 0; i < 8; ++i) c[i] = load_h8(kbase + it.off[j + i] + d0);
      transpose8(c);
      for (int e = 0; e < 8; ++e)
        for (int g = 0; g < NG; ++g) s[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(q[g] + d0 + e), c[e], s[g]);
    }
    for (int g = 0; g < NG; ++g) _mm256_storeu_ps(sc[g] + j, s[g]);
  }
  for (; j < len; ++j) {
    const uint16_t* kr = kbase + it.off[j];
    for (int g = 0; g < NG; ++g) {
      float s = 0;
      for (int d = 0; d < hd; ++d) s = std::fma(q[g][d], _cvtsh_ss(kr[d]), s);
      sc[g][j] = s;
    }
  }
  float inv[NG];
  for (int g = 0; g < NG; ++g) inv[g] = attn_softmax(a, sc[g], len);
  // V in blocks of 16 dims (then 8), so that the NG×2 accumulators and the converted row stay in registers.
  for (int d0 = 0; d0 < hd; d0 += 16) {
    const bool two = d0 + 16 <= hd;
    __m256 ac[NG][2];
    for (int g = 0; g < NG; ++g) ac[g][0] = ac[g][1] = _mm256_setzero_ps();
    for (int jj = 0; jj < len; ++jj) {
      const uint16_t* vr = vbase + it.off[jj] + d0;
      const __m256 v0 = load_h8(vr), v1 = two ? load_h8(vr + 8) : v0;
      for (int g = 0; g < NG; ++g) {
        const __m256 w = _mm256_broadcast_ss(sc[g] + jj);
        ac[g][0] = _mm256_fmadd_ps(w, v0, ac[g][0]);
        if (two) ac[g][1] = _mm256_fmadd_ps(w, v1, ac[g][1]);
      }
    }
    for (int g = 0; g < NG; ++g) {
      float* o = it.out + static_cast<int64_t>(h0 + g) * hd + d0;
      const __m256 iv = _mm256_set1_ps(inv[g]);
      _mm256_storeu_ps(o, _mm256_mul_ps(ac[g][0], iv));
      if (two) _mm256_storeu_ps(o + 8, _mm256_mul_ps(ac[g][1], iv));
    }
  }
}
#endif

}  // namespace

void CpuBackend::attention(const Tensor& q, const KvLayer& kv, const AttentionBatch& batch, const AttentionParams& p,
                           Tensor& out) {
  const int n = batch.n_tokens, hd = p.head_dim, group = p.n_head / p.n_head_kv;  // consecutive query heads share a KV head
  const AttnShape a{hd, p.scale, p.logit_softcap};
  const int64_t kv_w = static_cast<int64_t>(p.n_head_kv) * hd;
  const int32_t* pos = batch.positions.as<int32_t>();
  const int32_t* seq = batch.seq.as<int32_t>();
  const int32_t* bt = batch.block_table.as<int32_t>();
#if PG_ATTN_AVX2
  const bool vec = kv.k.type == DType::F16 && kv.v.type == DType::F16 && hd % 8 == 0;
#endif
  // Any other type than F32/F16 (or a mix with one): the per-type kernels of kv_attn read the cache's own
  // bytes (byte offsets per head), with the query prepared per K type (padded, rotated for TQ3_0).
  const bool typed = !plain_kv(kv.k.type) || !plain_kv(kv.v.type);
  const int hd_v = kv.head_dim_v > 0 ? kv.head_dim_v : hd;
  const int wk = kv_head_width(kv.k.type, hd), wv = kv_head_width(kv.v.type, hd_v);
  const size_t k_rb = kv.k.row_bytes(), v_rb = kv.v.row_bytes();
  const size_t k_hb = kv_head_bytes(kv.k.type, hd), v_hb = kv_head_bytes(kv.v.type, hd_v);
  PG_CHECK(!typed || group <= kKvMaxGroup, "attention: more than " + std::to_string(kKvMaxGroup) + " query heads per KV head with a " +
                                               kv_type_name(kv.k.type) + "/" + kv_type_name(kv.v.type) + " KV cache");
  // Items are (row, KV head), longest rows first so that handing them out one by one ends balanced.
  const int64_t n_items = static_cast<int64_t>(n) * p.n_head_kv;
  double work = 0;
  // Tree rows (speculative verification) see [begin, kv_len) plus the positions kv_len + j of their mask bits.
  const int32_t* kv_len = batch.tree_mask.valid() ? batch.kv_len.as<int32_t>() : nullptr;
  const uint32_t* tmask = batch.tree_mask.valid() ? batch.tree_mask.as<uint32_t>() : nullptr;
  for (int r = 0; r < n; ++r) work += static_cast<double>(pos[r] + 1);
  const bool serial = work * p.n_head * hd < 65536.0;
  std::vector<int>& order = attn_order_;
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return pos[x] > pos[y]; });
  const size_t max_len = static_cast<size_t>(std::max(batch.max_kv_len, 1));
  // Per thread: key offsets (max_len) size_t, [typed caches: value offsets (max_len) size_t], scores
  // (group, max_len) floats, V accumulator (hd) floats [typed: prepared queries (group, wk) and
  // accumulators (group, wv)].
  const size_t acc_floats = typed ? static_cast<size_t>(group) * static_cast<size_t>(wk + wv) : static_cast<size_t>(hd);
  const size_t slot_bytes = (max_len * static_cast<size_t>(group) + acc_floats) * sizeof(float) +
                            max_len * sizeof(size_t) * (typed ? 2 : 1);
  for_chunks(*runner_, serial ? 1 : n_items, [&](int64_t c, int tid) {
    const int64_t i0 = serial ? 0 : c, i1 = serial ? n_items : c + 1;
    uint8_t* buf = scratch(slot_bytes, tid).data();
    auto* offs = reinterpret_cast<size_t*>(buf);
    size_t* voffs = offs + max_len;  // typed caches only
    float* scores = reinterpret_cast<float*>(buf + max_len * sizeof(size_t) * (typed ? 2 : 1));
    float* acc = scores + max_len * static_cast<size_t>(group);
    for (int64_t i = i0; i < i1; ++i) {
      const int r = order[static_cast<size_t>(i / p.n_head_kv)], hk = static_cast<int>(i % p.n_head_kv);
      const int end = kv_len ? kv_len[r] : pos[r] + 1;
      const int begin = p.sliding_window > 0 ? std::max(0, pos[r] + 1 - p.sliding_window) : 0;
      const int32_t* table = bt + static_cast<int64_t>(seq[r]) * batch.max_blocks;
      const size_t head_off = static_cast<size_t>(hk) * static_cast<size_t>(hd);
      auto cell_of = [&](int j) {
        return static_cast<int64_t>(table[j / batch.block_size]) * batch.block_size + j % batch.block_size;
      };
      if (typed) {
        // Cells of the visible keys (block walk, then the tree's mask bits), as byte offsets of this head.
        int len = 0;
        auto add = [&](int64_t cell) {
          offs[len] = static_cast<size_t>(cell) * k_rb + static_cast<size_t>(hk) * k_hb;
          voffs[len++] = static_cast<size_t>(cell) * v_rb + static_cast<size_t>(hk) * v_hb;
        };
        for (int j = begin; j < end; ++j) add(cell_of(j));
        if (tmask) {
          const uint32_t* m = tmask + static_cast<int64_t>(r) * kTreeMaskWords;
          for (int j = 0; j < kMaxTreeRows; ++j)
            if (m[j / 32] >> (j % 32) & 1u) add(cell_of(end + j));
        }
        const float* qr = q.as<float>() + static_cast<int64_t>(r) * q.cols() + static_cast<int64_t>(hk) * group * hd;
        float* qp = acc;                                                  // (group, wk)
        float* va = acc + static_cast<size_t>(group) * static_cast<size_t>(wk);  // (group, wv)
        for (int g = 0; g < group; ++g) kv_prepare_query(kv.k.type, hd, qr + static_cast<int64_t>(g) * hd, qp + static_cast<size_t>(g) * wk);
        kv_scores(kv.k.type, hd, qp, group, kv.k.as<uint8_t>(), offs, len, scores);
        float inv[kKvMaxGroup];
        for (int g = 0; g < group; ++g) inv[g] = attn_softmax(a, scores + static_cast<size_t>(g) * static_cast<size_t>(len), len);
        std::fill(va, va + static_cast<size_t>(group) * static_cast<size_t>(wv), 0.0f);
        kv_accumulate(kv.v.type, hd_v, scores, group, kv.v.as<uint8_t>(), voffs, len, va);
        float* o = out.as<float>() + static_cast<int64_t>(r) * out.cols() + static_cast<int64_t>(hk) * group * hd_v;
        for (int g = 0; g < group; ++g)
          kv_finish_output(kv.v.type, hd_v, va + static_cast<size_t>(g) * wv, inv[g], o + static_cast<int64_t>(g) * hd_v);
        continue;
      }
      for (int j = begin; j < end;) {  // walk the blocks of the paged cache
        const int blk = j / batch.block_size, j1 = std::min(end, (blk + 1) * batch.block_size);
        const int64_t cell0 = static_cast<int64_t>(table[blk]) * batch.block_size - static_cast<int64_t>(blk) * batch.block_size;
        for (; j < j1; ++j) offs[j - begin] = static_cast<size_t>((cell0 + j) * kv_w) + head_off;
      }
      int len = std::max(0, end - begin);
      if (tmask) {
        const uint32_t* m = tmask + static_cast<int64_t>(r) * kTreeMaskWords;
        for (int j = 0; j < kMaxTreeRows; ++j)
          if (m[j / 32] >> (j % 32) & 1u) offs[len++] = static_cast<size_t>(cell_of(end + j) * kv_w) + head_off;
      }
      AttnItem it{q.as<float>() + static_cast<int64_t>(r) * q.cols(), out.as<float>() + static_cast<int64_t>(r) * out.cols(),
                  offs, len};
      const int h0 = hk * group;
#if PG_ATTN_AVX2
      if (vec) {
        int g = 0;
        for (; g + 4 <= group; g += 4) attn_heads_f16<4>(a, it, h0 + g, kv, scores);
        if (group - g == 3) attn_heads_f16<3>(a, it, h0 + g, kv, scores);
        if (group - g == 2) attn_heads_f16<2>(a, it, h0 + g, kv, scores);
        if (group - g == 1) attn_heads_f16<1>(a, it, h0 + g, kv, scores);
        continue;
      }
#endif
      for (int g = 0; g < group; ++g) attn_head_ref(a, it, h0 + g, kv, scores, acc);
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

void CpuBackend::topk_rows(const Tensor& x, int k, Tensor& ids, Tensor& logprobs) {
  const int64_t d = x.cols();
  PG_CHECK(x.type == DType::F32 && ids.type == DType::I32 && logprobs.type == DType::F32, "topk_rows: types");
  PG_CHECK(k >= 1 && k <= 64 && k <= d && ids.n_elements() >= x.rows() * k && logprobs.n_elements() >= x.rows() * k,
           "topk_rows: shape mismatch");
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* row = x.as<float>() + r * d;
    float mx = -INFINITY;
    for (int64_t i = 0; i < d; ++i) mx = std::max(mx, row[i]);  // NaN never wins std::max's comparison
    double sum = 0;
    for (int64_t i = 0; i < d; ++i)
      if (!std::isnan(row[i])) sum += std::exp(static_cast<double>(row[i]) - mx);
    const float lse = mx + static_cast<float>(std::log(sum));
    // Insertion into a sorted list of k: the vocabulary is scanned once.
    int32_t* id = ids.as<int32_t>() + r * k;
    float* lp = logprobs.as<float>() + r * k;
    int have = 0;
    for (int64_t i = 0; i < d; ++i) {
      const float v = row[i];
      if (std::isnan(v)) continue;
      if (have == k && !(v > row[id[k - 1]])) continue;
      int j = have < k ? have++ : k - 1;
      while (j > 0 && v > row[id[j - 1]]) {
        id[j] = id[j - 1];
        --j;
      }
      id[j] = static_cast<int32_t>(i);
    }
    // Fewer than k non-NaN values: repeat the last one found (column 0 when the row is all NaN), so the
    // ids are always valid columns.
    for (int j = have; j < k; ++j) id[j] = have > 0 ? id[have - 1] : 0;
    for (int j = 0; j < k; ++j) lp[j] = row[id[j]] - lse;
  }
}

void CpuBackend::kv_copy(KvLayer& kv, const Tensor& src_cells, const Tensor& dst_cells) {
  PG_CHECK(src_cells.n_elements() == dst_cells.n_elements(), "kv_copy: src and dst lengths differ");
  const int32_t* s = src_cells.as<int32_t>();
  const int32_t* d = dst_cells.as<int32_t>();
  for (Tensor* t : {&kv.k, &kv.v}) {
    const size_t rb = t->row_bytes();
    for (int64_t i = 0; i < src_cells.n_elements(); ++i) {
      PG_CHECK(s[i] >= 0 && s[i] < t->rows() && d[i] >= 0 && d[i] < t->rows(), "kv_copy: cell out of range");
      if (s[i] != d[i]) std::memmove(t->as<uint8_t>() + static_cast<size_t>(d[i]) * rb, t->as<uint8_t>() + static_cast<size_t>(s[i]) * rb, rb);
    }
  }
}

namespace {
// The column a strict `row[i] > row[best]` scan from best = 0 picks: the first column holding the largest
// non-NaN value, and 0 when column 0 is NaN (nothing compares greater than it). Vectorised as two passes with
// the same answer: that largest value M (a NaN lane never replaces the running maximum: ordered >), then the
// first column equal to M (a scan's best only moves on a strict increase, so it stops at M's first column;
// −0 == +0, as the scan treats them). Why: the scan's compare depends on the previous iteration's load,
// ~1.7 ns per column: 5 % of a decode step of the bundled 8 M-parameter model on one core (perf).
int32_t argmax_row(const float* row, int64_t d) {
  if (d <= 1 || std::isnan(row[0])) return 0;
  int64_t i = 0;
  float mx = row[0];
#if defined(__AVX2__)
  if (d >= 16) {
    __m256 m = _mm256_set1_ps(mx);
    for (; i + 8 <= d; i += 8) {
      const __m256 v = _mm256_loadu_ps(row + i);
      m = _mm256_blendv_ps(m, v, _mm256_cmp_ps(v, m, _CMP_GT_OQ));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    for (const float v : lanes) mx = v > mx ? v : mx;
  }
#endif
  for (; i < d; ++i) mx = row[i] > mx ? row[i] : mx;
  i = 0;
#if defined(__AVX2__)
  const __m256 target = _mm256_set1_ps(mx);
  for (; i + 8 <= d; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), target, _CMP_EQ_OQ));
    if (hit) return static_cast<int32_t>(i + std::countr_zero(static_cast<unsigned>(hit)));
  }
#endif
  for (; i < d; ++i)
    if (row[i] == mx) return static_cast<int32_t>(i);
  return 0;  // unreachable: mx is one of the row's values
}
}  // namespace

void CpuBackend::argmax_rows(const Tensor& x, Tensor& ids) {
  PG_CHECK(x.type == DType::F32 && ids.type == DType::I32 && ids.n_elements() >= x.rows(), "argmax_rows: shape or type mismatch");
  const int64_t d = x.cols();
  for (int64_t r = 0; r < x.rows(); ++r) ids.as<int32_t>()[r] = argmax_row(x.as<float>() + r * d, d);
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
      return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] ||
             (p[static_cast<size_t>(a)] == p[static_cast<size_t>(b)] && a < b);
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
  // The rows of x are converted to the kernels' format once and shared by every expert's gate and up
  // matmuls, instead of being gathered and converted again per expert and per projection.
  const bool dequant = opt_.exact_f32 && gate_exps.type != DType::F32;
  const DType kt = dequant ? DType::F32 : gate_exps.type;
  PG_CHECK(fused || up_exps.type == gate_exps.type, "moe_ffn: gate and up experts must have the same type");
  std::vector<const void*> xrow(static_cast<size_t>(n)), xe(static_cast<size_t>(n));  // all rows; one expert's rows
  if (kt == DType::F32) {
    for (int64_t r = 0; r < n; ++r) xrow[static_cast<size_t>(r)] = x.as<float>() + r * d;
  } else {
    const size_t xb = gemm_x_row_bytes(kt, d);
    uint8_t* xq = scratch(xb * static_cast<size_t>(n), pool_.size() + 2).data();  // (n, xb bytes)
    for (int64_t r = 0; r < n; ++r) xrow[static_cast<size_t>(r)] = xq + static_cast<size_t>(r) * xb;
    for_chunks(*runner_, n * d < 65536 ? 1 : n, [&](int64_t c, int) {
      const int64_t r0 = n * d < 65536 ? 0 : c, r1 = n * d < 65536 ? n : c + 1;
      for (int64_t r = r0; r < r1; ++r) gemm_prepare_x(kt, x.as<float>() + r * d, xq + static_cast<size_t>(r) * xb, d);
    });
  }
  const int slot = pool_.size() + 1;
  for (int64_t e = 0; e < n_exp; ++e) {
    const auto& rows = routed[static_cast<size_t>(e)];
    if (rows.empty()) continue;
    const int64_t m = static_cast<int64_t>(rows.size());
    auto& buf = scratch(static_cast<size_t>(m * (3 * ff + d)) * sizeof(float), slot);
    float* gu = reinterpret_cast<float*>(buf.data());  // (m, 2·ff): gate | up
    float* h = gu + m * 2 * ff;                        // (m, ff)
    float* o = h + m * ff;                             // (m, d)
    for (int64_t i = 0; i < m; ++i) xe[static_cast<size_t>(i)] = xrow[static_cast<size_t>(rows[static_cast<size_t>(i)].first)];
    if (fused) {
      matmul_blocks(gate_exps.slice3(e), kt, xe.data(), m, gu, 2 * ff);  // gate and up rows in one pass
    } else {
      Tensor ge = gate_exps.slice3(e), ue = up_exps.slice3(e);
      matmul_blocks(ge, kt, xe.data(), m, gu, 2 * ff);
      matmul_blocks(ue, kt, xe.data(), m, gu + ff, 2 * ff);
    }
    for (int64_t i = 0; i < m; ++i) {
      const float* g = gu + i * 2 * ff;
      const float* u = g + ff;
      float* hr = h + i * ff;
      for (int64_t c = 0; c < ff; ++c)
        hr[c] = (act == Activation::Silu ? g[c] / (1.0f + std::exp(-g[c])) : gelu_ggml(g[c])) * u[c];
    }
    matmul_rows(down_exps.slice3(e), h, m, ff, o, d);
    for (int64_t i = 0; i < m; ++i) {
      float* dst = out.as<float>() + rows[static_cast<size_t>(i)].first * d;
      const float w = rows[static_cast<size_t>(i)].second;
      for (int64_t c = 0; c < d; ++c) dst[c] += w * o[i * d + c];
    }
  }
}

}  // namespace pg
