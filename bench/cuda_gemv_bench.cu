// Micro-benchmark of the CUDA matmul kernels on 8B-model shapes (target pg_cuda_bench).
//
//   pg_cuda_bench [--types q4_k,q8_0,...] [--reps N] [--quick] [--shapes MxK,...] [--kernels k1,k2,...]
//                 [--pipe-stages N] [--pipe-bps N] [--rows n1,n2,...] [--no-stage-x] [--gemm]
//
// For every weight type and shape (M × K = out × in: 4096×4096 attention, 12288×4096 FFN gate/up,
// 4096×12288 FFN down, 151936×4096 output) it times the decode GEMV (n = 1) and prints µs, GB/s and
// the fraction of a measured device-to-device copy bandwidth (bytes read + written, like the roofline in
// shared/reference/gpu-baseline.md). On the FFN shape it also times n = 2, 4, 8 and the tensor-core
// GEMM at n = 512 (TFLOP/s), and the fused gate+up+GLU kernel against its composition (12288×4096) and
// the grouped q/k/v GEMV against three launches (4096×4096 + 2 × 1024×4096). Weights are valid random
// blocks (quantize_row on the host, tiled on the device); each measurement rotates over enough weight
// copies to exceed the L2 cache several times, and reports the median of CUDA-event timings after warm-up.
// The persistent pipelined one-row GEMV (CudaOptions::gemv_pipe) is timed as pipe+pdl (plain), glu/pipe+pdl
// and qkv/pipe+pdl beside the kernels it would replace (fast/rw2+pdl, glu/fused+pdl, qkv/grouped+pdl) where
// it applies, with --pipe-stages ring stages (default 4) and --pipe-bps blocks per SM (0: as many as fit).
// --shapes replaces the shape list (M×K = out×in), --kernels keeps only the named kernels, --rows the
// activation row counts timed on every shape (default: 1, 8, 22, 64; the FFN shape 1..64 and 512); the last
// column is the GB/s as a fraction of the H200's 4.3 TB/s HBM3e peak.
// --gemm: the prefill GEMM only, gemm.cu's tensor-core kernel against dequantize + cuBLASLt
// (CudaOptions::gemm_cublas) on the 8B prefill shapes at n = 512 and 4096 (see run_gemm_mode).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemm_cublas.h"
#include "backend/cuda/kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"

namespace {

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time in ms of f() over reps, after warm-ups; f may rotate buffers by the rep index.
template <class F>
double time_ms(int reps, F&& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f(i);
  CK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    f(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(t);
}

double copy_bandwidth_gbs() {
  const size_t bytes = size_t{1} << 30;
  void *src, *dst;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&dst, bytes));
  CK(cudaMemset(src, 1, bytes));
  const double ms = time_ms(10, [&](int) { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
  CK(cudaFree(src));
  CK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

// Device weights (M, K) of type t: host-quantized random rows, tiled over M.
void* make_weights(pg::DType t, int64_t K, int64_t M, size_t* bytes_out) {
  const size_t rb = pg::row_bytes(t, K);
  const int64_t base_rows = std::min<int64_t>(M, 256);
  std::vector<float> f(static_cast<size_t>(K * base_rows));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (auto& v : f) v = nd(rng);
  std::vector<uint8_t> host(rb * static_cast<size_t>(base_rows));
  for (int64_t r = 0; r < base_rows; ++r) pg::quantize_row(t, f.data() + r * K, host.data() + rb * static_cast<size_t>(r), K);
  const size_t bytes = rb * static_cast<size_t>(M);
  uint8_t* d = nullptr;
  CK(cudaMalloc(&d, bytes));
  CK(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice));
  for (size_t done = host.size(); done < bytes;) {
    const size_t chunk = std::min(done, bytes - done);
    CK(cudaMemcpy(d + done, d, chunk, cudaMemcpyDeviceToDevice));
    done += chunk;
  }
  *bytes_out = bytes;
  return d;
}

// --gemm: the prefill GEMM, gemm.cu's tensor-core kernel ("mma") against the cuBLASLt route of
// CudaOptions::gemm_cublas, on the 8B prefill shapes at n = 512 and 4096 (--shapes / --rows replace them). Rows:
//   mma           cuda::gemm: activation conversion + the dequantize-in-the-tile kernel (what runs today)
//   convert       gemm_convert_x alone (8-bit rounding + FP16), shared by both routes
//   dequant       dequant_f16 alone: the weight matrix → FP16 scratch; GB/s = weight bytes read + 2·M·K written
//   cublas/gemm   convert + cublasLtMatmul on the dequantized scratch (the FP16 GEMM part)
//   cublas/total  gemm_cublas: convert + dequant + cublasLtMatmul (what the option runs); "vs mma" = speed-up
// TFLOP/s count 2·M·K·n for every row (so convert/dequant read as throughput of the whole product). The last
// column checks the cuBLASLt output against the kernel's (relative norm difference; summation order only,
// expect ~1e-6). Weights rotate over copies (≥ 4× L2) as in the other modes; the FP16 scratch is one buffer,
// as in the backend.
int run_gemm_mode(const std::vector<pg::DType>& types, const std::vector<std::pair<int64_t, int64_t>>& shapes, const std::vector<int>& rows,
                  int reps, const cudaDeviceProp& prop, double copy_bw) {
  std::printf("| type | M (out) | K (in) | n | path | ms | TFLOP/s | GB/s | %% of copy | vs mma | rel diff |\n"
              "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
  cudaStream_t stream = nullptr;
  pg::cuda::CublasGemm* h = pg::cuda::cublas_gemm_create();
  void* lt_ws = nullptr;
  CK(cudaMalloc(&lt_ws, pg::cuda::kCublasWorkspaceBytes));
  for (pg::DType t : types) {
    if (!pg::cuda::gemm_supported(t)) {
      std::fprintf(stderr, "skipping %s: not a GEMM weight type\n", std::string(pg::dtype_name(t)).c_str());
      continue;
    }
    for (const auto& [M, K] : shapes) {
      size_t wbytes = 0;
      std::vector<void*> w;
      w.push_back(make_weights(t, K, M, &wbytes));
      const size_t target = 4 * static_cast<size_t>(prop.l2CacheSize);
      while (w.size() * wbytes < target && w.size() < 64) {
        void* c = nullptr;
        CK(cudaMalloc(&c, wbytes));
        CK(cudaMemcpy(c, w[0], wbytes, cudaMemcpyDeviceToDevice));
        w.push_back(c);
      }
      const int nmax = *std::max_element(rows.begin(), rows.end());
      float *x = nullptr, *y = nullptr, *y2 = nullptr;
      void *xh = nullptr, *wh = nullptr;
      CK(cudaMalloc(&x, static_cast<size_t>(nmax) * K * 4));
      CK(cudaMalloc(&y, static_cast<size_t>(nmax) * M * 4));
      CK(cudaMalloc(&y2, static_cast<size_t>(nmax) * M * 4));
      CK(cudaMalloc(&xh, pg::cuda::gemm_scratch_bytes(nmax, K)));
      CK(cudaMalloc(&wh, static_cast<size_t>(M) * K * 2));
      {
        std::vector<float> hx(static_cast<size_t>(nmax) * K);
        std::mt19937 rng(2);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto& v : hx) v = nd(rng);
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
      }
      for (int n : rows) {
        pg::cuda::MatmulArgs a;
        a.type = t;
        a.w = w[0];
        a.row_bytes = pg::row_bytes(t, K);
        a.K = K;
        a.M = M;
        a.x = x;
        a.x_stride = K;
        a.y = y;
        a.y_stride = M;
        a.n = n;
        a.act_quant = pg::cuda::act_quant_mode(t);  // default mode, as CudaBackend::matmul
        if (!pg::cuda::gemm_cublas_supported(a)) {
          std::fprintf(stderr, "skipping %s %lldx%lld: layout not supported by gemm_cublas\n", std::string(pg::dtype_name(t)).c_str(),
                       static_cast<long long>(M), static_cast<long long>(K));
          continue;
        }
        const bool plain = t == pg::DType::F16 || t == pg::DType::BF16;
        // The FP16 GEMM alone: the dequantized scratch as F16 weights (the plan's shape and alignments are those
        // of the full route; the activation conversion is the same because act_quant is kept).
        pg::cuda::MatmulArgs g = a;
        if (!plain) {
          g.type = pg::DType::F16;
          g.w = wh;
          g.row_bytes = static_cast<size_t>(K) * 2;
          pg::cuda::dequant_f16(a, static_cast<uint16_t*>(wh), stream);
        }
        const double flop = 2.0 * static_cast<double>(M) * K * n;
        double mma_ms = 0;
        for (const char* path : {"mma", "convert", "dequant", "cublas/gemm", "cublas/total"}) {
          const std::string p = path;
          if (plain && p == "dequant") continue;
          bool ok = true;
          const double ms = time_ms(reps, [&](int i) {
            pg::cuda::MatmulArgs b = a;
            b.w = w[static_cast<size_t>(i) % w.size()];
            if (p == "mma") {
              pg::cuda::gemm(b, nullptr, nullptr, xh, stream);
            } else if (p == "convert") {
              pg::cuda::gemm_convert_x(b, nullptr, static_cast<uint16_t*>(xh), stream);
            } else if (p == "dequant") {
              pg::cuda::dequant_f16(b, static_cast<uint16_t*>(wh), stream);
            } else if (p == "cublas/gemm") {
              pg::cuda::MatmulArgs c = plain ? b : g;
              c.y = y2;
              ok = ok && pg::cuda::gemm_cublas(*h, c, xh, nullptr, lt_ws, pg::cuda::kCublasWorkspaceBytes, stream);
            } else {
              b.y = y2;
              ok = ok && pg::cuda::gemm_cublas(*h, b, xh, wh, lt_ws, pg::cuda::kCublasWorkspaceBytes, stream);
            }
          });
          if (!ok) {
            std::printf("| %s | %lld | %lld | %d | %s | no cuBLASLt algorithm | | | | | |\n", std::string(pg::dtype_name(t)).c_str(),
                        static_cast<long long>(M), static_cast<long long>(K), n, path);
            continue;
          }
          if (p == "mma") mma_ms = ms;
          double bytes = 0;  // memory traffic of the row's own work, for GB/s
          if (p == "dequant") bytes = static_cast<double>(wbytes) + 2.0 * static_cast<double>(M) * K;
          if (p == "convert") bytes = 4.0 * n * K + 2.0 * n * K;
          std::string gbs = "", pct = "", vs = "", rel = "";
          char buf[64];
          if (bytes > 0) {
            const double v = bytes / (ms * 1e-3) / 1e9;
            std::snprintf(buf, sizeof buf, "%.0f", v);
            gbs = buf;
            std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * v / copy_bw);
            pct = buf;
          }
          if (p.rfind("cublas", 0) == 0 && mma_ms > 0) {
            std::snprintf(buf, sizeof buf, "%.2fx", mma_ms / ms);
            vs = buf;
          }
          if (p == "cublas/total") {
            // Both outputs from the same weights (copy 0): the kernel's in y, cuBLASLt's in y2.
            pg::cuda::MatmulArgs b = a;
            pg::cuda::gemm(b, nullptr, nullptr, xh, stream);
            b.y = y2;
            ok = pg::cuda::gemm_cublas(*h, b, xh, wh, lt_ws, pg::cuda::kCublasWorkspaceBytes, stream);
            CK(cudaDeviceSynchronize());
            std::vector<float> r0(static_cast<size_t>(n) * M), r1(r0.size());
            CK(cudaMemcpy(r0.data(), y, r0.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(r1.data(), y2, r1.size() * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (size_t i = 0; i < r0.size(); ++i) {
              const double d = static_cast<double>(r1[i]) - r0[i];
              num += d * d;
              den += static_cast<double>(r0[i]) * r0[i];
            }
            std::snprintf(buf, sizeof buf, "%.1e", den > 0 ? std::sqrt(num / den) : std::sqrt(num));
            rel = buf;
          }
          std::printf("| %s | %lld | %lld | %d | %s | %.3f | %.1f | %s | %s | %s | %s |\n", std::string(pg::dtype_name(t)).c_str(),
                      static_cast<long long>(M), static_cast<long long>(K), n, path, ms, flop / (ms * 1e-3) / 1e12, gbs.c_str(), pct.c_str(),
                      vs.c_str(), rel.c_str());
          std::fflush(stdout);
        }
      }
      CK(cudaDeviceSynchronize());
      for (void* p : w) CK(cudaFree(p));
      for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(y2), xh, wh}) CK(cudaFree(p));
    }
  }
  CK(cudaFree(lt_ws));
  pg::cuda::cublas_gemm_destroy(h);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<pg::DType> types = {pg::DType::Q4_K, pg::DType::Q6_K, pg::DType::Q8_0,  pg::DType::Q5_K,   pg::DType::Q4_0,
                                  pg::DType::Q4_1, pg::DType::Q5_0, pg::DType::Q5_1,  pg::DType::IQ4_XS, pg::DType::IQ4_NL,
                                  pg::DType::Q2_K, pg::DType::Q3_K, pg::DType::F16,   pg::DType::BF16,   pg::DType::F32};
  int reps = 20;
  bool quick = false;
  int pipe_stages = 4, pipe_bps = 0;
  bool stage_x = true;  // --no-stage-x: the one-row kernels read activations from global memory (MatmulArgs::stage_x)
  struct Shape {
    int64_t M, K;
  };
  std::vector<Shape> custom_shapes;
  std::vector<std::string> only_kernels;  // empty: all
  std::vector<int> only_rows;             // empty: every row count of the shape
  bool gemm_mode = false;                 // --gemm: the prefill GEMM, tensor-core kernel vs cuBLASLt (run_gemm_mode)
  bool types_given = false;
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    size_t p = 0;
    while (p <= s.size()) {
      const size_t q = std::min(s.find(',', p), s.size());
      if (q > p) out.push_back(s.substr(p, q - p));
      p = q + 1;
    }
    return out;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--gemm") {
      gemm_mode = true;
    } else if (a == "--pipe-stages" && i + 1 < argc) {
      pipe_stages = std::clamp(std::atoi(argv[++i]), 2, 8);
    } else if (a == "--no-stage-x") {
      stage_x = false;
    } else if (a == "--pipe-bps" && i + 1 < argc) {
      pipe_bps = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--kernels" && i + 1 < argc) {
      only_kernels = split(argv[++i]);
    } else if (a == "--rows" && i + 1 < argc) {
      for (const std::string& e : split(argv[++i])) {
        const int n = std::atoi(e.c_str());
        if (n <= 0) {
          std::fprintf(stderr, "bad row count '%s'\n", e.c_str());
          return 2;
        }
        only_rows.push_back(n);
      }
    } else if (a == "--shapes" && i + 1 < argc) {
      for (const std::string& e : split(argv[++i])) {
        const size_t x = e.find('x');
        if (x == std::string::npos || std::atoll(e.c_str()) <= 0 || std::atoll(e.c_str() + x + 1) <= 0) {
          std::fprintf(stderr, "bad shape '%s' (want MxK, e.g. 12288x4096)\n", e.c_str());
          return 2;
        }
        custom_shapes.push_back({std::atoll(e.c_str()), std::atoll(e.c_str() + x + 1)});
      }
    } else if (a == "--types" && i + 1 < argc) {
      types_given = true;
      types.clear();
      std::string s = argv[++i];
      size_t p = 0;
      while (p <= s.size()) {
        const size_t q = std::min(s.find(',', p), s.size());
        const auto t = pg::dtype_from_name(s.substr(p, q - p));
        if (!t) {
          std::fprintf(stderr, "unknown type '%s'\n", s.substr(p, q - p).c_str());
          return 2;
        }
        types.push_back(*t);
        p = q + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--types q4_k,q8_0,...] [--reps N] [--quick] [--shapes MxK,...] [--kernels k1,k2,...] [--pipe-stages N] "
                   "[--pipe-bps N] [--rows n1,n2,...] [--no-stage-x] [--gemm]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy_bw = copy_bandwidth_gbs();
  std::printf("device: %s, %d SMs, L2 %d MB; device-to-device copy: %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, copy_bw);
  if (gemm_mode) {
    // Default: the weight types of qwen3-8b Q4_K_M (Q4_K, Q6_K) and Q8_0; the 8B prefill shapes (q/o 4096×4096,
    // k/v 1024×4096, gate/up 12288×4096, down 4096×12288, output 151936×4096); n = 512 and 4096.
    if (!types_given) types = {pg::DType::Q4_K, pg::DType::Q6_K, pg::DType::Q8_0};
    std::vector<std::pair<int64_t, int64_t>> gs = {{4096, 4096}, {1024, 4096}, {12288, 4096}, {4096, 12288}, {151936, 4096}};
    if (!custom_shapes.empty()) {
      gs.clear();
      for (const Shape& c : custom_shapes) gs.push_back({c.M, c.K});
    }
    const std::vector<int> gr = only_rows.empty() ? std::vector<int>{512, 4096} : only_rows;
    try {
      return run_gemm_mode(types, gs, gr, reps, prop, copy_bw);
    } catch (const pg::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  std::printf("pipe: %d stages, %d blocks per SM (0 = as many as fit)\n", pipe_stages, pipe_bps);
  std::printf("| type | kernel | M (out) | K (in) | n | µs | GB/s | %% of copy | TFLOP/s | %% of 4.3 TB/s |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  constexpr double kPeakGbs = 4300.0;  // H200 HBM3e
  auto wanted = [&](const std::string& k) { return only_kernels.empty() || std::find(only_kernels.begin(), only_kernels.end(), k) != only_kernels.end(); };
  auto keep_wanted = [&](std::vector<std::string>& ks) { ks.erase(std::remove_if(ks.begin(), ks.end(), [&](const std::string& k) { return !wanted(k); }), ks.end()); };

  std::vector<Shape> shapes = {{4096, 4096}, {12288, 4096}, {4096, 12288}, {151936, 4096}};
  if (quick) shapes = {{12288, 4096}};
  if (!custom_shapes.empty()) shapes = custom_shapes;
  cudaStream_t stream = nullptr;  // legacy default stream: the events above time it
  try {
    for (pg::DType t : types) {
      for (const Shape& s : shapes) {
        size_t wbytes = 0;
        // Enough copies that one pass over them is ≥ 4× the L2 (so timings measure HBM, not cache).
        const size_t target = std::max<size_t>(4 * static_cast<size_t>(prop.l2CacheSize), 1);
        std::vector<void*> w;
        w.push_back(make_weights(t, s.K, s.M, &wbytes));
        while (w.size() * wbytes < target && w.size() < 64) {
          void* c = nullptr;
          CK(cudaMalloc(&c, wbytes));
          CK(cudaMemcpy(c, w[0], wbytes, cudaMemcpyDeviceToDevice));
          w.push_back(c);
        }
        const bool ffn = s.M == 12288 && s.K == 4096;
        // Decode rows (1), several sequences or a speculative verification batch (2..64: MMQ), prefill (512).
        std::vector<int> ns = {1, 8, 22, 64};
        if (ffn) ns = {1, 2, 4, 8, 16, 22, 32, 64, 512};
        if (!only_rows.empty()) ns = only_rows;  // --rows: these counts on every shape
        const int nmax = *std::max_element(ns.begin(), ns.end());
        float *x = nullptr, *y = nullptr;
        void* scratch = nullptr;
        void* part = nullptr;  // MMQ split-K partials: (splits ≤ 8, n, M)
        CK(cudaMalloc(&part, static_cast<size_t>(8) * 64 * s.M * 4));
        CK(cudaMalloc(&x, static_cast<size_t>(nmax * s.K) * 4));
        CK(cudaMalloc(&y, static_cast<size_t>(nmax * s.M) * 4));
        CK(cudaMalloc(&scratch, std::max<size_t>(pg::cuda::gemm_scratch_bytes(nmax, s.K), static_cast<size_t>(nmax) * s.K * 2 + 1024)));
        {
          std::vector<float> hx(static_cast<size_t>(nmax * s.K));
          std::mt19937 rng(2);
          std::normal_distribution<float> nd(0.0f, 1.0f);
          for (auto& v : hx) v = nd(rng);
          CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        }
        for (int n : ns) {
          const bool gemm = n > 8 && (ffn || n > 64) && pg::cuda::gemm_supported(t);
          pg::cuda::MatmulArgs a;
          a.type = t;
          a.row_bytes = pg::row_bytes(t, s.K);
          a.K = s.K;
          a.M = s.M;
          a.x = x;
          a.x_stride = s.K;
          a.y = y;
          a.y_stride = s.M;
          a.n = n;
          a.w = w[0];
          a.stage_x = stage_x;
          // Decode sizes: the default-mode kernel (8-bit activations, gemv_q8.cu) where it applies, then the
          // FP32 GEMV (exact mode); 2..64 rows: MMQ (integer tensor cores); prefill sizes and, on the FFN
          // shape, 16..64 rows for comparison: the FP16 tensor-core GEMM.
          std::vector<std::string> kernels;
          if (n <= 8) {
            if (pg::cuda::gemv_fast(a, scratch, stream)) {
              kernels.push_back("fast");
              // Lanes-per-row candidates of the 8-bit-activation kernel (CudaOptions::gemv_lanes).
              if (pg::cuda::gemv_fast_q8(a) && n == 1) kernels.insert(kernels.end(), {"fast/16", "fast/8"});
              // With programmatic dependent launch (CudaOptions::pdl), and the GEMV alone on activations
              // quantized beforehand (what the quantization launch costs).
              if (pg::cuda::gemv_fast_q8(a)) kernels.insert(kernels.end(), {"fast+pdl", "fast/noquant"});
              if (pg::cuda::gemv_fast_q8(a) && n == 1) kernels.insert(kernels.end(), {"fast/rw2", "fast/rw2+pdl"});
              // The persistent pipelined kernel (CudaOptions::gemv_pipe), where it takes the matmul.
              pg::cuda::MatmulArgs ap = a;
              ap.pipe_stages = pipe_stages;
              if (n == 1 && pg::cuda::gemv_pipe_supported(ap)) kernels.push_back("pipe+pdl");
            }
            kernels.push_back("fp32");
          }
          // mmq: the default (activations staged in shared memory); mmq/global: every warp reads them from
          // global memory (CudaOptions::mmq_staged = false).
          if (n >= 2 && n <= pg::cuda::kMmqMaxRows && pg::cuda::mmq_supported(a)) kernels.insert(kernels.end(), {"mmq", "mmq/global"});
          if (gemm) kernels.push_back("mma");
          keep_wanted(kernels);
          if (kernels.empty()) continue;
          for (const std::string& kernel : kernels) {
            const double ms = time_ms(reps, [&](int i) {
              a.w = w[static_cast<size_t>(i) % w.size()];
              if (kernel == "mma")
                pg::cuda::gemm(a, nullptr, nullptr, scratch, stream);
              else if (kernel == "mmq" || kernel == "mmq/global") {
                a.mmq_staged = kernel == "mmq";
                pg::cuda::mmq(a, scratch, part, prop.multiProcessorCount, stream);
                a.mmq_staged = true;
              }
              else if (kernel == "pipe+pdl") {
                a.pdl = true;
                a.rows_per_warp = 2;
                a.pipe_stages = pipe_stages;
                a.pipe_bps = pipe_bps;
                pg::cuda::gemv_fast(a, scratch, stream);
                a.pdl = false;
                a.rows_per_warp = 1;
                a.pipe_stages = 0;
              } else if (kernel.rfind("fast", 0) == 0) {
                a.lanes = kernel == "fast/16" ? 16 : kernel == "fast/8" ? 8 : 32;
                a.pdl = kernel == "fast+pdl" || kernel == "fast/rw2+pdl";
                a.rows_per_warp = kernel.rfind("fast/rw2", 0) == 0 ? 2 : 1;
                pg::cuda::gemv_fast(a, scratch, stream, /*x_quantized=*/kernel == "fast/noquant");
                a.lanes = 32;
                a.pdl = false;
                a.rows_per_warp = 1;
              }
              else
                pg::cuda::gemv(a, stream);
            });
            const double bytes = static_cast<double>(wbytes) + 4.0 * n * (s.K + s.M);
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            const double tflops = 2.0 * static_cast<double>(s.M) * s.K * n / (ms * 1e-3) / 1e12;
            std::printf("| %s | %s | %lld | %lld | %d | %.1f | %.0f | %.1f%% | %.2f | %.1f%% |\n", std::string(pg::dtype_name(t)).c_str(),
                        kernel.c_str(), static_cast<long long>(s.M), static_cast<long long>(s.K), n, ms * 1e3, gbs, 100.0 * gbs / copy_bw, tflops,
                        100.0 * gbs / kPeakGbs);
            std::fflush(stdout);
          }
        }
        // Fused decode FFN (CudaOptions::fuse_glu) on the gate/up shape: the composition the model runs
        // without it (act-quant, the two-row GEMV on gate and on up, both with PDL, then glu) against the
        // act-quant + one fused kernel; GB/s over both matrices. Grouped q/k/v (CudaOptions::fuse_qkv) on
        // the attention shape: q 4096 + k 1024 + v 1024 rows (slices of the weight copies) as three GEMV
        // launches vs one grouped launch, both after one act-quant.
        pg::cuda::MatmulArgs a1;
        a1.type = t;
        a1.row_bytes = pg::row_bytes(t, s.K);
        a1.K = s.K;
        a1.M = s.M;
        a1.x = x;
        a1.x_stride = s.K;
        a1.y = y;
        a1.y_stride = s.M;
        a1.n = 1;
        a1.w = w[0];
        a1.pdl = true;
        a1.stage_x = stage_x;
        a1.rows_per_warp = 2;
        const bool attn = s.M == 4096 && s.K == 4096;
        if ((ffn || attn) && pg::cuda::gemv_fast_q8(a1)) {
          std::vector<std::string> fused = ffn ? std::vector<std::string>{"glu/composed+pdl", "glu/fused+pdl"}
                                               : std::vector<std::string>{"qkv/separate+pdl", "qkv/grouped+pdl"};
          pg::cuda::MatmulArgs ap = a1;
          ap.pipe_stages = pipe_stages;
          if (pg::cuda::gemv_pipe_supported(ap)) fused.push_back(ffn ? "glu/pipe+pdl" : "qkv/pipe+pdl");
          keep_wanted(fused);
          for (const std::string& kernel : fused) {
            const double ms = time_ms(reps, [&](int i) {
              pg::cuda::MatmulArgs g = a1, u = a1;
              if (kernel.find("/pipe") != std::string::npos) g.pipe_stages = u.pipe_stages = pipe_stages, g.pipe_bps = u.pipe_bps = pipe_bps;
              g.w = w[static_cast<size_t>(i) % w.size()];
              u.w = w[static_cast<size_t>(i + 1) % w.size()];
              u.y = y + s.M;
              if (kernel == "glu/composed+pdl") {
                pg::cuda::quantize_q8(g, scratch, stream);
                pg::cuda::gemv_fast(g, scratch, stream, true);
                pg::cuda::gemv_fast(u, scratch, stream, true);
                pg::cuda::glu(g.y, u.y, g.y, s.M, 0, stream);
              } else if (kernel == "glu/fused+pdl" || kernel == "glu/pipe+pdl") {
                pg::cuda::gemv_glu(g, u, 0, scratch, stream);
              } else {
                pg::cuda::MatmulArgs q = g, k = g, v = u;
                k.w = static_cast<const uint8_t*>(u.w) + a1.row_bytes * 1024;  // rows of another copy
                k.M = v.M = 1024;
                k.y = y + 2 * s.M;
                const pg::cuda::MatmulArgs* group[3] = {&q, &k, &v};
                pg::cuda::quantize_q8(q, scratch, stream);
                if (kernel == "qkv/grouped+pdl" || kernel == "qkv/pipe+pdl") {
                  pg::cuda::gemv_multi(group, 3, scratch, stream, true);
                } else {
                  for (const pg::cuda::MatmulArgs* m : group) pg::cuda::gemv_fast(*m, scratch, stream, true);
                }
              }
            });
            const double wb = ffn ? 2.0 * static_cast<double>(wbytes) : 1.5 * static_cast<double>(wbytes);
            const double gbs = (wb + 4.0 * (s.K + 2 * s.M)) / (ms * 1e-3) / 1e9;
            std::printf("| %s | %s | %lld | %lld | 1 | %.1f | %.0f | %.1f%% | | %.1f%% |\n", std::string(pg::dtype_name(t)).c_str(), kernel.c_str(),
                        static_cast<long long>(s.M), static_cast<long long>(s.K), ms * 1e3, gbs, 100.0 * gbs / copy_bw, 100.0 * gbs / kPeakGbs);
            std::fflush(stdout);
          }
        }
        CK(cudaDeviceSynchronize());
        for (void* p : w) CK(cudaFree(p));
        CK(cudaFree(x));
        CK(cudaFree(y));
        CK(cudaFree(scratch));
        CK(cudaFree(part));
      }
    }
  } catch (const pg::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
