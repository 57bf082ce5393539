// Prefill GEMM through cuBLASLt (CudaOptions::gemm_cublas): the alternative of issue 14 to gemm.cu's
// dequantize-in-the-tile kernel. Per matmul: the weights are dequantized whole to FP16 (BF16 for BF16 weights)
// into one scratch buffer, then one cublasLtMatmul multiplies them with gemm.cu's own activation operand.
//
// Why: gemm.cu's mma.sync kernel reaches ~0.4–0.8× llama.cpp's prompt speed on the H200; cuBLAS's Hopper
// kernels (wgmma, TMA, tuned tiles) run near the FP16 tensor-core peak. The price is the dequantization: it
// reads ~0.56 B (Q4_K) and writes 2 B per weight, ~0.4 ms for 151936×4096 at copy bandwidth, against ~8 ms of
// FP16 math at 4096 rows — but ~30 % of a 512-row product, so it only pays from some row count
// (CudaOptions::gemm_cublas_min_rows), to be measured (pg_cuda_bench --gemm).
// Accuracy: the 16-bit operands are bit-identical to gemm.cu's (same activation conversion, gemm_convert_x;
// the same decoders rounded the same way, dequant_f16), accumulation is FP32 (CUBLAS_COMPUTE_32F): the two
// paths differ only in summation order.
#include <cublasLt.h>

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemm_cublas.h"
#include "backend/cuda/gemm_cublas_layout.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int kDequantThreads = 256;

__device__ __forceinline__ uint32_t pack16(float a, float b, bool bf) {
  if (bf) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // exact: BF16 weights decode to BF16 values
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  const __half2 h = __floats2half2_rn(a, b);  // gemm.cu's pack_half2: round to nearest even, no saturation
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Contract: out (M, K) row-major dense 16-bit = W (M, K) dequantized, W given as Q's blocks at w (16-byte
// aligned), rows row_bytes apart (a multiple of Q::kAlign, whole blocks), K % 16 == 0; out 16-byte aligned.
// Element (m, k) = Q::run's value rounded to FP16 (BF16 for BF16 weights): the bits gemm_kernel puts in its
// tile. One thread per 16-element run, grid-stride over the M·K/16 runs; run i writes out[16i .. 16i+16) as
// two 16-byte stores, so a warp's stores cover 1 KiB of contiguous output and every block of the matrix is
// read by consecutive threads (its header and quant bytes through L1 once).
// Bytes: reads row_bytes·M (Q4_K: 0.5625 B per weight), writes 2·M·K — near copy bandwidth when it runs well.
// (Each store instruction covers half of each 32-byte sector of a 1 KiB span, the next one the other half; if
// pg_cuda_bench --gemm shows it well below copy bandwidth, staging a warp's 1 KiB through shared memory so that
// each instruction writes 512 contiguous bytes is the first thing to try.)
template <class Q, bool BF>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_kernel(const uint8_t* __restrict__ w,  // (M, row_bytes) raw GGUF blocks
                   size_t row_bytes,               // bytes between weight rows
                   int64_t runs_per_row,           // K / 16
                   int64_t total_runs,             // M · K / 16
                   uint16_t* __restrict__ out) {   // (M, K) dense FP16 / BF16 bits
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x; i < total_runs;
       i += static_cast<int64_t>(gridDim.x) * kDequantThreads) {
    float v[16];
    const int64_t o = dequant_run<Q>(w, row_bytes, runs_per_row, i, v);
    uint4* dst = reinterpret_cast<uint4*>(out + o);  // 32-byte aligned: o is a multiple of 16 elements
    dst[0] = make_uint4(pack16(v[0], v[1], BF), pack16(v[2], v[3], BF), pack16(v[4], v[5], BF), pack16(v[6], v[7], BF));
    dst[1] = make_uint4(pack16(v[8], v[9], BF), pack16(v[10], v[11], BF), pack16(v[12], v[13], BF), pack16(v[14], v[15], BF));
  }
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLASLt error in ") + what + ": " + cublasLtGetStatusString(s) + " (" + std::to_string(static_cast<int>(s)) + ")");
}

// The layout conditions of the dequantization kernel's loads (dequant_run → Q::run, ld128<Q::kAlign>).
template <class Q>
bool layout_ok(const MatmulArgs& a) {
  return reinterpret_cast<uintptr_t>(a.w) % 16 == 0 && a.row_bytes % Q::kAlign == 0 && a.K % Q::kElems == 0 &&
         a.row_bytes >= static_cast<size_t>(a.K / Q::kElems) * Q::kBytes;
}

}  // namespace

// ---- the cuBLASLt handle and its plans -----------------------------------------------------------------

// A plan: everything cublasLtMatmul needs for one shape, built once (descriptor creation and the heuristic
// cost tens of µs of host time; a prefill runs the same few shapes per chunk over and over).
struct CublasPlan {
  // Key. The alignments are part of it: the heuristic's choice is only valid for buffers at least that aligned.
  bool bf = false;
  int64_t M = 0, K = 0, n = 0, lda = 0, ldd = 0;
  uint32_t align_a = 0, align_b = 0, align_d = 0;
  size_t workspace = 0;
  // Value.
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // the heuristic offered an algorithm

  CublasPlan() = default;
  CublasPlan(const CublasPlan&) = delete;  // owns its descriptors
  CublasPlan& operator=(const CublasPlan&) = delete;
  bool same(const CublasPlan& o) const {
    return bf == o.bf && M == o.M && K == o.K && n == o.n && lda == o.lda && ldd == o.ldd && align_a == o.align_a && align_b == o.align_b &&
           align_d == o.align_d && workspace == o.workspace;
  }
  ~CublasPlan() {
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

class CublasGemm {
 public:
  CublasGemm() { check_lt(cublasLtCreate(&lt_), "cublasLtCreate"); }
  ~CublasGemm() {
    plans_.clear();
    if (lt_) cublasLtDestroy(lt_);
  }
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  cublasLtHandle_t lt() const { return lt_; }
  // The plan for key k (its key fields set), built on first use. Bounded: a server sees one n per prompt
  // chunk length, so the cache is dropped whole when it fills (rebuilding costs only host time).
  const CublasPlan& plan(const CublasPlan& k) {
    for (const auto& p : plans_)
      if (p->same(k)) return *p;
    if (plans_.size() >= kMaxPlans) plans_.clear();
    auto p = std::make_unique<CublasPlan>();
    build(k, *p);
    plans_.push_back(std::move(p));
    return *plans_.back();
  }

 private:
  static constexpr size_t kMaxPlans = 256;
  void build(const CublasPlan& k, CublasPlan& p);
  cublasLtHandle_t lt_ = nullptr;
  std::vector<std::unique_ptr<CublasPlan>> plans_;
};

void CublasGemm::build(const CublasPlan& k, CublasPlan& p) {
  p.bf = k.bf, p.M = k.M, p.K = k.K, p.n = k.n, p.lda = k.lda, p.ldd = k.ldd;
  p.align_a = k.align_a, p.align_b = k.align_b, p.align_d = k.align_d, p.workspace = k.workspace;
  const CublasGemmShape s = cublas_gemm_shape(k.M, k.K, k.n, k.lda, k.ldd);
  const cudaDataType_t t16 = k.bf ? CUDA_R_16BF : CUDA_R_16F;
  // FP32 accumulation and FP32 alpha/beta; FP16/BF16 inputs still run on the tensor cores.
  check_lt(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
  // Stored shapes (rows, cols) of the column-major operands: A (k, m) transposed, B (k, n), D (m, n).
  check_lt(cublasLtMatrixLayoutCreate(&p.la, t16, static_cast<uint64_t>(s.trans_a ? s.k : s.m), static_cast<uint64_t>(s.trans_a ? s.m : s.k), s.lda),
           "cublasLtMatrixLayoutCreate (A)");
  check_lt(cublasLtMatrixLayoutCreate(&p.lb, t16, static_cast<uint64_t>(s.trans_b ? s.n : s.k), static_cast<uint64_t>(s.trans_b ? s.k : s.n), s.ldb),
           "cublasLtMatrixLayoutCreate (B)");
  check_lt(cublasLtMatrixLayoutCreate(&p.ld, CUDA_R_32F, static_cast<uint64_t>(s.m), static_cast<uint64_t>(s.n), s.ldd),
           "cublasLtMatrixLayoutCreate (D)");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = k.workspace;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const uint32_t al[4] = {k.align_a, k.align_b, k.align_d, k.align_d};  // C is D (beta = 0, same buffer)
  const cublasLtMatmulPreferenceAttributes_t which[4] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i) st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
  cublasLtMatmulHeuristicResult_t res{};
  int count = 0;
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.la, p.lb, p.ld, p.ld, pref, 1, &res, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  // No algorithm (NOT_SUPPORTED, or none returned) is not an error: the caller runs gemm.cu instead.
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) check_lt(st, "cublasLtMatmulAlgoGetHeuristic");
  p.ok = st == CUBLAS_STATUS_SUCCESS && count > 0 && res.state == CUBLAS_STATUS_SUCCESS;
  if (p.ok) p.algo = res.algo;
}

CublasGemm* cublas_gemm_create() { return new CublasGemm(); }
void cublas_gemm_destroy(CublasGemm* h) { delete h; }

// ---- entry points ---------------------------------------------------------------------------------------

bool gemm_cublas_supported(const MatmulArgs& a) {
  if (a.expert_ids || !gemm_supported(a.type) || a.K % 32 != 0 || a.x_stride % 4 != 0 || a.M <= 0 || a.n <= 0) return false;
  bool ok = false;
  dispatch_type(a.type, [&]<class Q>() { ok = layout_ok<Q>(a); });
  return ok;
}

size_t gemm_cublas_weight_bytes(const MatmulArgs& a) {
  if (a.type == DType::F16 || a.type == DType::BF16) return 0;
  return static_cast<size_t>(a.M) * static_cast<size_t>(a.K) * 2;
}

void dequant_f16(const MatmulArgs& a, uint16_t* out, cudaStream_t stream) {
  PG_CHECK(gemm_cublas_supported(a), "dequant_f16: weight type " + std::string(dtype_name(a.type)) + " or its layout is not supported");
  PG_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0, "dequant_f16: the output must be 16-byte aligned");
  const int64_t runs_per_row = a.K / 16, total = a.M * runs_per_row;
  // One run per thread; the grid is capped (grid-stride beyond) only for matrices past 2^31 threads.
  const int64_t blocks = std::min<int64_t>((total + kDequantThreads - 1) / kDequantThreads, int64_t{1} << 30);
  const auto* w = static_cast<const uint8_t*>(a.w);
  dispatch_type(a.type, [&]<class Q>() {
    if constexpr (!std::is_same_v<Q, QF32>) {
      constexpr bool BF = std::is_same_v<Q, QBF16>;
      dequant_kernel<Q, BF><<<static_cast<unsigned>(blocks), kDequantThreads, 0, stream>>>(w, a.row_bytes, runs_per_row, total, out);
      check_launch("dequant_f16");
    }
  });
}

bool gemm_cublas(CublasGemm& h, const MatmulArgs& a, void* x_scratch, void* w_scratch, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream) {
  if (a.n <= 0 || a.M <= 0) return true;
  PG_CHECK(gemm_cublas_supported(a), "gemm_cublas: weight type " + std::string(dtype_name(a.type)) + " or its layout is not supported");
  const bool plain = a.type == DType::F16 || a.type == DType::BF16;
  PG_CHECK(plain || w_scratch != nullptr, "gemm_cublas: no scratch for the dequantized weights");
  // W_h: the weights themselves (F16/BF16: the bytes gemm.cu copies into its tile unchanged), or the scratch.
  const void* wh = plain ? a.w : w_scratch;
  CublasPlan key;
  key.bf = a.type == DType::BF16;
  key.M = a.M;
  key.K = a.K;
  key.n = a.n;
  key.lda = plain ? static_cast<int64_t>(a.row_bytes / 2) : a.K;
  key.ldd = a.y_stride;
  key.align_a = pointer_alignment(wh);
  key.align_b = pointer_alignment(x_scratch);
  key.align_d = pointer_alignment(a.y);
  key.workspace = workspace_bytes;
  PG_CHECK(a.y_stride >= a.M && (!plain || a.row_bytes % 2 == 0), "gemm_cublas: bad strides");
  const CublasPlan& p = h.plan(key);
  if (!p.ok) return false;
  auto* xh = static_cast<uint16_t*>(x_scratch);
  gemm_convert_x(a, nullptr, xh, stream);
  if (!plain) dequant_f16(a, static_cast<uint16_t*>(w_scratch), stream);
  const float alpha = 1.0f, beta = 0.0f;
  // C = D with beta = 0: cuBLAS does not read it; y's earlier contents do not matter.
  check_lt(cublasLtMatmul(h.lt(), p.op, &alpha, wh, p.la, xh, p.lb, &beta, a.y, p.ld, a.y, p.ld, &p.algo, workspace, workspace_bytes, stream),
           "cublasLtMatmul");
  return true;
}

}  // namespace pg::cuda
