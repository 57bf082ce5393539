#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "backend/cuda/gemm_cublas.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_gemv.h"
#include "core/error.h"
#include "core/kv_quant.h"

namespace pg {
namespace cuda {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a sticky-free error so that the next call reports its own
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(err));
  }
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(std::string("CUDA kernel launch failed (") + kernel + "): " + cudaGetErrorString(err));
}

// Makes `device` current for the calling thread (cached: cudaSetDevice only when it changes).
void activate(int device) {
  thread_local int current = -1;
  if (current != device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    current = device;
  }
}

}  // namespace cuda

namespace {

using cuda::check;

// Scratch slots: each op that needs temporary device memory has its own, so their sizes never fight.
enum ScratchSlot {
  kSlotGemm,
  kSlotAttention,
  kSlotMoe,
  kSlotMoeGemm,
  kSlotQ8,
  kSlotActF32,
  kSlotMmqPart,
  kSlotNormQ8_0,  // fuse_norm_quant: the last norm's output as q8_0 activations (written only by the norms)
  kSlotNormQ8_K,  // ... and as q8_K
  kSlotGemmW,     // gemm_cublas: the dequantized weight matrix (M, K) 16-bit, sized for the largest seen
  kSlotCublasWs,  // gemm_cublas: the cuBLASLt workspace (cuda::kCublasWorkspaceBytes)
  kSlotCount
};

constexpr size_t kStageBytes = size_t{8} << 20;  // pinned upload ring
constexpr int kStageSegments = 4;

using cuda::activate;

static_assert(cuda::kAttnMaskWords == kTreeMaskWords, "the attention kernel's tree mask width follows backend.h");

void check_f32(const Tensor& t, const char* op) { PG_CHECK(t.type == DType::F32, std::string(op) + ": expected an F32 tensor"); }

cudaStream_t as_stream(CUstream_st* s) { return s; }

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void cuda_options_from_env(CudaOptions& opt) {
  if (const char* e = std::getenv("PEREGRINE_CUDA_GRAPHS"); e && std::strcmp(e, "0") == 0) opt.graphs = false;
  if (const char* e = std::getenv("PEREGRINE_CUDA_GRAPH_ROWS"); e && *e) opt.graph_max_rows = std::atoi(e);
  if (const char* e = std::getenv("PEREGRINE_GEMV_LANES"); e && *e) opt.gemv_lanes = std::atoi(e);
  if (const char* e = std::getenv("PEREGRINE_MMQ_MIN_ROWS"); e && *e) opt.mmq_min_rows = std::atoi(e);
  if (const char* e = std::getenv("PEREGRINE_CUDA_MMQ_STAGED"); e && *e) opt.mmq_staged = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_MMQ_GROUP"); e && *e) opt.mmq_group = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_GEMV_STAGE_X"); e && *e) opt.gemv_stage_x = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_PDL"); e && std::strcmp(e, "0") == 0) opt.pdl = false;
  if (const char* e = std::getenv("PEREGRINE_CUDA_PDL_ALL"); e && *e) opt.pdl_all = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_GEMV_RPW"); e && *e) opt.gemv_rows_per_warp = std::atoi(e);
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_PREFILL"); e && *e) opt.fa_prefill_min_rows = std::atoi(e);
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_PREFILL_TYPED"); e && *e) opt.fa_prefill_typed = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_DECODE"); e && *e) opt.fa_decode = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_SPLIT_BLOCKS"); e && *e) opt.fa_blocks_per_sm = std::max(1, std::atoi(e));
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_DECODE_CHUNK"); e && *e) opt.fa_decode_min_split_keys = std::max(64, std::atoi(e));
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_FUSED_COMBINE"); e && *e) opt.fa_fused_combine = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC"); e && *e) opt.fa_vec = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_TYPED"); e && *e) opt.fa_vec_typed = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_BLOCKS"); e && *e) opt.fa_vec_blocks_per_sm = std::max(1, std::atoi(e));
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_CHUNK"); e && *e) opt.fa_vec_min_chunk = std::max(1, std::atoi(e));
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_STAGES"); e && *e) opt.fa_vec_stages = std::clamp(std::atoi(e), 2, 4);
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_ROWS"); e && *e) opt.fa_vec_max_rows = std::clamp(std::atoi(e), 0, 8);
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_HEAD_DIM"); e && *e) opt.fa_vec_max_head_dim = std::atoi(e);
  if (const char* e = std::getenv("PEREGRINE_CUDA_KV_STORE_PAR"); e && *e) opt.kv_store_parallel = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FUSE_GLU"); e && *e) opt.fuse_glu = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FUSE_QKV"); e && *e) opt.fuse_qkv = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FUSE_QK_ROPE"); e && *e) opt.fuse_qk_norm_rope = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_FUSE_NORM_QUANT"); e && *e) opt.fuse_norm_quant = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_GEMV_PIPE"); e && *e) opt.gemv_pipe = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_GEMV_PIPE_U"); e && *e) opt.gemv_pipe_stages = std::atoi(e);
  if (const char* e = std::getenv("PEREGRINE_CUDA_GEMV_PIPE_BPS"); e && *e) opt.gemv_pipe_bps = std::max(0, std::atoi(e));
  if (const char* e = std::getenv("PEREGRINE_CUDA_MOE_FUSED"); e && *e) opt.moe_fused = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_L2_PREFETCH"); e && *e) opt.l2_prefetch_mb = std::max(0, std::atoi(e));
  if (const char* e = std::getenv("PEREGRINE_CUDA_L2_PREFETCH_BLOCKS"); e && *e) opt.l2_prefetch_blocks = std::clamp(std::atoi(e), 1, 132);
  if (const char* e = std::getenv("PEREGRINE_CUDA_GEMM_CUBLAS"); e && *e) opt.gemm_cublas = std::strcmp(e, "0") != 0;
  if (const char* e = std::getenv("PEREGRINE_CUDA_GEMM_CUBLAS_ROWS"); e && *e) opt.gemm_cublas_min_rows = std::max(1, std::atoi(e));
}

std::unique_ptr<Backend> create_cuda_backend(int index) {
  CudaOptions opt;
  if (const char* e = std::getenv("PEREGRINE_CUDA_EXACT"); e && *e && std::strcmp(e, "0") != 0) opt.exact_f32 = true;
  if (const char* e = std::getenv("PEREGRINE_CUDA_PROFILE"); e && *e) opt.profile = std::strcmp(e, "0") != 0;
  cuda_options_from_env(opt);
  return create_cuda_backend(index, opt);
}

std::unique_ptr<Backend> create_cuda_backend(int index, const CudaOptions& opt) {
  const int n = cuda_device_count();
  PG_CHECK(n > 0, "no CUDA device is available (no NVIDIA driver, or no GPU visible)");
  PG_CHECK(index >= 0 && index < n, "CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(n) + " visible)");
  return std::make_unique<CudaBackend>(index, opt);
}

CudaBackend::CudaBackend(int device, const CudaOptions& opt) : device_(device), opt_(opt) {
  PG_CHECK(opt_.gemv_max_rows >= 1 && opt_.gemv_max_rows <= 8, "CudaOptions::gemv_max_rows must be 1..8");
  PG_CHECK(opt_.gemv_lanes == 32 || opt_.gemv_lanes == 16 || opt_.gemv_lanes == 8, "CudaOptions::gemv_lanes must be 32, 16 or 8");
  PG_CHECK(opt_.mmq_min_rows >= 0 && opt_.mmq_min_rows <= cuda::kMmqMaxRows, "CudaOptions::mmq_min_rows must be 0..64");
  PG_CHECK(opt_.gemv_rows_per_warp == 1 || opt_.gemv_rows_per_warp == 2, "CudaOptions::gemv_rows_per_warp must be 1 or 2");
  PG_CHECK(opt_.gemv_pipe_stages >= 2 && opt_.gemv_pipe_stages <= 8, "CudaOptions::gemv_pipe_stages must be 2..8");
  PG_CHECK(opt_.fa_prefill_min_rows >= 0, "CudaOptions::fa_prefill_min_rows must be ≥ 0 (0 = off)");
  PG_CHECK(opt_.graph_max_rows >= 1 && opt_.graph_max_rows <= 64, "CudaOptions::graph_max_rows must be 1..64");
  PG_CHECK(opt_.l2_prefetch_mb >= 0 && opt_.l2_prefetch_mb <= 4096, "CudaOptions::l2_prefetch_mb must be 0..4096");
  PG_CHECK(opt_.l2_prefetch_blocks >= 1 && opt_.l2_prefetch_blocks <= 1024, "CudaOptions::l2_prefetch_blocks must be 1..1024");
  PG_CHECK(opt_.gemm_cublas_min_rows >= 1, "CudaOptions::gemm_cublas_min_rows must be ≥ 1");
  PG_CHECK(opt_.gemm_cublas_max_weight_mb >= 0, "CudaOptions::gemm_cublas_max_weight_mb must be ≥ 0");
  activate(device_);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
  PG_CHECK(prop.major >= 8, std::string("CUDA device ") + prop.name + " has compute capability " + std::to_string(prop.major) + "." +
                                std::to_string(prop.minor) + "; Peregrine needs 8.0 or newer");
  n_sm_ = prop.multiProcessorCount;
  pdl_capable_ = prop.major >= 9;
  cuda::set_pdl_launches(opt_.pdl && opt_.pdl_all && pdl_capable_);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
  scratch_.resize(kSlotCount);
  void* stage = nullptr;
  check(cudaMallocHost(&stage, kStageBytes), "cudaMallocHost (upload staging)");
  stage_ = static_cast<uint8_t*>(stage);
  stage_bytes_ = kStageBytes;
  // The tensor-core attention's split arrival counts (CudaOptions::fa_fused_combine): zero here, and every
  // launch that uses them leaves them at zero.
  void* counters = nullptr;
  check(cudaMalloc(&counters, kFaCounters * sizeof(int)), "cudaMalloc (attention split counters)");
  check(cudaMemset(counters, 0, kFaCounters * sizeof(int)), "cudaMemset (attention split counters)");
  fa_counters_ = static_cast<int*>(counters);
  for (int i = 0; i < kStageSegments; ++i) {
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    stage_events_.push_back(ev);
  }
}

void CudaBackend::prefetch_init() {
  cudaStream_t side = nullptr;
  check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate (prefetch)");
  side_stream_ = side;
  cudaEvent_t ev = nullptr;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate (prefetch fork)");
  fork_event_ = ev;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate (prefetch join)");
  join_event_ = ev;
  const size_t tb = sizeof(cuda::PrefetchDesc) * kPrefetchSlots;
  check(cudaMalloc(&prefetch_table_, tb), "cudaMalloc (prefetch table)");
  check(cudaMemset(prefetch_table_, 0, tb), "cudaMemset (prefetch table)");
  check(cudaMallocHost(&prefetch_mirror_, tb), "cudaMallocHost (prefetch table)");
  std::memset(prefetch_mirror_, 0, tb);
}

CudaBackend::~CudaBackend() {
  activate(device_);
  if (capturing_) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(as_stream(stream_), &g);
    if (g) cudaGraphDestroy(g);
  }
  cudaStreamSynchronize(as_stream(stream_));
  if (side_stream_) cudaStreamSynchronize(as_stream(side_stream_));
  cuda::cublas_gemm_destroy(cublas_);  // after the synchronisation: no queued cublasLtMatmul still uses it
  for (void* g : graphs_)  // dropped graphs leave null slots: destroying null is an error that would linger
    if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  for (auto& s : scratch_)
    if (s.ptr) cudaFree(s.ptr);
  for (void* p : retired_scratch_) cudaFree(p);
  for (auto* ev : stage_events_) cudaEventDestroy(ev);
  for (const ProfSpan& sp : prof_pending_) {
    cudaEventDestroy(sp.begin);
    cudaEventDestroy(sp.end);
  }
  for (auto* ev : prof_pool_) cudaEventDestroy(ev);
  if (stage_) cudaFreeHost(stage_);
  if (fa_counters_) cudaFree(fa_counters_);
  if (stream_) cudaStreamDestroy(as_stream(stream_));
  if (side_stream_) cudaStreamDestroy(as_stream(side_stream_));
  if (fork_event_) cudaEventDestroy(fork_event_);
  if (join_event_) cudaEventDestroy(join_event_);
  if (prefetch_table_) cudaFree(prefetch_table_);
  if (prefetch_mirror_) cudaFreeHost(prefetch_mirror_);
  // Nothing here may leave a sticky error for the next backend's first launch check (cudaGetLastError).
  cudaGetLastError();
}

std::string CudaBackend::name() const { return "cuda:" + std::to_string(device_) + " (" + device_name() + ")"; }

std::string CudaBackend::device_name() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) return "unknown";
  return prop.name;
}

size_t CudaBackend::total_memory() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) return 0;
  return prop.totalGlobalMem;
}

bool CudaBackend::supports_weight_type(DType t) { return cuda::gemv_supported(t); }

void CudaBackend::check_own(const Tensor& t, const char* op) const {
  PG_CHECK(t.valid(), std::string(op) + ": tensor has no data");
  PG_CHECK(t.backend == this, std::string(op) + ": tensor belongs to another backend");
}

// ---- fuse_norm_quant (cuda_backend.h: NormQ8) ---------------------------------------------------------

const cuda::NormQuant* CudaBackend::norm_q8_begin(const Tensor& y, cuda::NormQuant& nq) {
  norm_q8_ = NormQ8{};  // (this op's activate() has already ended any earlier record)
  // Only where a quantized matmul would read the result through the 8-bit scratch: default mode, up to MMQ's
  // row count (beyond it the GEMM rounds the activations itself), a width of whole 32-value blocks.
  const int64_t rows = y.rows(), cols = y.cols();
  if (!opt_.fuse_norm_quant || opt_.exact_f32 || rows < 1 || rows > cuda::kMmqMaxRows || cols % 32 != 0) return nullptr;
  const size_t bytes = cuda::q8_scratch_bytes(rows, cols);
  void* s0 = scratch(kSlotNormQ8_0, bytes);
  void* sk = cols % 256 == 0 ? scratch(kSlotNormQ8_K, bytes) : nullptr;
  nq = cuda::NormQuant{};
  nq.q8_0 = cuda::q8_scratch(s0, rows, cols);
  if (sk) nq.q8_k = cuda::q8_scratch(sk, rows, cols);
  norm_q8_ = NormQ8{op_epoch_, y.data, rows, cols, s0, sk};
  return &nq;
}

void* CudaBackend::norm_q8_for(const cuda::MatmulArgs& a) const {
  if (!opt_.fuse_norm_quant || opt_.exact_f32 || norm_q8_.epoch != op_epoch_ || a.expert_ids) return nullptr;
  if (a.x != norm_q8_.data || a.n != norm_q8_.rows || a.K != norm_q8_.cols || a.x_stride != norm_q8_.cols) return nullptr;
  const int mode = cuda::act_quant_mode(a.type);
  void* s = mode == cuda::kActQ8_0 ? norm_q8_.q8_0 : mode == cuda::kActQ8_K ? norm_q8_.q8_k : nullptr;
  norm_q8_hits_ += s != nullptr;
  return s;
}

void CudaBackend::norm_q8_written(const Tensor& out) {
  if (norm_q8_.epoch != op_epoch_ || !out.valid()) return;
  // Conservative: a matmul writing into the normed tensor (which the unfused path might re-quantize from
  // between its products) never uses the record, and the record ends.
  const auto* o0 = static_cast<const uint8_t*>(out.data);
  const auto* n0 = static_cast<const uint8_t*>(norm_q8_.data);
  const size_t nb = static_cast<size_t>(norm_q8_.rows * norm_q8_.cols) * sizeof(float);
  if (o0 < n0 + nb && n0 < o0 + out.nbytes()) norm_q8_.epoch = 0;
}

void* CudaBackend::scratch(int slot, size_t bytes) {
  Scratch& s = scratch_[static_cast<size_t>(slot)];
  if (bytes == 0) bytes = 1;
  if (s.bytes < bytes) {
    PG_CHECK(!capturing_, "CUDA graph capture: a scratch buffer would have to grow (" + std::to_string(bytes) +
                              " bytes); run the step once before capturing it");
    // Grown only when a larger shape first appears; the old buffer may still be in use by queued work,
    // and recorded graphs keep its address, so it stays alive as long as any graph does.
    check(cudaStreamSynchronize(as_stream(stream_)), "scratch grow (synchronize)");
    if (s.ptr) {
      if (any_graph())
        retired_scratch_.push_back(s.ptr);
      else
        check(cudaFree(s.ptr), "cudaFree (scratch)");
    }
    s.ptr = nullptr;
    s.bytes = 0;
    const size_t want = (bytes + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20);
    void* p = nullptr;
    check(cudaMalloc(&p, want), "cudaMalloc (scratch)");
    s.ptr = p;
    s.bytes = want;
  }
  return s.ptr;
}

// ---- op profiling ---------------------------------------------------------------------------------------

CudaBackend::ProfScope::ProfScope(CudaBackend* be, const char* op, std::string detail) : be_(be) {
  if (!be_) return;
  key_ = detail.empty() ? std::string(op) : std::string(op) + " " + detail;
  begin_ = be_->prof_event();
  check(cudaEventRecord(begin_, as_stream(be_->stream_)), "cudaEventRecord (profile)");
  ++be_->prof_depth_;
}

CudaBackend::ProfScope::~ProfScope() {
  if (!be_) return;
  --be_->prof_depth_;
  CUevent_st* end = be_->prof_event();
  // A destructor must not throw: a failed record drops the span (the op's own error is what matters).
  if (cudaEventRecord(end, as_stream(be_->stream_)) != cudaSuccess) {
    cudaGetLastError();
    be_->prof_pool_.push_back(begin_);
    be_->prof_pool_.push_back(end);
    return;
  }
  be_->prof_pending_.push_back({std::move(key_), begin_, end});
}

CUevent_st* CudaBackend::prof_event() {
  if (!prof_pool_.empty()) {
    CUevent_st* ev = prof_pool_.back();
    prof_pool_.pop_back();
    return ev;
  }
  cudaEvent_t ev = nullptr;
  check(cudaEventCreate(&ev), "cudaEventCreate (profile)");
  return ev;
}

void CudaBackend::prof_resolve() {
  for (ProfSpan& sp : prof_pending_) {
    float ms = 0.0f;
    check(cudaEventSynchronize(sp.end), "cudaEventSynchronize (profile)");
    check(cudaEventElapsedTime(&ms, sp.begin, sp.end), "cudaEventElapsedTime (profile)");
    auto it = std::find_if(prof_sum_.begin(), prof_sum_.end(), [&](const OpTime& t) { return t.key == sp.key; });
    if (it == prof_sum_.end()) {
      prof_sum_.push_back({std::move(sp.key), 0, 0.0});
      it = prof_sum_.end() - 1;
    }
    ++it->calls;
    it->ms += ms;
    prof_pool_.push_back(sp.begin);
    prof_pool_.push_back(sp.end);
  }
  prof_pending_.clear();
}

std::vector<Backend::OpTime> CudaBackend::profile_take() {
  if (!opt_.profile) return {};
  activate(device_);
  check(cudaStreamSynchronize(as_stream(stream_)), "profile_take (synchronize)");
  prof_resolve();
  std::vector<OpTime> out;
  out.swap(prof_sum_);
  return out;
}

// ---- memory -----------------------------------------------------------------------------------------

void CudaBackend::check_not_capturing(const char* what) const {
  PG_CHECK(!capturing_, std::string(what) + " is not allowed while a CUDA graph is being captured");
}

Tensor CudaBackend::alloc(DType t, int64_t cols, int64_t rows, int64_t ne2) {
  activate(device_);
  check_not_capturing("alloc");
  PG_CHECK(cols >= 0 && rows >= 0 && ne2 >= 0, "alloc: negative size");
  Tensor x;
  x.type = t;
  x.ne[0] = cols;
  x.ne[1] = rows;
  x.ne[2] = ne2;
  x.backend = this;
  // 16 bytes of slack past the end: the weight decoders' aligned word loads (quant_dot.cuh ld_words_a2) may
  // read up to 2 bytes past the last block of a tensor whose size is not a multiple of 4.
  const size_t bytes = x.nbytes() + 16;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error("CUDA out of memory: cannot allocate " + std::to_string(bytes) + " bytes on device " + std::to_string(device_) + " (" +
                cudaGetErrorString(err) + ")");
  }
  x.data = p;
  check(cudaMemsetAsync(p, 0, bytes, as_stream(stream_)), "cudaMemsetAsync (alloc)");
  return x;
}

void CudaBackend::free(Tensor& t) {
  if (!t.data) return;
  activate(device_);
  check_not_capturing("free");
  // Queued kernels may still read the buffer (a prefetch on the side stream too).
  check(cudaStreamSynchronize(as_stream(stream_)), "free (synchronize)");
  if (weight_bytes_.erase(t.data) > 0 && side_stream_) {
    // No hint may name it any more, not even one inside a recorded graph of another model on this backend:
    // the slots that name it are cleared on the device (the kernels read their slot at run time) before
    // the memory goes.
    check(cudaStreamSynchronize(as_stream(side_stream_)), "free (synchronize prefetch)");
    prefetch_plan_.forget(t.data);
    prefetch_flush();
    check(cudaStreamSynchronize(as_stream(stream_)), "free (prefetch table)");
  }
  check(cudaFree(t.data), "cudaFree");
  t.data = nullptr;
}

Tensor CudaBackend::load_weight(DType t, const int64_t ne[4], const void* host_data) {
  Tensor x = alloc(t, ne[0], ne[1], ne[2] * ne[3]);
  for (int i = 0; i < 4; ++i) x.ne[i] = ne[i];
  check(cudaMemcpyAsync(x.data, host_data, x.nbytes(), cudaMemcpyHostToDevice, as_stream(stream_)), "load_weight (copy)");
  // The source is a pageable memory map: wait, so that the copy is complete before the caller moves on.
  check(cudaStreamSynchronize(as_stream(stream_)), "load_weight (synchronize)");
  weight_bytes_[x.data] = x.nbytes();
  return x;
}

void CudaBackend::upload(Tensor& dst, const void* src, size_t bytes, size_t off) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_not_capturing("upload");
  check_own(dst, "upload");
  PG_CHECK(off + bytes <= dst.nbytes(), "upload: " + std::to_string(bytes) + " bytes at offset " + std::to_string(off) +
                                            " exceed the tensor's " + std::to_string(dst.nbytes()));
  if (bytes == 0) return;
  uint8_t* d = static_cast<uint8_t*>(dst.data) + off;
  const size_t seg = stage_bytes_ / kStageSegments;
  if (bytes > seg) {
    check(cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, as_stream(stream_)), "upload (copy)");
    check(cudaStreamSynchronize(as_stream(stream_)), "upload (synchronize)");
    return;
  }
  if (stage_head_ + bytes > seg) {
    // Leave this segment (its last copy is marked by the event) and wait until the next one is free.
    check(cudaEventRecord(stage_events_[static_cast<size_t>(stage_segment_)], as_stream(stream_)), "cudaEventRecord");
    stage_segment_ = (stage_segment_ + 1) % kStageSegments;
    check(cudaEventSynchronize(stage_events_[static_cast<size_t>(stage_segment_)]), "cudaEventSynchronize");
    stage_head_ = 0;
  }
  uint8_t* s = stage_ + static_cast<size_t>(stage_segment_) * seg + stage_head_;
  std::memcpy(s, src, bytes);
  check(cudaMemcpyAsync(d, s, bytes, cudaMemcpyHostToDevice, as_stream(stream_)), "upload (copy)");
  stage_head_ += (bytes + 63) & ~size_t{63};
}

void CudaBackend::download(const Tensor& src, void* dst, size_t bytes, size_t off) {
  activate(device_);
  check_not_capturing("download");
  check_own(src, "download");
  PG_CHECK(off + bytes <= src.nbytes(), "download: range exceeds the tensor");
  if (bytes > 0)
    check(cudaMemcpyAsync(dst, static_cast<const uint8_t*>(src.data) + off, bytes, cudaMemcpyDeviceToHost, as_stream(stream_)),
          "download (copy)");
  sync_timed("download (a kernel before it failed)");
  if (!prof_pending_.empty()) prof_resolve();
}

void CudaBackend::sync_timed(const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  check(cudaStreamSynchronize(as_stream(stream_)), what);
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CudaBackend::synchronize() {
  activate(device_);
  check_not_capturing("synchronize");
  sync_timed("synchronize (a kernel failed)");
  if (!prof_pending_.empty()) prof_resolve();
}

// ---- CUDA graphs ---------------------------------------------------------------------------------------

void CudaBackend::begin_capture() {
  activate(device_);
  PG_CHECK(!capturing_, "begin_capture: a capture is already in progress");
  // Thread-local mode: other threads' unrelated CUDA calls stay legal while this stream records.
  check(cudaStreamBeginCapture(as_stream(stream_), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  capturing_ = true;
}

int CudaBackend::end_capture() {
  activate(device_);
  PG_CHECK(capturing_, "end_capture without begin_capture");
  capturing_ = false;
  if (side_forked_in_capture_) {  // the prefetch branches rejoin the main stream: a capture must end joined
    side_forked_in_capture_ = false;
    check(cudaEventRecord(join_event_, as_stream(side_stream_)), "cudaEventRecord (prefetch join)");
    check(cudaStreamWaitEvent(as_stream(stream_), join_event_, 0), "cudaStreamWaitEvent (prefetch join)");
  }
  cudaGraph_t g = nullptr;
  check(cudaStreamEndCapture(as_stream(stream_), &g), "cudaStreamEndCapture (an op inside the capture failed?)");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  check(err, "cudaGraphInstantiate");
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size()) - 1;
}

void CudaBackend::replay(int graph) {
  activate(device_);
  PG_CHECK(graph >= 0 && graph < static_cast<int>(graphs_.size()) && graphs_[static_cast<size_t>(graph)], "replay: unknown graph");
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graphs_[static_cast<size_t>(graph)]), as_stream(stream_)), "cudaGraphLaunch");
}

int CudaBackend::graph_count() const {
  int n = 0;
  for (void* g : graphs_) n += g ? 1 : 0;
  return n;
}

bool CudaBackend::any_graph() const {
  for (void* g : graphs_)
    if (g) return true;
  return false;
}

void CudaBackend::free_retired_scratch() {
  for (void* p : retired_scratch_) cudaFree(p);
  retired_scratch_.clear();
}

void CudaBackend::abort_graph() {
  if (!capturing_) return;
  activate(device_);
  capturing_ = false;
  if (side_forked_in_capture_) {  // best effort: the capture is being thrown away
    side_forked_in_capture_ = false;
    cudaEventRecord(join_event_, as_stream(side_stream_));
    cudaStreamWaitEvent(as_stream(stream_), join_event_, 0);
  }
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(as_stream(stream_), &g);  // invalidated by the failure; only ends the capture
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
}

void CudaBackend::drop_graph(int id) {
  if (id < 0 || id >= static_cast<int>(graphs_.size()) || !graphs_[static_cast<size_t>(id)]) return;
  activate(device_);
  check(cudaStreamSynchronize(as_stream(stream_)), "drop_graph (synchronize)");
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graphs_[static_cast<size_t>(id)]));
  graphs_[static_cast<size_t>(id)] = nullptr;
  if (!any_graph()) free_retired_scratch();
}

void CudaBackend::drop_graphs() {
  activate(device_);
  check(cudaStreamSynchronize(as_stream(stream_)), "drop_graphs (synchronize)");
  for (void* g : graphs_)
    if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  graphs_.clear();
  free_retired_scratch();
}

// ---- ops ----------------------------------------------------------------------------------------------

void CudaBackend::get_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(table, "get_rows");
  check_own(ids, "get_rows");
  check_own(out, "get_rows");
  check_f32(out, "get_rows");
  const int64_t n = ids.n_elements();
  PG_CHECK(out.cols() == table.ne[0] && out.rows() >= n, "get_rows: output shape mismatch");
  cuda::get_rows(table.type, table.data, table.row_bytes(), table.rows(), table.ne[0], ids.as<int32_t>(), static_cast<int>(n),
                 out.as<float>(), out.cols(), as_stream(stream_));
}

void CudaBackend::gemv(const cuda::MatmulArgs& a) {
  // Default mode takes the 8-bit-activation kernels where they handle the type and layout. F16/BF16
  // weights take the fast kernel in exact mode too: it multiplies the exactly converted weights with FP32
  // activations in FP32, which is what exact mode asks for, and it handles K that is not a multiple of 32
  // (the FP32 GEMV's virtual block), e.g. qwen35moe's 16-wide tiny experts.
  const bool half = a.type == DType::F16 || a.type == DType::BF16;
  if (!opt_.exact_f32 || half) {
    cuda::MatmulArgs b = a;
    b.lanes = opt_.gemv_lanes;
    b.pdl = opt_.pdl && pdl_capable_;
    b.rows_per_warp = opt_.gemv_rows_per_warp;
    b.pipe_stages = opt_.gemv_pipe ? opt_.gemv_pipe_stages : 0;
    b.pipe_bps = opt_.gemv_pipe_bps;
    const size_t sb = cuda::gemv_fast_scratch_bytes(b);
    if (void* pq = cuda::gemv_fast_q8(b) ? norm_q8_for(b) : nullptr) {  // fuse_norm_quant: the norm quantized x
      if (cuda::gemv_fast(b, pq, as_stream(stream_), /*x_quantized=*/true)) return;
    }
    if (cuda::gemv_fast(b, sb ? scratch(kSlotQ8, sb) : nullptr, as_stream(stream_))) return;
  }
  const int mode = opt_.exact_f32 ? cuda::kActNone : cuda::act_quant_mode(a.type);
  if (mode != cuda::kActNone && a.K % (mode == cuda::kActQ8_K ? 256 : 32) == 0) {
    // Default mode, a type or layout without an 8-bit kernel: the FP32 GEMV on the activations rounded
    // as the CPU's default mode rounds them (quantized, then dequantized), so both backends see the
    // same inputs.
    const int64_t rows = a.expert_ids ? (a.n + std::max(1, a.x_div) - 1) / std::max(1, a.x_div) : a.n;
    auto* xr = static_cast<float*>(scratch(kSlotActF32, static_cast<size_t>(rows * a.K) * sizeof(float)));
    cuda::act_quant_f32(mode, a.x, a.x_stride, rows, a.K, xr, as_stream(stream_));
    cuda::MatmulArgs b = a;
    b.x = xr;
    b.x_stride = a.K;
    cuda::gemv(b, as_stream(stream_));
    return;
  }
  cuda::gemv(a, as_stream(stream_));
}

cuda::MatmulArgs CudaBackend::matmul_args(const Tensor& w, const Tensor& x, Tensor& y) const {
  check_own(w, "matmul");
  check_own(x, "matmul");
  check_own(y, "matmul");
  check_f32(x, "matmul");
  check_f32(y, "matmul");
  PG_CHECK(x.cols() == w.ne[0], "matmul: input width " + std::to_string(x.cols()) + " != weight rows " + std::to_string(w.ne[0]));
  PG_CHECK(y.cols() == w.ne[1] && y.rows() == x.rows(), "matmul: output shape mismatch");
  PG_CHECK(cuda::gemv_supported(w.type), "CUDA matmul: weight type " + std::string(dtype_name(w.type)) + " is not supported");
  cuda::MatmulArgs a;
  a.type = w.type;
  a.w = w.data;
  a.row_bytes = w.row_bytes();
  a.K = w.ne[0];
  a.M = w.ne[1];
  a.x = x.as<float>();
  a.x_stride = x.cols();
  a.y = y.as<float>();
  a.y_stride = y.cols();
  a.n = static_cast<int>(x.rows());
  a.lanes = opt_.gemv_lanes;
  a.pdl = opt_.pdl && pdl_capable_;
  a.rows_per_warp = opt_.gemv_rows_per_warp;
  a.mmq_staged = opt_.mmq_staged;
  a.stage_x = opt_.gemv_stage_x;
  a.pipe_stages = opt_.gemv_pipe ? opt_.gemv_pipe_stages : 0;
  a.pipe_bps = opt_.gemv_pipe_bps;
  return a;
}

bool CudaBackend::use_mmq(const cuda::MatmulArgs& a) const {
  if (opt_.exact_f32 || opt_.mmq_min_rows <= 0 || !cuda::mmq_supported(a)) return false;
  // Q8_0/Q4_0 (2-byte-aligned 32-value blocks, one scale load per block): MMQ only above 8 rows; up to 8
  // the dp4a GEMV is faster (device run 14, 12288×4096: Q8_0 2 rows 34 vs 62 µs, Q4_0 8 rows 52 vs 65).
  const bool legacy = a.type == DType::Q8_0 || a.type == DType::Q4_0;
  return a.n >= (legacy ? std::max(opt_.mmq_min_rows, 9) : opt_.mmq_min_rows);
}

void CudaBackend::mmq(const cuda::MatmulArgs& args, bool x_quantized, void* xs) {
  cuda::MatmulArgs a = args;
  // The staged kernel holds a superblock of weights in registers beside its stage: at 2 rows (one n8 tile)
  // it lost to the global-memory kernel (2026-12-04, H200: Q4_K 151936×4096 204.6 vs 169.5 µs; qwen3-8b
  // 2-row forward 5.08 vs 4.96 ms) and won from 4 rows (5.05 vs 5.17 ms).
  a.mmq_staged = a.mmq_staged && a.n >= 3;
  if (!xs) xs = scratch(kSlotQ8, cuda::gemv_fast_scratch_bytes(a));
  const size_t pb = cuda::mmq_part_bytes(a, n_sm_);
  cuda::mmq(a, xs, pb ? scratch(kSlotMmqPart, pb) : nullptr, n_sm_, as_stream(stream_), x_quantized);
}

void CudaBackend::mmq_group(const cuda::MatmulArgs* const* args, int count, bool x_quantized, void* xs, int glu) {
  if (count == 1 && glu < 0) return mmq(*args[0], x_quantized, xs);
  cuda::MatmulArgs a[4];  // fixed storage: nothing allocated per step
  const cuda::MatmulArgs* ap[4];
  PG_CHECK(count >= 1 && count <= 4, "mmq_group: 1..4 products");
  for (int i = 0; i < count; ++i) {
    a[i] = *args[i];
    a[i].mmq_staged = a[i].mmq_staged && a[i].n >= 3;  // as mmq()
    ap[i] = &a[i];
  }
  if (!xs) xs = scratch(kSlotQ8, cuda::gemv_fast_scratch_bytes(a[0]));
  const size_t pb = cuda::mmq_multi_part_bytes(ap, count, n_sm_);
  cuda::mmq_multi(ap, count, xs, pb ? scratch(kSlotMmqPart, pb) : nullptr, n_sm_, as_stream(stream_), x_quantized, glu);
}

// ---- L2 weight prefetch (CudaOptions::l2_prefetch_mb) ------------------------------------------------

CudaBackend::PrefetchScope::PrefetchScope(CudaBackend* be, int64_t rows, const Tensor* const* w, int n) {
  if (be->opt_.l2_prefetch_mb <= 0 || be->opt_.profile) return;  // off (profiling: each op timed alone)
  if (!be->side_stream_) {
    if (be->capturing_) return;  // created outside a capture, on the first eager matmul with prefetch on
    be->prefetch_init();
  }
  be_ = be;
  if (be->prefetch_depth_++ > 0) return;  // nested in another matmul entry point: that one acts
  cuda::PrefetchSet s;
  for (int i = 0; i < n && s.n < cuda::PrefetchSet::kMax; ++i) {
    const auto it = be->weight_bytes_.find(w[i]->data);
    if (it == be->weight_bytes_.end()) continue;
    s.r[s.n++] = cuda::PrefetchRegion{w[i]->data, it->second};
  }
  const int slot = be->prefetch_plan_.read(s);
  if (!be->capturing_) {
    if (be->prefetch_clip_mb_ != be->opt_.l2_prefetch_mb) {  // set_options changed the budget
      // Every slot is rewritten: no earlier copy out of the mirror may still be pending (prefetch_flush).
      check(cudaStreamSynchronize(as_stream(be->stream_)), "prefetch budget change (synchronize)");
      check(cudaStreamSynchronize(as_stream(be->side_stream_)), "prefetch budget change (synchronize)");
      be->prefetch_clip_mb_ = be->opt_.l2_prefetch_mb;
      be->prefetch_plan_.touch_all();
    }
    if (be->prefetch_plan_.dirty()) be->prefetch_flush();
  }
  // Decode and verification sizes only: a prefill matmul is long enough to hide its own ramp.
  if (rows <= cuda::kMmqMaxRows) slot_ = slot;
}

CudaBackend::PrefetchScope::~PrefetchScope() {
  if (!be_) return;
  const bool outer = --be_->prefetch_depth_ == 0;
  if (!outer || slot_ < 0 || std::uncaught_exceptions() > 0) return;
  CudaBackend& be = *be_;
  try {
    // Main → side edge: the prefetch starts once this matmul's kernels are launched ahead of it (in a graph:
    // a branch node after them), and nothing on the main stream waits for it.
    check(cudaEventRecord(be.fork_event_, as_stream(be.stream_)), "cudaEventRecord (prefetch fork)");
    check(cudaStreamWaitEvent(as_stream(be.side_stream_), be.fork_event_, 0), "cudaStreamWaitEvent (prefetch fork)");
    if (be.capturing_) be.side_forked_in_capture_ = true;
    cuda::l2_prefetch(static_cast<const cuda::PrefetchDesc*>(be.prefetch_table_) + slot_, be.opt_.l2_prefetch_blocks, as_stream(be.side_stream_));
    ++be.prefetch_launches_;
  } catch (const std::exception&) {
    // A hint that could not be launched changes nothing; the launch error is not sticky.
    cudaGetLastError();
  }
}

void CudaBackend::prefetch_flush() {
  if (!prefetch_plan_.dirty()) return;
  // The side stream's queued prefetches read the table: the copies below wait for them (main waits on side).
  check(cudaEventRecord(join_event_, as_stream(side_stream_)), "cudaEventRecord (prefetch flush)");
  check(cudaStreamWaitEvent(as_stream(stream_), join_event_, 0), "cudaStreamWaitEvent (prefetch flush)");
  auto* mirror = static_cast<cuda::PrefetchDesc*>(prefetch_mirror_);
  auto* table = static_cast<cuda::PrefetchDesc*>(prefetch_table_);
  const size_t cap = static_cast<size_t>(std::max(0, opt_.l2_prefetch_mb)) << 20;
  prefetch_plan_.flush([&](int i, const cuda::PrefetchSet& next) {
    cuda::PrefetchRegion r[cuda::PrefetchSet::kMax];
    const int n = cuda::prefetch_clip(next, cap, r);
    cuda::PrefetchDesc& d = mirror[i];
    d = cuda::PrefetchDesc{};
    for (int k = 0; k < n; ++k) d.ptr[k] = r[k].ptr, d.bytes[k] = r[k].bytes;
    d.n = n;
    // An asynchronous copy from the pinned mirror is safe because a slot is only rewritten after the streams
    // were synchronized: between forgets (free) and budget changes, both of which synchronize first, a slot
    // changes once (empty -> learned; the plan's successors are sticky).
    check(cudaMemcpyAsync(table + i, &d, sizeof d, cudaMemcpyHostToDevice, as_stream(stream_)), "prefetch table upload");
  });
}

void CudaBackend::matmul(const Tensor& w, const Tensor& x, Tensor& y) {
  cuda::activate(device_);  // not the member: a matmul keeps the fuse_norm_quant record (cuda_backend.h)
  const Tensor* pw[1] = {&w};
  const PrefetchScope pf(this, x.rows(), pw, 1);
  norm_q8_written(y);
  const ProfScope prof(prof_active() ? this : nullptr, "matmul",
                       prof_active() ? std::string(dtype_name(w.type)) + " " + std::to_string(w.rows()) + "x" + std::to_string(w.cols()) +
                                           " n" + std::to_string(x.rows())
                                     : std::string());
  const cuda::MatmulArgs a = matmul_args(w, x, y);
  if (use_mmq(a)) {
    void* pq = norm_q8_for(a);
    return mmq(a, pq != nullptr, pq);
  }
  // Default mode, quantized weights without MMQ, up to 64 rows: the GEMV kernels (rows in groups of 8),
  // which keep the CPU's 8-bit activation rounding exactly; the FP16 GEMM would not (its rounding of the
  // activations flips 8-bit roundings downstream: logits 0.2 off the CPU on the tiny models).
  const bool q8_rows = !opt_.exact_f32 && a.n <= cuda::kMmqMaxRows && cuda::act_quant_mode(w.type) != cuda::kActNone;
  // The tensor-core GEMM works on K in steps of 32; other widths (tiny test models) take the GEMV.
  if (opt_.exact_f32 || q8_rows || a.n <= opt_.gemv_max_rows || !cuda::gemm_supported(w.type) || a.K % 32 != 0) {
    gemv(a);
  } else {
    cuda::MatmulArgs b = a;
    b.act_quant = cuda::act_quant_mode(w.type);
    gemm(b);
  }
}

void CudaBackend::gemm(const cuda::MatmulArgs& a) {
  void* xs = scratch(kSlotGemm, cuda::gemm_scratch_bytes(a.n, a.K));
  // exact_f32 never reaches here (matmul sends it to the GEMV); MoE's grouped GEMM calls cuda::gemm itself.
  if (opt_.gemm_cublas && !opt_.exact_f32 && a.n >= opt_.gemm_cublas_min_rows && cuda::gemm_cublas_supported(a) &&
      cuda::gemm_cublas_weight_bytes(a) <= (static_cast<size_t>(opt_.gemm_cublas_max_weight_mb) << 20)) {
    if (!cublas_) {
      // Host-side creation (the library's own setup) must not land inside a stream capture. The forwards that
      // are captured (≤ graph_max_rows ≤ 64 rows) were run eagerly first with the same shapes (model.cpp), so
      // the handle, the plans and both scratch buffers exist by then; like a scratch growth, this only fires
      // for a capture of a shape that never ran.
      PG_CHECK(!capturing_, "CUDA graph capture: the cuBLASLt handle would have to be created; run the step once before capturing it");
      cublas_ = cuda::cublas_gemm_create();
    }
    const size_t wb = cuda::gemm_cublas_weight_bytes(a);
    void* ws = wb ? scratch(kSlotGemmW, wb) : nullptr;
    void* lt_ws = scratch(kSlotCublasWs, cuda::kCublasWorkspaceBytes);
    if (cuda::gemm_cublas(*cublas_, a, xs, ws, lt_ws, cuda::kCublasWorkspaceBytes, as_stream(stream_))) {
      ++gemm_cublas_calls_;
      return;
    }
    // cuBLASLt offered no algorithm for this shape (nothing was launched): the tensor-core kernel below.
  }
  cuda::gemm(a, nullptr, nullptr, xs, as_stream(stream_));
}

void CudaBackend::matmul_shared(const Tensor& x, std::initializer_list<MatmulOut> outs) {
  cuda::activate(device_);  // not the member: a matmul keeps the fuse_norm_quant record (cuda_backend.h)
  const Tensor* pw[cuda::PrefetchSet::kMax];
  int npw = 0;
  for (const MatmulOut& o : outs)
    if (npw < cuda::PrefetchSet::kMax) pw[npw++] = o.w;
  const PrefetchScope pf(this, x.rows(), pw, npw);
  for (const MatmulOut& o : outs) norm_q8_written(*o.y);
  std::string prof_key;
  if (prof_active()) {
    for (const MatmulOut& o : outs)
      prof_key += std::string(prof_key.empty() ? "" : "+") + std::string(dtype_name(o.w->type)) + " " + std::to_string(o.w->rows()) + "x" +
                  std::to_string(o.w->cols());
    prof_key += " n" + std::to_string(x.rows());
  }
  const ProfScope prof(prof_active() ? this : nullptr, "matmul_shared", std::move(prof_key));
  if (opt_.exact_f32 || x.rows() > std::max(opt_.gemv_max_rows, cuda::kMmqMaxRows)) {
    for (const MatmulOut& o : outs) matmul(*o.w, x, *o.y);
    return;
  }
  if (x.rows() > opt_.gemv_max_rows || (opt_.mmq_min_rows > 0 && x.rows() >= opt_.mmq_min_rows)) {
    // MMQ rows: one quantization of x for every product that takes it (the scratch slot of the 8-bit
    // activations is sized by x alone, so it is not reallocated between the products); with mmq_group the
    // products that can share a launch (mmq_multi_compatible) take one, in the order of their first.
    constexpr size_t kMaxOuts = 8;
    const size_t n_out = outs.size();
    if (n_out > kMaxOuts) {
      for (const MatmulOut& o : outs) matmul(*o.w, x, *o.y);
      return;
    }
    cuda::MatmulArgs args[kMaxOuts];
    bool mq[kMaxOuts] = {}, done[kMaxOuts] = {};
    {
      size_t k = 0;
      for (const MatmulOut& o : outs) {
        args[k] = matmul_args(*o.w, x, *o.y);
        mq[k] = use_mmq(args[k]);
        ++k;
      }
    }
    int quantized = cuda::kActNone;
    size_t k = 0;
    for (const MatmulOut& o : outs) {
      const size_t i = k++;
      if (done[i]) continue;
      done[i] = true;
      if (!mq[i]) {
        matmul(*o.w, x, *o.y);
        quantized = cuda::kActNone;  // matmul may have used the scratch for its own quantization
        continue;
      }
      const cuda::MatmulArgs* group[4] = {&args[i]};
      int count = 1;
      for (size_t j = i + 1; opt_.mmq_group && j < n_out && count < 4; ++j)
        if (!done[j] && mq[j] && cuda::mmq_multi_compatible(args[i], args[j], n_sm_)) group[count++] = &args[j], done[j] = true;
      if (void* pq = norm_q8_for(args[i])) {  // fuse_norm_quant: the norm quantized x (kSlotQ8 untouched)
        mmq_group(group, count, true, pq);
        continue;
      }
      const int mode = cuda::act_quant_mode(args[i].type);
      mmq_group(group, count, quantized == mode, nullptr);
      quantized = mode;
    }
    return;
  }
  // Decode: the 8-bit activations are made once and serve every product that reads them with the same
  // rounding (q8_0 or q8_K: weights of different families re-quantize).
  int quantized = cuda::kActNone;
  constexpr size_t kMaxGrouped = 8;
  if (opt_.fuse_qkv && x.rows() == 1 && outs.size() > 1 && outs.size() <= kMaxGrouped) {
    // Grouped: the products of one 8-bit-activation type in one launch (cuda::gemv_multi), groups in the
    // order of their first product; the rest one launch each. Same per-row sums as the loop below. Fixed
    // arrays: nothing is allocated on the decode path.
    cuda::MatmulArgs args[kMaxGrouped];
    bool done[kMaxGrouped] = {};
    const cuda::MatmulArgs* group[kMaxGrouped];
    const size_t n_out = outs.size();
    {
      size_t k = 0;
      for (const MatmulOut& o : outs) args[k++] = matmul_args(*o.w, x, *o.y);
    }
    for (size_t i = 0; i < n_out; ++i) {
      if (done[i]) continue;
      done[i] = true;
      if (!cuda::gemv_fast_q8(args[i]) || !cuda::gemv_multi_compatible(args[i], args[i])) {
        gemv(args[i]);
        quantized = cuda::kActNone;  // gemv may have used the scratch for its own quantization
        continue;
      }
      int count = 0;
      group[count++] = &args[i];
      for (size_t j = i + 1; j < n_out; ++j)
        if (!done[j] && cuda::gemv_multi_compatible(args[i], args[j])) group[count++] = &args[j], done[j] = true;
      void* s = norm_q8_for(args[i]);  // fuse_norm_quant: the norm quantized x (kSlotQ8 untouched)
      if (!s) {
        s = scratch(kSlotQ8, cuda::gemv_fast_scratch_bytes(args[i]));
        const int mode = cuda::act_quant_mode(args[i].type);
        if (quantized != mode) cuda::quantize_q8(args[i], s, as_stream(stream_));
        quantized = mode;
      }
      if (count == 1)
        cuda::gemv_fast(args[i], s, as_stream(stream_), /*x_quantized=*/true);
      else
        cuda::gemv_multi(group, count, s, as_stream(stream_), /*x_quantized=*/true);
    }
    return;
  }
  for (const MatmulOut& o : outs) {
    const cuda::MatmulArgs a = matmul_args(*o.w, x, *o.y);
    if (cuda::gemv_fast_q8(a)) {
      void* s = norm_q8_for(a);  // fuse_norm_quant: the norm quantized x (kSlotQ8 untouched)
      if (!s) {
        s = scratch(kSlotQ8, cuda::gemv_fast_scratch_bytes(a));
        const int mode = cuda::act_quant_mode(a.type);
        if (quantized != mode) cuda::quantize_q8(a, s, as_stream(stream_));
        quantized = mode;
      }
      cuda::gemv_fast(a, s, as_stream(stream_), /*x_quantized=*/true);
    } else {
      gemv(a);
    }
  }
}

void CudaBackend::matmul_glu(const Tensor& x, const Tensor& gate_w, const Tensor& up_w, Activation act, Tensor& y, Tensor& u) {
  const Tensor* pw[2] = {&gate_w, &up_w};
  const PrefetchScope pf(this, x.rows(), pw, 2);
  // The fused kernel only where the composition would run the one-row 8-bit GEMV on both products (one
  // row, default mode, no MMQ for one row, 32 lanes): there it is bit-identical; everything else is the
  // composition itself.
  if (!opt_.exact_f32 && opt_.fuse_glu && opt_.mmq_group && x.rows() >= 2 && x.rows() <= cuda::kMmqMaxRows) {
    // MMQ rows: gate and up in one launch, the GLU in its split-K reduce (bit-identical to the composition:
    // the same per-product sums, then the glu op's expression). Otherwise the composition.
    cuda::activate(device_);  // not the member: a matmul keeps the fuse_norm_quant record (cuda_backend.h)
    norm_q8_written(y);
    norm_q8_written(u);
    const cuda::MatmulArgs g = matmul_args(gate_w, x, y), uo = matmul_args(up_w, x, u);
    if (use_mmq(g) && use_mmq(uo) && cuda::mmq_multi_compatible(g, uo, n_sm_) && cuda::mmq_splits(g, n_sm_) > 1 && g.M == uo.M &&
        y.data != x.data && u.data != x.data && y.data != u.data) {
      const ProfScope prof(prof_active() ? this : nullptr, "matmul_glu",
                           prof_active() ? std::string(dtype_name(gate_w.type)) + " " + std::to_string(gate_w.rows()) + "x" +
                                               std::to_string(gate_w.cols()) + " n" + std::to_string(x.rows())
                                         : std::string());
      const cuda::MatmulArgs* group[2] = {&g, &uo};
      void* pq = norm_q8_for(g);  // fuse_norm_quant: the norm quantized x
      mmq_group(group, 2, pq != nullptr, pq, act == Activation::Silu ? 0 : 1);
      return;
    }
    return Backend::matmul_glu(x, gate_w, up_w, act, y, u);
  }
  if (!opt_.fuse_glu || opt_.exact_f32 || x.rows() != 1 || opt_.mmq_min_rows == 1) return Backend::matmul_glu(x, gate_w, up_w, act, y, u);
  cuda::activate(device_);  // not the member: a matmul keeps the fuse_norm_quant record (cuda_backend.h)
  norm_q8_written(y);
  norm_q8_written(u);
  const cuda::MatmulArgs g = matmul_args(gate_w, x, y), uo = matmul_args(up_w, x, u);
  if (!cuda::gemv_glu_supported(g, uo)) return Backend::matmul_glu(x, gate_w, up_w, act, y, u);
  PG_CHECK(y.data != x.data && y.data != u.data, "matmul_glu: y must not alias x or u");
  const ProfScope prof(prof_active() ? this : nullptr, "matmul_glu",
                       prof_active() ? std::string(dtype_name(gate_w.type)) + " " + std::to_string(gate_w.rows()) + "x" +
                                           std::to_string(gate_w.cols()) + " n1"
                                     : std::string());
  if (void* pq = norm_q8_for(g)) {  // fuse_norm_quant: the norm quantized x
    cuda::gemv_glu(g, uo, act == Activation::Silu ? 0 : 1, pq, as_stream(stream_), /*x_quantized=*/true);
    return;
  }
  void* s = scratch(kSlotQ8, cuda::gemv_fast_scratch_bytes(g));
  cuda::gemv_glu(g, uo, act == Activation::Silu ? 0 : 1, s, as_stream(stream_));
}

void CudaBackend::add_bias(Tensor& y, const Tensor& bias) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(y, "add_bias");
  check_own(bias, "add_bias");
  PG_CHECK(bias.type == DType::F32 || bias.type == DType::F16, "add_bias: bias must be F32 or F16");
  PG_CHECK(bias.n_elements() >= y.cols(), "add_bias: bias shorter than the rows");
  cuda::add_bias(y.as<float>(), bias.data, bias.type == DType::F16, y.rows(), y.cols(), as_stream(stream_));
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, Tensor& y, float eps) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "rms_norm");
  check_own(y, "rms_norm");
  check_f32(x, "rms_norm");
  check_f32(y, "rms_norm");
  PG_CHECK(x.cols() == y.cols() && x.rows() == y.rows(), "rms_norm: shape mismatch");
  if (w.valid()) {
    check_own(w, "rms_norm");
    PG_CHECK(w.type == DType::F32 || w.type == DType::F16, "rms_norm: weight must be F32 or F16");
  }
  cuda::NormQuant nq;
  const cuda::NormQuant* q = norm_q8_begin(y, nq);  // fuse_norm_quant: y's 8-bit activations too
  cuda::rms_norm(x.as<float>(), w.valid() ? w.data : nullptr, w.type == DType::F16, y.as<float>(), x.rows(), x.cols(), eps,
                 as_stream(stream_), q);
}

void CudaBackend::add_rms_norm(Tensor& x, const Tensor& r, const Tensor& w, Tensor& y, float eps) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "add_rms_norm");
  check_own(r, "add_rms_norm");
  check_own(y, "add_rms_norm");
  check_f32(x, "add_rms_norm");
  check_f32(r, "add_rms_norm");
  check_f32(y, "add_rms_norm");
  PG_CHECK(x.cols() == y.cols() && x.rows() == y.rows() && x.cols() == r.cols() && x.rows() == r.rows(), "add_rms_norm: shape mismatch");
  PG_CHECK(y.data != r.data, "add_rms_norm: y must not alias r");
  if (w.valid()) {
    check_own(w, "add_rms_norm");
    PG_CHECK(w.type == DType::F32 || w.type == DType::F16, "add_rms_norm: weight must be F32 or F16");
  }
  cuda::NormQuant nq;
  const cuda::NormQuant* q = norm_q8_begin(y, nq);  // fuse_norm_quant: y's 8-bit activations too
  cuda::add_rms_norm(x.as<float>(), r.as<float>(), w.valid() ? w.data : nullptr, w.type == DType::F16, y.as<float>(), x.rows(), x.cols(),
                     eps, as_stream(stream_), q);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& y) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(a, "add");
  check_own(b, "add");
  check_own(y, "add");
  PG_CHECK(a.n_elements() == b.n_elements() && a.n_elements() == y.n_elements(), "add: shape mismatch");
  cuda::add(a.as<float>(), b.as<float>(), y.as<float>(), a.n_elements(), as_stream(stream_));
}

void CudaBackend::scale(Tensor& x, float s) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "scale");
  cuda::scale(x.as<float>(), s, x.n_elements(), as_stream(stream_));
}

void CudaBackend::glu(const Tensor& gate, const Tensor& up, Tensor& y, Activation act) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(gate, "glu");
  check_own(up, "glu");
  check_own(y, "glu");
  PG_CHECK(gate.n_elements() == up.n_elements() && gate.n_elements() == y.n_elements(), "glu: shape mismatch");
  cuda::glu(gate.as<float>(), up.as<float>(), y.as<float>(), gate.n_elements(), act == Activation::Silu ? 0 : 1, as_stream(stream_));
}

void CudaBackend::rope(Tensor& x, const Tensor& pos, int n_heads, int head_dim, int n_rot, float base, RopeStyle style) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "rope");
  check_own(pos, "rope");
  PG_CHECK(n_rot >= 0 && n_rot <= head_dim && n_rot % 2 == 0, "rope: invalid n_rot");
  PG_CHECK(static_cast<int64_t>(n_heads) * head_dim <= x.cols(), "rope: heads exceed the row");
  // The same float expression as CpuBackend::rope, evaluated on the host, so both use one θ scale.
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));
  cuda::rope(x.as<float>(), x.cols(), pos.as<int32_t>(), static_cast<int>(x.rows()), n_heads, head_dim, n_rot, theta_scale,
             style == RopeStyle::Neox, as_stream(stream_));
}

void CudaBackend::qk_norm_rope(Tensor& q, Tensor& k, const Tensor& q_norm, const Tensor& k_norm, const Tensor& pos, int n_head,
                               int n_head_kv, int head_dim, int n_rot, float base, RopeStyle style, float eps) {
  // The fused kernel takes: heads of ≤ 256 (a head's norm is one warp, as rms_norm's launch for rows below 512),
  // F32/F16 norm weights of at least head_dim values, q and k with the same rows, rows that are exactly the heads
  // when normalised (the (n*heads, head_dim) view of the four-op form needs that). Anything else: the four ops.
  auto weight_ok = [&](const Tensor& w) {
    return !w.valid() || ((w.type == DType::F32 || w.type == DType::F16) && w.n_elements() >= head_dim);
  };
  const bool fits = opt_.fuse_qk_norm_rope && head_dim > 0 && head_dim <= cuda::kQkNormRopeMaxHeadDim && n_rot >= 0 &&
                    n_rot <= head_dim && n_rot % 2 == 0 && q.rows() == k.rows() && q.type == DType::F32 && k.type == DType::F32 &&
                    q.data != k.data && weight_ok(q_norm) && weight_ok(k_norm) &&
                    (q_norm.valid() ? q.cols() == static_cast<int64_t>(n_head) * head_dim : q.cols() >= static_cast<int64_t>(n_head) * head_dim) &&
                    (k_norm.valid() ? k.cols() == static_cast<int64_t>(n_head_kv) * head_dim
                                    : k.cols() >= static_cast<int64_t>(n_head_kv) * head_dim);
  if (!fits) {
    Backend::qk_norm_rope(q, k, q_norm, k_norm, pos, n_head, n_head_kv, head_dim, n_rot, base, style, eps);
    return;
  }
  if (!q_norm.valid() && !k_norm.valid() && n_rot < 2) return;  // nothing to do (rope of n_rot 0 is a no-op)
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(q, "qk_norm_rope");
  check_own(k, "qk_norm_rope");
  check_own(pos, "qk_norm_rope");
  if (q_norm.valid()) check_own(q_norm, "qk_norm_rope");
  if (k_norm.valid()) check_own(k_norm, "qk_norm_rope");
  // The same float expression as CudaBackend::rope (and CpuBackend::rope), so all use one θ scale.
  const float theta_scale = n_rot > 0 ? std::pow(base, -2.0f / static_cast<float>(n_rot)) : 1.0f;
  cuda::qk_norm_rope(q.as<float>(), q.cols(), k.as<float>(), k.cols(), q_norm.valid() ? q_norm.data : nullptr, q_norm.type == DType::F16,
                     k_norm.valid() ? k_norm.data : nullptr, k_norm.type == DType::F16, pos.as<int32_t>(), static_cast<int>(q.rows()),
                     n_head, n_head_kv, head_dim, n_rot, theta_scale, style == RopeStyle::Neox, eps, as_stream(stream_));
}

bool CudaBackend::supports_kv_type(DType t) const { return is_kv_type(t); }

namespace {
// The original F32/F16 kernels serve caches whose K and V are both F32 or both F16; every other pair of
// KV types takes the typed store and attention (kv_quant.cu, attention.cu's attn_kvq_kernel).
bool plain_kv_pair(const KvLayer& kv) { return kv.k.type == kv.v.type && (kv.k.type == DType::F16 || kv.k.type == DType::F32); }
// Head count and head sizes of a typed cache (KvLayer's 0 = "the row is one head", as the CPU backend reads it).
void typed_kv_shape(const KvLayer& kv, int64_t k_cols, int& n_head_kv, int& head_dim, int& head_dim_v) {
  n_head_kv = kv.n_head_kv > 0 ? kv.n_head_kv : 1;
  head_dim = kv.head_dim > 0 ? kv.head_dim : static_cast<int>(k_cols / n_head_kv);
  head_dim_v = kv.head_dim_v > 0 ? kv.head_dim_v : head_dim;
}
}  // namespace

void CudaBackend::kv_store(KvLayer& kv, const Tensor& k, const Tensor& v, const AttentionBatch& batch) {
  activate(device_);
  const ProfScope prof(prof_active() ? this : nullptr, "kv_store",
                       prof_active() ? std::string(dtype_name(kv.k.type)) + "/" + std::string(dtype_name(kv.v.type)) : std::string());
  check_own(kv.k, "kv_store");
  check_own(kv.v, "kv_store");
  check_own(k, "kv_store");
  check_own(v, "kv_store");
  check_own(batch.cells, "kv_store");
  if (!plain_kv_pair(kv)) {
    int nh = 0, hd = 0, hd_v = 0;
    typed_kv_shape(kv, k.cols(), nh, hd, hd_v);
    check_kv_types(kv.k.type, kv.v.type, std::max(hd, hd_v));
    PG_CHECK(k.type == DType::F32 && v.type == DType::F32, "kv_store: K/V rows must be F32");
    PG_CHECK(k.cols() == static_cast<int64_t>(nh) * hd && v.cols() == static_cast<int64_t>(nh) * hd_v && k.rows() >= batch.n_tokens &&
                 v.rows() >= batch.n_tokens,
             "kv_store: K/V rows are not (n_tokens, n_head_kv·head_dim)");
    PG_CHECK(kv.k.row_bytes() == kv_row_bytes(kv.k.type, nh, hd) && kv.v.row_bytes() == kv_row_bytes(kv.v.type, nh, hd_v),
             "kv_store: cache rows do not hold n_head_kv heads of the cache type's layout");
    cuda::KvStoreArgs a;
    a.k_type = kv.k.type;
    a.v_type = kv.v.type;
    a.k_cache = kv.k.data;
    a.v_cache = kv.v.data;
    a.k_row_bytes = kv.k.row_bytes();
    a.v_row_bytes = kv.v.row_bytes();
    a.k_cells = kv.k.rows();
    a.v_cells = kv.v.rows();
    a.k = k.as<float>();
    a.v = v.as<float>();
    a.k_stride = k.cols();
    a.v_stride = v.cols();
    a.n_head_kv = nh;
    a.head_dim = hd;
    a.head_dim_v = hd_v;
    a.cells = batch.cells.as<int32_t>();
    a.n = batch.n_tokens;
    a.parallel = opt_.kv_store_parallel;
    cuda::kv_store_typed(a, as_stream(stream_));
    return;
  }
  PG_CHECK(kv.k.type == kv.v.type && (kv.k.type == DType::F16 || kv.k.type == DType::F32), "kv_store: cache must be F16 or F32");
  PG_CHECK(k.cols() == kv.k.cols() && v.cols() == kv.v.cols(), "kv_store: row width mismatch");
  cuda::kv_store(kv.k.data, kv.v.data, kv.k.type == DType::F16, k.as<float>(), v.as<float>(), k.cols(), v.cols(),
                 batch.cells.as<int32_t>(), batch.n_tokens, as_stream(stream_));
}

// Typed KV types for which the tensor-core kernel beats attention.cu's typed SIMT kernel at decode shapes
// (H200, pg_cuda_attn_bench, 32 q / 8 kv heads × 128, 1 row at depth 4096): q8_0 0.055 vs 0.065 ms — yes;
// tq3_0 0.078 vs 0.065 ms — no (its per-tile block decode plus the query / output rotation costs more than
// the tensor cores save when only 8 of 64 MMA rows carry a query). Types not measured stay on attention.cu
// until a device run shows a win. (F16/F16 is not typed: always taken with fa_decode.)
namespace {
bool fa_decode_type_wins(DType t) { return t == DType::Q8_0 || t == DType::F16; }
}  // namespace

void CudaBackend::attention(const Tensor& q, const KvLayer& kv, const AttentionBatch& batch, const AttentionParams& p, Tensor& out) {
  activate(device_);
  const ProfScope prof(prof_active() ? this : nullptr, "attention",
                       prof_active() ? std::string(dtype_name(kv.k.type)) + "/" + std::string(dtype_name(kv.v.type)) + " n" +
                                           std::to_string(batch.n_tokens) + (batch.tree_mask.valid() ? " tree" : "")
                                     : std::string());
  check_own(q, "attention");
  check_own(kv.k, "attention");
  check_own(kv.v, "attention");
  check_own(out, "attention");
  check_own(batch.positions, "attention");
  check_own(batch.seq, "attention");
  check_own(batch.block_table, "attention");
  const bool typed = !plain_kv_pair(kv);
  if (typed) {
    PG_CHECK(kv.head_dim_v <= 0 || kv.head_dim_v == p.head_dim,
             "attention: a V head size other than the K head size is not supported on CUDA (" + std::to_string(kv.head_dim_v) + " vs " +
                 std::to_string(p.head_dim) + ")");
    PG_CHECK(kv.k.row_bytes() == kv_row_bytes(kv.k.type, p.n_head_kv, p.head_dim) &&
                 kv.v.row_bytes() == kv_row_bytes(kv.v.type, p.n_head_kv, p.head_dim),
             "attention: cache rows do not hold n_head_kv heads of head_dim in the cache types' layout");
  } else {
    PG_CHECK(kv.k.cols() == static_cast<int64_t>(p.n_head_kv) * p.head_dim && kv.v.cols() == kv.k.cols(),
             "attention: cache row width != n_head_kv·head_dim");
  }
  PG_CHECK(q.cols() >= static_cast<int64_t>(p.n_head) * p.head_dim && out.cols() >= static_cast<int64_t>(p.n_head) * p.head_dim,
           "attention: q/out narrower than n_head·head_dim");
  PG_CHECK(batch.block_size > 0 && batch.max_blocks > 0, "attention: invalid block table");
  cuda::AttentionArgs a;
  a.q = q.as<float>();
  a.q_stride = q.cols();
  a.k = kv.k.data;
  a.v = kv.v.data;
  a.kv_f16 = kv.k.type == DType::F16;
  a.typed = typed;
  a.k_type = kv.k.type;
  a.v_type = kv.v.type;
  a.k_row_bytes = kv.k.row_bytes();
  a.v_row_bytes = kv.v.row_bytes();
  a.positions = batch.positions.as<int32_t>();
  a.seq = batch.seq.as<int32_t>();
  a.block_table = batch.block_table.as<int32_t>();
  a.block_size = batch.block_size;
  a.max_blocks = batch.max_blocks;
  a.n = batch.n_tokens;
  a.max_kv_len = batch.max_kv_len;
  a.n_head = p.n_head;
  a.n_head_kv = p.n_head_kv;
  a.head_dim = p.head_dim;
  a.scale = p.scale;
  a.sliding_window = p.sliding_window;
  a.softcap = p.logit_softcap;
  a.out = out.as<float>();
  a.out_stride = out.cols();
  a.kv_capacity = attn_kv_capacity_;
  a.fa_blocks_per_sm = opt_.fa_blocks_per_sm;
  if (opt_.fa_prefill_min_rows <= 0 || batch.n_tokens < opt_.fa_prefill_min_rows) a.fa_min_split_keys = opt_.fa_decode_min_split_keys;
  if (opt_.fa_fused_combine) a.fa_counters = fa_counters_, a.fa_counters_len = kFaCounters;
  if (batch.tree_mask.valid()) {
    check_own(batch.tree_mask, "attention");
    check_own(batch.kv_len, "attention");
    PG_CHECK(batch.tree_mask.type == DType::I32 && batch.kv_len.type == DType::I32 &&
                 batch.tree_mask.n_elements() >= static_cast<int64_t>(batch.n_tokens) * kTreeMaskWords &&
                 batch.kv_len.n_elements() >= batch.n_tokens,
             "attention: tree_mask must be I32 (n_tokens, kTreeMaskWords) and kv_len I32 (n_tokens)");
    a.kv_len = batch.kv_len.as<int32_t>();
    a.tree_mask = static_cast<const uint32_t*>(batch.tree_mask.data);
  }
  // Prefill batches on tensor cores (attention_prefill.cu) when enabled and the shape is one it takes.
  // Not in exact mode (a validation mode: FP32 arithmetic throughout; this kernel rounds q and p to FP16).
  // Typed caches with fa_prefill_typed (on by default). Decode / verification
  // calls (fewer rows than fa_prefill_min_rows) and every tree batch only with fa_decode, and typed caches
  // there only for the types where the tensor-core kernel wins at decode shapes (fa_decode_type_wins).
  // Decode / short verification calls (≤ 8 rows; f16 and the typed pairs of attention_decode_supported: K and V
  // each F16 or Q8_0, K = V q4_0/q4_1/q5_0/q5_1/tq3_0/bf16, F16 K with a low-bit V; typed ones only with
  // fa_vec_typed) on the SIMT flash-decoding kernel when fa_vec is on (attention_decode.cu; trees included),
  // before the tensor-core route. Not in exact mode (validation: the FP32 kernel's own summation order).
  a.fa_vec_blocks_per_sm = opt_.fa_vec_blocks_per_sm;
  a.fa_vec_min_chunk = opt_.fa_vec_min_chunk;
  a.fa_vec_stages = opt_.fa_vec_stages;
  if (!opt_.exact_f32 && opt_.fa_vec && (!a.typed || opt_.fa_vec_typed) && a.n <= opt_.fa_vec_max_rows && a.head_dim <= opt_.fa_vec_max_head_dim &&
      cuda::attention_decode_supported(a)) {
    const size_t vb = cuda::attention_decode_scratch_bytes(a, n_sm_);
    cuda::attention_decode(a, vb ? scratch(kSlotAttention, vb) : nullptr, n_sm_, as_stream(stream_));
    return;
  }
  const bool prefill_rows = opt_.fa_prefill_min_rows > 0 && a.n >= opt_.fa_prefill_min_rows && a.tree_mask == nullptr;
  const bool fa_route = prefill_rows ? (!a.typed || opt_.fa_prefill_typed)
                                     : opt_.fa_decode && (!a.typed || (opt_.fa_prefill_typed && fa_decode_type_wins(a.k_type) &&
                                                                       fa_decode_type_wins(a.v_type)));
  if (!opt_.exact_f32 && fa_route && cuda::attention_prefill_supported(a)) {
    const size_t fb = cuda::attention_prefill_scratch_bytes(a, n_sm_);
    cuda::attention_prefill(a, fb ? scratch(kSlotAttention, fb) : nullptr, n_sm_, as_stream(stream_));
    return;
  }
  const size_t sb = cuda::attention_scratch_bytes(a, n_sm_);
  void* s = sb ? scratch(kSlotAttention, sb) : nullptr;
  cuda::attention(a, s, n_sm_, as_stream(stream_));
}

void CudaBackend::mul_sigmoid(Tensor& x, const Tensor& gate) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "mul_sigmoid");
  check_own(gate, "mul_sigmoid");
  PG_CHECK(x.n_elements() == gate.n_elements(), "mul_sigmoid: shape mismatch");
  cuda::mul_sigmoid(x.as<float>(), gate.as<float>(), x.n_elements(), as_stream(stream_));
}

void CudaBackend::softcap(Tensor& x, float cap) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "softcap");
  PG_CHECK(cap > 0.0f, "softcap: cap must be positive");
  cuda::softcap(x.as<float>(), cap, x.n_elements(), as_stream(stream_));
}

void CudaBackend::argmax_rows(const Tensor& x, Tensor& ids) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "argmax_rows");
  check_own(ids, "argmax_rows");
  check_f32(x, "argmax_rows");
  PG_CHECK(ids.type == DType::I32 && ids.n_elements() >= x.rows(), "argmax_rows: ids must be I32 with one entry per row");
  cuda::argmax_rows(x.as<float>(), x.rows(), x.cols(), ids.as<int32_t>(), as_stream(stream_));
}

void CudaBackend::topk_rows(const Tensor& x, int k, Tensor& ids, Tensor& logprobs) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(x, "topk_rows");
  check_own(ids, "topk_rows");
  check_own(logprobs, "topk_rows");
  PG_CHECK(x.type == DType::F32 && ids.type == DType::I32 && logprobs.type == DType::F32, "topk_rows: types");
  PG_CHECK(k >= 1 && k <= 64 && k <= x.cols() && ids.n_elements() >= x.rows() * k && logprobs.n_elements() >= x.rows() * k,
           "topk_rows: shape mismatch");
  cuda::topk_rows(x.as<float>(), x.rows(), x.cols(), k, ids.as<int32_t>(), logprobs.as<float>(), as_stream(stream_));
}

void CudaBackend::kv_copy(KvLayer& kv, const Tensor& src_cells, const Tensor& dst_cells) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(kv.k, "kv_copy");
  check_own(kv.v, "kv_copy");
  check_own(src_cells, "kv_copy");
  check_own(dst_cells, "kv_copy");
  PG_CHECK(src_cells.type == DType::I32 && dst_cells.type == DType::I32, "kv_copy: cell lists must be I32");
  PG_CHECK(src_cells.n_elements() == dst_cells.n_elements(), "kv_copy: src and dst lengths differ");
  PG_CHECK(kv.k.rows() == kv.v.rows(), "kv_copy: K and V caches have different cell counts");
  // The cell values live on the device: out-of-range entries are skipped there, not reported.
  cuda::kv_copy(kv.k.data, kv.v.data, kv.k.row_bytes(), kv.v.row_bytes(), kv.k.rows(), src_cells.as<int32_t>(), dst_cells.as<int32_t>(),
                static_cast<int>(src_cells.n_elements()), as_stream(stream_));
}

void CudaBackend::gather_cols(const Tensor& src, int group, int col0, Tensor& dst) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(src, "gather_cols");
  check_own(dst, "gather_cols");
  PG_CHECK(group > 0 && src.cols() % group == 0, "gather_cols: source width is not a multiple of the group");
  const int64_t groups = src.cols() / group;
  PG_CHECK(dst.cols() % groups == 0 && col0 >= 0 && col0 + dst.cols() / groups <= group && dst.rows() == src.rows(),
           "gather_cols: shape mismatch");
  cuda::gather_cols(src.as<float>(), src.cols(), group, col0, dst.as<float>(), dst.cols(), src.rows(), as_stream(stream_));
}

void CudaBackend::moe_route(const Tensor& logits, int k, ExpertGating gating, bool norm, float scale, Tensor& ids, Tensor& weights) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  check_own(logits, "moe_route");
  check_own(ids, "moe_route");
  check_own(weights, "moe_route");
  PG_CHECK(ids.cols() == k && weights.cols() == k && ids.rows() == logits.rows() && weights.rows() == logits.rows(),
           "moe_route: output shape mismatch");
  cuda::moe_route(logits.as<float>(), static_cast<int>(logits.rows()), static_cast<int>(logits.cols()), k,
                  gating == ExpertGating::Sigmoid, norm, scale, ids.as<int32_t>(), weights.as<float>(), as_stream(stream_));
}

void CudaBackend::moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_exps, const Tensor& up_exps,
                          const Tensor& down_exps, Activation act, Tensor& out) {
  activate(device_);
  const ProfScope prof = profile_op(__func__);
  const bool fused = !up_exps.valid();  // gate_exps holds [gate; up] per expert
  for (const Tensor* t : {&x, &ids, &weights, &gate_exps, &down_exps, static_cast<const Tensor*>(&out)}) check_own(*t, "moe_ffn");
  if (!fused) check_own(up_exps, "moe_ffn");
  const int64_t n = x.rows(), d = x.cols(), k = ids.cols(), n_exp = gate_exps.ne[2];
  const int64_t ff = fused ? gate_exps.ne[1] / 2 : gate_exps.ne[1];
  PG_CHECK(!fused || gate_exps.ne[1] % 2 == 0, "moe_ffn: fused gate_up experts need an even row count");
  PG_CHECK(gate_exps.ne[0] == d && down_exps.ne[0] == ff && down_exps.ne[1] == d && down_exps.ne[2] == n_exp &&
               (fused || (up_exps.ne[0] == d && up_exps.ne[1] == ff && up_exps.ne[2] == n_exp && gate_exps.type == up_exps.type)),
           "moe_ffn: expert tensor shapes do not match");
  PG_CHECK(ids.rows() == n && weights.rows() == n && weights.cols() == k && out.cols() == d && out.rows() == n,
           "moe_ffn: shape mismatch");
  if (n == 0) return;
  // Per expert: gate rows at gate_exps + e·expert_bytes, up rows at `up` + e·expert_bytes.
  struct Proj {
    DType type;
    const void* data;
    size_t row_bytes, expert_bytes;
  };
  const size_t gate_bytes = gate_exps.row_bytes() * static_cast<size_t>(fused ? 2 * ff : ff);
  const Proj up = fused ? Proj{gate_exps.type, static_cast<const uint8_t*>(gate_exps.data) + gate_exps.row_bytes() * static_cast<size_t>(ff),
                               gate_exps.row_bytes(), gate_bytes}
                        : Proj{up_exps.type, up_exps.data, up_exps.row_bytes(), up_exps.row_bytes() * static_cast<size_t>(ff)};
  const int64_t E = n * k;  // routed (token, expert) entries
  const size_t down_bytes = down_exps.row_bytes() * static_cast<size_t>(d);
  const bool grouped_gemm = !opt_.exact_f32 && n > opt_.gemv_max_rows && cuda::gemm_supported(gate_exps.type) &&
                            cuda::gemm_supported(down_exps.type) && d % 32 == 0 && ff % 32 == 0;
  const int max_tiles = grouped_gemm ? cuda::moe_max_tiles(static_cast<int>(E), static_cast<int>(n_exp)) : 0;
  // Scratch: G, U (E, ff), T (E, d) floats; sorted rows/entries (E) and tiles (3·max_tiles) ints.
  const size_t f_bytes = static_cast<size_t>(E) * static_cast<size_t>(2 * ff + d) * sizeof(float);
  const size_t i_bytes = (static_cast<size_t>(2 * E) + 3 * static_cast<size_t>(max_tiles)) * sizeof(int32_t);
  auto* base = static_cast<uint8_t*>(scratch(kSlotMoe, f_bytes + i_bytes));
  float* G = reinterpret_cast<float*>(base);
  float* U = G + E * ff;
  float* T = U + E * ff;
  auto* sorted_rows = reinterpret_cast<int32_t*>(base + f_bytes);
  int32_t* sorted_entry = sorted_rows + E;
  int32_t* tiles = sorted_entry + E;
  const cudaStream_t st = as_stream(stream_);

  // CudaOptions::moe_fused guard: the cases the grouped Launch<1> 8-bit GEMV would take for all three
  // products (so the fused kernels reproduce exactly what the default path computes).
  auto moe_fused_ok = [&](const Tensor& xx, const Tensor& g, const Proj& u, const Tensor& dn, int64_t dd, int64_t f, int64_t kk) {
    if (!opt_.moe_fused || opt_.exact_f32 || opt_.gemv_lanes != 32 || xx.rows() > 65535 || kk > 32 || n * kk > 65535) return false;
    if (!cuda::moe_fused_type(g.type) || !cuda::moe_fused_type(dn.type) || u.type != g.type) return false;
    cuda::MatmulArgs t;
    t.type = g.type, t.w = g.data, t.row_bytes = g.row_bytes(), t.K = dd, t.x = xx.as<float>(), t.x_stride = dd, t.expert_bytes = gate_bytes;
    if (!cuda::gemv_fast_q8(t)) return false;
    t.w = u.data, t.expert_bytes = u.expert_bytes;
    if (!cuda::gemv_fast_q8(t)) return false;
    t.type = dn.type, t.w = dn.data, t.row_bytes = dn.row_bytes(), t.K = f, t.x = G, t.x_stride = f, t.expert_bytes = down_bytes;
    return cuda::gemv_fast_q8(t);
  };
  auto mat = [&](const Tensor& w, const float* xp, int64_t K, int64_t M, float* yp, size_t expert_bytes) {
    cuda::MatmulArgs a;
    a.type = w.type;
    a.w = w.data;
    a.row_bytes = w.row_bytes();
    a.K = K;
    a.M = M;
    a.x = xp;
    a.x_stride = K;
    a.y = yp;
    a.y_stride = M;
    a.n = static_cast<int>(E);
    a.expert_bytes = expert_bytes;
    a.act_quant = opt_.exact_f32 ? cuda::kActNone : cuda::act_quant_mode(w.type);
    return a;
  };
  if (!grouped_gemm && moe_fused_ok(x, gate_exps, up, down_exps, d, ff, k)) {
    // CudaOptions::moe_fused: act_quant(x), gate+up+GLU, act_quant(G), down+combine (moe_gemv.cu).
    const bool pdl = opt_.pdl && pdl_capable_;
    const size_t xb = (cuda::q8_scratch_bytes(n, d) + 255) & ~size_t{255};
    auto* qs = static_cast<uint8_t*>(scratch(kSlotQ8, xb + cuda::q8_scratch_bytes(E, ff)));
    cuda::MatmulArgs a = mat(gate_exps, x.as<float>(), d, ff, G, gate_bytes);
    a.expert_ids = ids.as<int32_t>();
    a.x_div = static_cast<int>(k);
    cuda::quantize_q8(a, qs, st);  // n rows of x, gate's rounding (up has the same type)
    const cuda::Q8Scratch xs = cuda::q8_scratch(qs, n, d);
    cuda::MoeGateUpParams pg;
    pg.gate = static_cast<const uint8_t*>(gate_exps.data);
    pg.up = static_cast<const uint8_t*>(up.data);
    pg.row_bytes = gate_exps.row_bytes();
    pg.gate_expert_bytes = gate_bytes;
    pg.up_expert_bytes = up.expert_bytes;
    pg.ids = ids.as<int32_t>();
    pg.E = static_cast<int>(E);
    pg.k = static_cast<int>(k);
    pg.K = d;
    pg.ff = ff;
    pg.n_pieces = static_cast<int>(d / 32);
    pg.xq = xs.q;
    pg.xd = xs.d;
    pg.xs = xs.s;
    pg.G = G;
    cuda::moe_gate_up(gate_exps.type, pg, act == Activation::Silu ? 0 : 1, pdl, st);
    cuda::MatmulArgs b = mat(down_exps, G, ff, d, T, down_bytes);
    b.expert_ids = ids.as<int32_t>();
    b.x_div = 1;
    cuda::quantize_q8(b, qs + xb, st);  // E rows of G, down's rounding
    const cuda::Q8Scratch gsq = cuda::q8_scratch(qs + xb, E, ff);
    cuda::MoeDownParams pd;
    pd.down = static_cast<const uint8_t*>(down_exps.data);
    pd.row_bytes = down_exps.row_bytes();
    pd.expert_bytes = down_bytes;
    pd.ids = ids.as<int32_t>();
    pd.weights = weights.as<float>();
    pd.n = static_cast<int>(n);
    pd.k = static_cast<int>(k);
    pd.d = d;
    pd.ff = ff;
    pd.n_pieces = static_cast<int>(ff / 32);
    pd.gq = gsq.q;
    pd.gd = gsq.d;
    pd.gs = gsq.s;
    pd.out = out.as<float>();
    cuda::moe_down_combine(down_exps.type, pd, pdl, st);
    ++moe_fused_hits_;
    return;
  }
  if (!grouped_gemm) {
    // Decode-sized batches: one GEMV per routed entry, reading that entry's expert.
    cuda::MatmulArgs a = mat(gate_exps, x.as<float>(), d, ff, G, gate_bytes);
    a.expert_ids = ids.as<int32_t>();
    a.x_div = static_cast<int>(k);
    gemv(a);
    a.type = up.type;
    a.w = up.data;
    a.row_bytes = up.row_bytes;
    a.expert_bytes = up.expert_bytes;
    a.y = U;
    gemv(a);
    cuda::glu(G, U, G, E * ff, act == Activation::Silu ? 0 : 1, st);
    cuda::MatmulArgs b = mat(down_exps, G, ff, d, T, down_bytes);
    b.expert_ids = ids.as<int32_t>();
    b.x_div = 1;
    gemv(b);
  } else {
    // Prefill: entries grouped by expert, one grouped tensor-core GEMM per projection.
    cuda::moe_sort(ids.as<int32_t>(), static_cast<int>(E), static_cast<int>(k), static_cast<int>(n_exp), sorted_rows, sorted_entry, tiles,
                   max_tiles, nullptr, st);
    void* gs = scratch(kSlotMoeGemm, cuda::gemm_scratch_bytes(E, std::max(d, ff)));
    cuda::GemmGroups g{tiles, max_tiles, gate_bytes, nullptr};
    cuda::MatmulArgs a = mat(gate_exps, x.as<float>(), d, ff, G, gate_bytes);
    a.x_stride = d;
    cuda::gemm(a, &g, sorted_rows, gs, st);
    a.type = up.type;
    a.w = up.data;
    a.row_bytes = up.row_bytes;
    a.y = U;
    cuda::GemmGroups gu{tiles, max_tiles, up.expert_bytes, nullptr};
    cuda::gemm(a, &gu, sorted_rows, gs, st);
    cuda::glu(G, U, G, E * ff, act == Activation::Silu ? 0 : 1, st);
    cuda::GemmGroups gd{tiles, max_tiles, down_bytes, sorted_entry};
    cuda::MatmulArgs b = mat(down_exps, G, ff, d, T, down_bytes);
    cuda::gemm(b, &gd, nullptr, gs, st);
  }
  cuda::moe_combine(T, ids.as<int32_t>(), weights.as<float>(), static_cast<int>(n), static_cast<int>(k), d, out.as<float>(), st);
}

}  // namespace pg
