// Persistent, software-pipelined one-row decode GEMV (CudaOptions::gemv_pipe, issue 11). Included by
// gemv_q8.cu inside its anonymous namespace, after the weight-type structs (quant_dot.cuh), ActRows,
// rw2_sums, kMultiMax and glu_act: it reuses their dot() arithmetic unchanged.
//
// Why: the two-rows-per-warp kernel (gemv_q8_rw2_kernel) issues one round of 4 pieces × 2 rows of weight
// loads per lane into registers, waits the full DRAM latency, computes and exits; at 112 registers only
// 4 blocks fit per SM and a block's warps all wait at once (Nsight: 0.59 instructions per scheduler cycle,
// Q4_K at 1.2–1.5 TB/s on the 10–30 MB matrices of a decode step). Here the weight bytes in flight do not
// live in registers: each warp streams its rows through a ring of `stages` shared-memory slots with
// cp.async (16-byte units), `stages − 1` slots always in flight, and the warp never exits between rows, so
// the ring stays full across row boundaries. The grid is a fixed number of blocks per SM.
//
// Contract (gemv_pipe_kernel<T, MODE>):
//  - one activation row: p.xq (K) int8 and p.xd (K/32) FP32, the quantize_q8 output for T's rounding;
//    the block copies both into shared memory once (every row of the block reuses them).
//  - work unit ("task"): MODE kPipeRows: two adjacent rows of one of up to kMultiMax matrices w[j]
//    (M[j], row_bytes[j] bytes per row), task_end[j] = Σ_{i ≤ j} ceil(M_i / 2), the last task of a matrix
//    with one row when M_j is odd; y[j] (M[j]) receives x·W_jᵀ. MODE kPipeGluSilu / kPipeGluGelu: task i =
//    row i of gate w[0] and of up w_up (both row_bytes[0]); y[0] (M[0]) receives glu_act(g, u).
//  - warp gw of the grid (4 per block) owns tasks gw, gw + W, gw + 2W, … (W = warps in the grid): a static,
//    grid-size-independent assignment of whole rows to warps.
//  - a task is cut into rounds of 32 pieces (32 weights per piece, as in gemv_q8.cu): round k of a row =
//    the bytes of pieces [32k, 32k + 32), contiguous in the row. A ring slot holds one round of both rows
//    of a task (2 windows of kWin bytes: the round's bytes copied from their 16-byte-aligned start, so a
//    2-byte-aligned Q6_K / Q8_0 round keeps its address mod 16). Lane l consumes piece 32k + l of both
//    rows of round k from the slot, with the type's own dot() on the very bytes gemv_q8_rw2_kernel loads
//    into registers, in the same order (k ascending), then warp_sum: every output is bit-identical to
//    gemv_q8_rw2_kernel / gemv_q8_glu_kernel / gemv_q8_multi_kernel (and so to gemv_q8_kernel), for any
//    grid size, stage count, eager or graph replay.
//  - PDL as gemv_q8_rw2_kernel: the first stages - 1 rounds of weights are requested before grid_wait()
//    (weights are never written during a forward); activations are read and y written only after it;
//    every thread waits.
//  - no global memory is read outside the rows' bytes (the last 16-byte unit of a row's round is copied
//    with a source size that stops at the row's end, zero-filling the rest of the unit); the bytes between
//    a round's aligned-down start and its start belong to the previous row (the matrix base is 16-byte
//    aligned: pipe_supported checks it).
constexpr int kPipeRows = 0, kPipeGluSilu = 1, kPipeGluGelu = 2;
constexpr int kPipeMinStages = 2, kPipeMaxStages = 8;

struct PipeParams {
  const int8_t* xq;  // (K) quantized activations
  const float* xd;   // (K/32) their scales
  int n_pieces;      // K/32
  int64_t K;
  int stages;        // ring slots per warp, kPipeMinStages..kPipeMaxStages
  int count;         // matrices (kPipeRows), 1..kMultiMax
  const uint8_t* w[kMultiMax];   // (M_j, row_bytes_j) bytes; GLU: the gate
  size_t row_bytes[kMultiMax];
  int64_t M[kMultiMax];
  float* y[kMultiMax];           // (M_j)
  int64_t task_end[kMultiMax];   // cumulative tasks per matrix (kPipeRows)
  int64_t tasks;                 // all tasks
  const uint8_t* w_up;           // GLU: (M_0, row_bytes_0) the up matrix
};

// Bytes of one round (32 pieces) of a row of T, and the shared-memory window that holds it from its
// 16-byte-aligned start (≤ 15 bytes before it, and a funnel-shift reader's one word past the end).
template <class T>
constexpr int pipe_round_bytes() { return 32 * T::kBytes / T::kPieces; }
template <class T>
constexpr int pipe_window_bytes() { return 16 * ((pipe_round_bytes<T>() + 15 + 4 + 15) / 16); }

// cp.async of the 16-byte unit at src (16-byte aligned) into dst, reading only its first `bytes` (1..16)
// and zero-filling the rest (the row's end inside a unit).
__device__ __forceinline__ void pipe_cp16(void* dst, const void* src, int bytes) {
  // "memory": the compiler must not move this copy above the reads of the slot's previous round.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
template <int N>
__device__ __forceinline__ void pipe_wait() {  // cp.async.wait_group N; "memory": no slot read moves above it
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void pipe_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void pipe_wait_pending(int n) {  // cp.async.wait_group n, n runtime (0..6)
  switch (n) {
    case 0: pipe_wait<0>(); break;
    case 1: pipe_wait<1>(); break;
    case 2: pipe_wait<2>(); break;
    case 3: pipe_wait<3>(); break;
    case 4: pipe_wait<4>(); break;
    case 5: pipe_wait<5>(); break;
    default: pipe_wait<6>(); break;
  }
}

__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint32_t lds16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
// Words at a 2-byte-aligned shared address: quant_dot.cuh's ld_words_a2<N, false>.

// The Raw value T::load(row, pi) returns, read from a copy of the row's bytes in shared memory: blk =
// the copy of the block (superblock) holding piece pi, p = pi % T::kPieces. Same bytes, so dot() gives
// the same bits.
template <class T>
struct PipeLds;
template <>
struct PipeLds<K5> {
  __device__ static K5::Raw load(const uint8_t* blk, int p) { return {lds128(blk + 48 + 16 * p), lds128(blk), lds128(blk + 16 + 16 * (p & 1))}; }
};
template <>
struct PipeLds<B8> {
  __device__ static B8::Raw load(const uint8_t* blk, int) {
    B8::Raw r;
    ld_words_a2<8, false>(blk + 2, r.q);
    r.d = lds16(blk);
    return r;
  }
};

struct PipeTask {
  const uint8_t* w0;  // (row_bytes) first row of the task
  const uint8_t* w1;  // (row_bytes) second row (= w0 for the odd last row of a matrix)
  size_t rb;          // row bytes
  float* y;           // output vector of the task's matrix
  int64_t row0;       // row index of w0 in it
  bool has1;          // w1 is a real row
};

template <int MODE>
__device__ __forceinline__ PipeTask pipe_task(const PipeParams& p, int64_t t) {
  PipeTask k;
  if constexpr (MODE != kPipeRows) {
    k.rb = p.row_bytes[0];
    k.w0 = p.w[0] + static_cast<size_t>(t) * k.rb;
    k.w1 = p.w_up + static_cast<size_t>(t) * k.rb;
    k.y = p.y[0];
    k.row0 = t;
    k.has1 = true;
  } else {
    // The task's matrix, selected with static indices only (a dynamically indexed parameter array would
    // be copied to local memory).
    const uint8_t* w = p.w[0];
    size_t rb = p.row_bytes[0];
    int64_t M = p.M[0], first = 0;
    float* y = p.y[0];
#pragma unroll
    for (int j = 1; j < kMultiMax; ++j)
      if (j < p.count && t >= p.task_end[j - 1]) w = p.w[j], rb = p.row_bytes[j], M = p.M[j], y = p.y[j], first = p.task_end[j - 1];
    k.rb = rb;
    k.row0 = (t - first) * 2;
    k.has1 = k.row0 + 1 < M;
    k.w0 = w + static_cast<size_t>(k.row0) * rb;
    k.w1 = k.has1 ? k.w0 + rb : k.w0;
    k.y = y;
  }
  return k;
}

// Issues the cp.async copies of round k of both rows of task tk into slot (2 windows of kWin bytes), the
// warp's 32 lanes splitting the 16-byte units. Shapes: slot (2, kWin) bytes of shared memory.
template <class T>
__device__ __forceinline__ void pipe_issue(const PipeTask& tk, int k, uint8_t* slot, int lane) {
  constexpr int RB = pipe_round_bytes<T>(), kWin = pipe_window_bytes<T>();
  const size_t off = static_cast<size_t>(k) * RB;
  const int len = static_cast<int>(min(static_cast<size_t>(RB), tk.rb - off));
  const uint8_t* s0 = tk.w0 + off;
  const uint8_t* s1 = tk.w1 + off;
  const uint8_t* a0 = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(s0) & ~uintptr_t{15});
  const uint8_t* a1 = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(s1) & ~uintptr_t{15});
  const int end0 = static_cast<int>(s0 - a0) + len, end1 = static_cast<int>(s1 - a1) + len;  // bytes from a0 / a1
  const int n0 = (end0 + 15) >> 4, n1 = (end1 + 15) >> 4;
  for (int u = lane; u < n0 + n1; u += 32) {
    const bool second = u >= n0;
    const int v = second ? u - n0 : u;
    const int end = second ? end1 : end0;
    pipe_cp16(slot + (second ? kWin : 0) + 16 * v, (second ? a1 : a0) + 16 * v, min(16, end - 16 * v));
  }
}

template <class T, int MODE>
__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_pipe_kernel(const PipeParams p) {
  constexpr int RB = pipe_round_bytes<T>(), kWin = pipe_window_bytes<T>();
  // Dynamic shared memory: [4 warps][stages][2][kWin] weight ring, then xq (K, padded to 16), then xd (K/32).
  extern __shared__ uint4 pipe_smem[];
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int S = p.stages;
  uint8_t* smem = reinterpret_cast<uint8_t*>(pipe_smem);
  uint8_t* ring = smem + static_cast<size_t>(warp) * S * 2 * kWin;
  int8_t* xs_q = reinterpret_cast<int8_t*>(smem + static_cast<size_t>(kRowsPerBlock) * S * 2 * kWin);
  float* xs_d = reinterpret_cast<float*>(xs_q + ((p.K + 15) & ~int64_t{15}));
  grid_launch_dependents();
  const int64_t W = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp;
  const int64_t n_tasks = gw < p.tasks ? (p.tasks - 1 - gw) / W + 1 : 0;  // this warp's
  const int np = p.n_pieces, R = (np + 31) / 32;                         // rounds per row
  const int N = static_cast<int>(n_tasks) * R;                            // rounds this warp streams
  // Issue cursor: task index it (the warp's it-th task), round ik.
  int64_t it = 0;
  int ik = 0;
  PipeTask ti{};
  if (n_tasks > 0) ti = pipe_task<MODE>(p, gw);
  auto issue_next = [&](int slot) {
    pipe_issue<T>(ti, ik, ring + static_cast<size_t>(slot) * 2 * kWin, lane);
    if (++ik == R) {
      ik = 0;
      if (++it < n_tasks) ti = pipe_task<MODE>(p, gw + it * W);
    }
  };
  // Prologue: the first S − 1 rounds (one commit group each, empty past the end, so that the group count
  // of round s is always s + 1).
  for (int s = 0; s < S - 1; ++s) {
    if (s < N) issue_next(s);
    pipe_commit();
  }
  grid_wait();
  {  // the activations, once per block: (K) int8 as int4 units, (K/32) scales
    const int4* q = reinterpret_cast<const int4*>(p.xq);
    int4* qs = reinterpret_cast<int4*>(xs_q);
    for (int64_t i = threadIdx.x; i < p.K / 16; i += blockDim.x) qs[i] = q[i];
    for (int64_t i = threadIdx.x; i < p.K / 32; i += blockDim.x) xs_d[i] = p.xd[i];
  }
  __syncthreads();
  ActRows<1> x;
  x.q[0] = xs_q;
  x.d[0] = xs_d;
  x.s[0] = nullptr;  // read by K4 only, which this kernel does not take
  // Consume cursor.
  int64_t ci = 0;
  int ck = 0;
  PipeTask tc{};
  if (n_tasks > 0) tc = pipe_task<MODE>(p, gw);
  float acc0[1] = {0.0f}, acc1[1] = {0.0f};
  for (int s = 0; s < N; ++s) {
    pipe_wait_pending(S - 2);  // round s has landed (this lane's copies) ...
    __syncwarp();              // ... and every lane's; and every lane is done with round s − 1's slot
    if (s + S - 1 < N) issue_next((s + S - 1) % S);
    pipe_commit();
    const uint8_t* slot = ring + static_cast<size_t>(s % S) * 2 * kWin;
    const int pi = lane + 32 * ck;
    if (pi < np) {
      const size_t off = static_cast<size_t>(ck) * RB;
      const int o0 = static_cast<int>(reinterpret_cast<uintptr_t>(tc.w0 + off) & 15);
      const int o1 = static_cast<int>(reinterpret_cast<uintptr_t>(tc.w1 + off) & 15);
      const int blk = (lane / T::kPieces) * T::kBytes, pp = lane % T::kPieces;
      const typename T::Raw r0 = PipeLds<T>::load(slot + o0 + blk, pp);
      const typename T::Raw r1 = PipeLds<T>::load(slot + kWin + o1 + blk, pp);
      T::template dot<1>(r0, pi, x, acc0);
      T::template dot<1>(r1, pi, x, acc1);
    }
    if (++ck == R) {  // the task's last round: reduce exactly as gemv_q8_rw2_kernel / glu / multi do
      const float s0 = warp_sum(acc0[0]), s1 = warp_sum(acc1[0]);
      if (lane == 0) {
        if constexpr (MODE == kPipeRows) {
          tc.y[tc.row0] = s0;
          if (tc.has1) tc.y[tc.row0 + 1] = s1;
        } else {
          tc.y[tc.row0] = glu_act(s0, s1, MODE == kPipeGluSilu ? 0 : 1);
        }
      }
      acc0[0] = acc1[0] = 0.0f;
      ck = 0;
      if (++ci < n_tasks) tc = pipe_task<MODE>(p, gw + ci * W);
    }
  }
  pipe_wait<0>();  // only empty groups can be pending here
}

// ---- host side -------------------------------------------------------------------------------------------

int pipe_stages(const MatmulArgs& a) { return std::clamp(a.pipe_stages, kPipeMinStages, kPipeMaxStages); }

// Dynamic shared memory of one block: the 4 warps' rings, the activations (K, padded to 16) and scales.
template <class T>
size_t pipe_smem_bytes(int64_t K, int stages) {
  return static_cast<size_t>(kRowsPerBlock) * stages * 2 * pipe_window_bytes<T>() + static_cast<size_t>((K + 15) & ~int64_t{15}) +
         static_cast<size_t>(K / 32) * sizeof(float);
}

struct PipeDevice {
  int n_sm = 0, smem_optin = 0;
};
// The current device's SM count and opt-in shared memory per block (queried once per device).
PipeDevice pipe_device() {
  static std::mutex mu;
  static PipeDevice cache[64];
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  PipeDevice& d = cache[dev & 63];
  if (d.n_sm == 0) {
    check(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&d.n_sm, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  }
  return d;
}

// The weight types the pipelined kernel has (the others keep the existing kernels). Not Q4_K / Q6_K: their
// 64-weight pieces (quant_dot.cuh) do not fit this kernel's 32-weight rounds, and the pipe lost on both
// (docs/benchmarks.md run 38).
template <class T>
constexpr bool kPipeType = std::is_same_v<T, K5> || std::is_same_v<T, B8>;

// Whether the pipelined kernel takes a (one row, not grouped, 32 lanes, Q5_K/Q8_0, the 8-bit
// kernel's layout rules, a 16-byte-aligned matrix, shared memory that fits).
bool pipe_supported(const MatmulArgs& a) {
  if (a.pipe_stages <= 0 || a.n != 1 || a.expert_ids || a.lanes != 32 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return false;
  bool ok = false;
  wq::dispatch<wq::WqSet::kKQuantsQ8>(a.type, [&]<class T>() {
    if constexpr (kPipeType<T>)
      ok = a.K % kBlockValues<T> == 0 && aligned(a, T::kAlign) &&
           pipe_smem_bytes<T>(a.K, pipe_stages(a)) <= static_cast<size_t>(pipe_device().smem_optin);
  });
  return ok;
}

// One launch: grid = blocks per SM (occupancy, capped by bps or 8) × SMs, shrunk so that every warp gets
// the same number of tasks (ceil(tasks / warps)) and none idles for a whole task.
template <class T, int MODE>
void pipe_launch(const PipeParams& p, int bps, bool pdl, cudaStream_t stream) {
  if (p.tasks <= 0) return;
  static SmemOptIn optin;
  auto kernel = gemv_pipe_kernel<T, MODE>;
  const size_t smem = pipe_smem_bytes<T>(p.K, p.stages);
  optin.ensure(reinterpret_cast<const void*>(kernel), static_cast<int>(smem));
  int fit = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kRowsPerBlock * 32, smem), "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  const int per_sm = std::max(1, std::min(fit, bps > 0 ? bps : 8));
  const int64_t max_warps = static_cast<int64_t>(per_sm) * pipe_device().n_sm * kRowsPerBlock;
  const int64_t per_warp = ceil_div(p.tasks, max_warps);
  const int64_t warps = ceil_div(p.tasks, per_warp);
  const dim3 grid(static_cast<unsigned>(ceil_div(warps, int64_t{kRowsPerBlock})));
  launch_pdl(pdl, kernel, grid, dim3(kRowsPerBlock * 32), smem, stream, p);
  check_launch("gemv_pipe");
}

// Whether a takes the pipelined kernel as weight type T (T known at the call site).
template <class T>
bool pipe_ok(const MatmulArgs& a) {
  if constexpr (kPipeType<T>) {
    return pipe_supported(a);
  } else {
    return false;
  }
}

// The plain / grouped one-row GEMV on the pipelined kernel: y_j = x·W_jᵀ for a[0..count) (one type and K,
// each pipe_ok), in launches of up to kMultiMax matrices. xq (K) / xd (K/32): the quantize_q8 output.
template <class T>
void pipe_rows(const MatmulArgs* const* a, int count, const int8_t* xq, const float* xd, cudaStream_t stream) {
  if constexpr (kPipeType<T>) {
    for (int j0 = 0; j0 < count; j0 += kMultiMax) {
      PipeParams p{};
      p.xq = xq;
      p.xd = xd;
      p.K = a[0]->K;
      p.n_pieces = static_cast<int>(a[0]->K / 32);
      p.stages = pipe_stages(*a[0]);
      p.count = std::min(kMultiMax, count - j0);
      int64_t tasks = 0;
      for (int j = 0; j < p.count; ++j) {
        const MatmulArgs& m = *a[j0 + j];
        p.w[j] = static_cast<const uint8_t*>(m.w);
        p.row_bytes[j] = m.row_bytes;
        p.M[j] = m.M;
        p.y[j] = m.y;
        tasks += (std::max<int64_t>(m.M, 0) + 1) / 2;
        p.task_end[j] = tasks;
      }
      p.tasks = tasks;
      pipe_launch<T, kPipeRows>(p, a[0]->pipe_bps, a[0]->pdl, stream);
    }
  }
}

// The fused gate/up/GLU one-row GEMV on the pipelined kernel (g and u pipe_ok, gemv_glu_supported).
template <class T>
void pipe_glu(const MatmulArgs& g, const MatmulArgs& u, int act, const int8_t* xq, const float* xd, cudaStream_t stream) {
  if constexpr (kPipeType<T>) {
    PipeParams p{};
    p.xq = xq;
    p.xd = xd;
    p.K = g.K;
    p.n_pieces = static_cast<int>(g.K / 32);
    p.stages = pipe_stages(g);
    p.count = 1;
    p.w[0] = static_cast<const uint8_t*>(g.w);
    p.row_bytes[0] = g.row_bytes;
    p.M[0] = g.M;
    p.y[0] = g.y;
    p.task_end[0] = g.M;
    p.tasks = g.M;
    p.w_up = static_cast<const uint8_t*>(u.w);
    if (act == 0)
      pipe_launch<T, kPipeGluSilu>(p, g.pipe_bps, g.pdl, stream);
    else
      pipe_launch<T, kPipeGluGelu>(p, g.pipe_bps, g.pdl, stream);
  }
}
