#!/usr/bin/env bash
# scripts/device-check.sh — build and check the CUDA backend on the device machine, in one call.
#
# What it does (each step logged under $OUT; a failing step does not stop the later ones):
#   1. configure + build (Release, Ninja, -DPEREGRINE_CUDA=ON -DPEREGRINE_CUDA_ARCHS=90) into build-device:
#      peregrine, the CUDA tests and pg_cuda_bench                                     → $OUT/build.log
#   2. the CUDA tests (ctest -L cuda): every op vs the CPU, whole tiny models            → $OUT/tests.log
#   3. pg_cuda_bench: matmul kernels on 8B shapes, GB/s vs device copy bandwidth          → $OUT/kernels.log
#   3b. the bundled target/draft pair: AR vs chain vs DDTree (peregrine bench --draft)     → $OUT/spec.log
#   4. per model of $MODELS (preset:type): peregrine gguf synth, then peregrine bench --device cuda at
#      pp512/tg128, pp4096, tg128 at depth 4096, one forward of each row count of $ROWS (verification-
#      shaped steps), optionally tg128 without CUDA graphs and with other GEMV lane counts, and an nsys
#      kernel breakdown of 32 decode steps when nsys is installed, and pg_cuda_verify_bench (tree-shaped
#      verification forwards of $ROWS rows vs one AR step)                     → $OUT/model-*.log, nsys-*.csv
#   5. with FA_PREFILL=1: the tensor-core prefill attention's tests (test_cuda_attention_prefill, test_cuda_fa_layout;
#      also when TESTS=0) → $OUT/tests-fa.log, the model/greedy tests with it on for batches of ≥ 16 rows
#      → $OUT/tests-fa-models.log, and per model of $MODELS the prefill bench (-p 512,4096 -d 0,4096 -n 0)
#      with it off and on (PEREGRINE_CUDA_FA_PREFILL=$FA_PREFILL_ROWS)                          → $OUT/model-*.log
#      and pg_cuda_attn_bench (the attention kernels alone, off vs on)                         → $OUT/kernels-attn.log
#   6. with FA_DECODE=1: decode/verify attention on tensor cores (PEREGRINE_CUDA_FA_DECODE=1): the kernel tests
#      → $OUT/tests-fa-decode.log, model/graph/spec/tree tests with it on → tests-fa-decode-models.log, KV type
#      tests with it (and FA_PREFILL_TYPED) on → tests-fa-decode-kv.log, tg128 at depths 0, 4096 off vs on for the
#      first model → $OUT/model-*.log. ATTN_DECODE=1 adds the "fa_decode route" column to pg_cuda_attn_bench.
#   and a short summary (one line per step, plus the tables) last on stdout and in $OUT/summary.txt.
#
# One-time preparation on the development machine, in the repository root (the device machine has
# CUDA, CMake and a compiler but not the Debian -dev packages, and the shared test data does not travel):
#
#   ../shared/tools/device-deps.sh .deps/debs nlohmann-json3-dev libgtest-dev libgmock-dev libcli11-dev \
#       libcpp-httplib-dev libcpp-httplib0.11 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
#       libpcre2-posix3 pkgconf pkgconf-bin libpkgconf3
#   mkdir -p .deps/shared/golden/models
#   cp ../shared/golden/models/tiny-{llama,qwen3,qwen2,qwen3moe,gemma3,qwen35,qwen35moe}-*.gguf .deps/shared/golden/models/
#
# (.deps/ is git-ignored; together about 45 MB, under the 64 MiB a call may carry.) Then, with the device
# tool:  run(command="scripts/device-check.sh", carry=[".deps"], timeout_s=600)
#
# Environment: OUT (set by the device tool), BUDGET_S (seconds this script may use, default 570; steps
# that would not fit are skipped and say so), JOBS (default 16), ARCHS (default 90), MODELS, ROWS, LANES, MMQ_MIN_ROWS,
# GRAPHS_OFF, TESTS, KERNELS, KERNEL_TYPES, KVTYPES, LONGCTX (see their defaults below). A packed .deps/debs.tar.xz (smaller
# to carry) is unpacked into .deps/debs first.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-570}
JOBS=${JOBS:-16}
ARCHS=${ARCHS:-90}
MODELS=${MODELS:-qwen3-8b:Q4_K_M qwen35-27b:Q4_K_M}
KERNEL_TYPES=${KERNEL_TYPES:-q4_k,q6_k,q8_0,q5_k,q4_0,iq4_xs,f16,bf16}
BANDWIDTH=${BANDWIDTH:-4300}
ROWS=${ROWS:-1,2,4,8,16,22,32,64}  # row counts of the verification-shaped forwards (bench -p list)
LANES=${LANES:-}                   # GEMV lanes-per-row candidates to time besides the default (e.g. "16 8")
MMQ_MIN_ROWS=${MMQ_MIN_ROWS:-}     # other CudaOptions::mmq_min_rows values to time the row forwards with (e.g. "2 0")
GRAPHS_OFF=${GRAPHS_OFF:-0}        # 1: also tg128 with CUDA graphs off
TESTS=${TESTS:-1}                  # 0: skip the CUDA tests
KERNELS=${KERNELS:-1}              # 0: skip pg_cuda_bench
SPEC=${SPEC:-1}                    # 0: skip the bundled pair's speculative bench (AR vs chain vs DDTree)
SPEC4=${SPEC4:-0}                  # 1: plain draft and DFlash, chain and DDTree, fixed shapes, on the GPU and the CPU (issue 13)
VERIFY=${VERIFY:-1}                # 0: skip pg_cuda_verify_bench (tree-shaped verify forwards vs one AR step)
BENCH=${BENCH:-1}                  # 0: per model only the verify forwards (no pp/tg bench, no nsys)
NSYS=${NSYS:-1}                    # 0: no nsys breakdown
TEST_FILTER=${TEST_FILTER:-}       # ctest -R regex for the CUDA tests (default: all); CTEST_J: their parallel jobs (default 4)
PDL_OFF=${PDL_OFF:-0}              # 1: also tg128 with programmatic dependent launch off (PEREGRINE_CUDA_PDL=0)
RETRY_PDL_OFF=${RETRY_PDL_OFF:-0}  # 1: when the CUDA tests fail, run them again with PDL off (tests-pdl-off.log)
BENCH_ROWS=${BENCH_ROWS:-1}        # 0: skip bench -p ROWS -n 0 (chain forwards, last row's logits only)
TG_ONLY=${TG_ONLY:-0}              # 1: the per-model bench is tg128 at depths 0 and 4096 only (no pp)
RPW=${RPW:-}                       # other CudaOptions::gemv_rows_per_warp values to time tg128 with (e.g. "2")
KVTYPES=${KVTYPES:-}               # KV cache types (e.g. "f16 q8_0 q4_0 tq3_0"): tg128 at depths KV_DEPTHS with -ctk T -ctv T, first model of MODELS
KV_DEPTHS=${KV_DEPTHS:-4096,32768}
PROFILE_KV=${PROFILE_KV:-0}        # 1: with KVTYPES, per-op device times of 32 decode steps at depth 4096 per type (PEREGRINE_CUDA_PROFILE=1)
PROFILE=${PROFILE:-0}              # 1: per model, per-op device times of tg32 at depths 0 and 4096 and pp512 (PEREGRINE_CUDA_PROFILE=1)
LONGCTX=${LONGCTX:-0}              # 1: qwen35-27b of MODELS with a 262144-token tq3_0 cache (run: allocation + decode), then tg32 at depth LONGCTX_DEPTH
LONGCTX_DEPTH=${LONGCTX_DEPTH:-65536}
DRAFT_DEVICE_CHAIN=${DRAFT_DEVICE_CHAIN:-0}  # 1: also the bundled-pair spec bench with device-fed greedy draft chains (PEREGRINE_DRAFT_DEVICE_CHAIN=1)
TESTS_RPW2=${TESTS_RPW2:-0}        # 1: also the op/model tests with PEREGRINE_GEMV_RPW=2 (tests-rpw2.log)
SPEC_GRAPHS=${SPEC_GRAPHS:-0}      # 1: graph replay of verify-sized forwards (PEREGRINE_CUDA_GRAPH_ROWS=64, CudaOptions::graph_max_rows):
                                   #    CudaGraphRows and the graph/tree/spec tests with it (tests-spec-graphs.log), then the bundled
                                   #    pair's SPEC bench (with its spec-phases lines) at graph rows 8 and 64 (default) (spec-graphs-*.log)
SPEC_GRAPHS_DRAFTS=${SPEC_GRAPHS_DRAFTS:-draft}  # with SPEC_GRAPHS: bundled drafts to bench (models/peregrine-demo-<d>-Q8_0.gguf; "draft dflash")
DFLASH_TRAIN=${DFLASH_TRAIN:-0}    # N > 0: train the bundled target's DFlash draft on the GPU for N minutes (tools/train/dflash_train.py),
                                   # then its acceptance vs the bundled one on the CPU  → $OUT/dflash/, dflash.log
DFLASH_ARGS=${DFLASH_ARGS:---prompts 24000 --max-new 192 --bs 32 --anchors 12}  # the training run's data/batch flags
ATTN_KV=${ATTN_KV:-q8_0 tq3_0}     # with ATTN_DECODE: the same bench on these cache types (32/8 × 128)
ATTN_DECODE=${ATTN_DECODE:-0}      # 1: pg_cuda_attn_bench on decode/verify shapes (rows 1 and 22 at depths 4096, 32768): KV GB/s → kernels-attn.log
FA_PREFILL=${FA_PREFILL:-0}        # 1: tensor-core prefill attention: its tests, model tests with it on, prefill bench off vs on
FA_DECODE=${FA_DECODE:-0}          # 1: decode/verify attention on tensor cores (CudaOptions::fa_decode): its tests, test_cuda_model /
                                   #    test_cuda_spec with PEREGRINE_CUDA_FA_DECODE=1, tg128 at depths 0, 4096 off vs on (first model)
FA_TEST_ROWS=${FA_TEST_ROWS:-16}    # PEREGRINE_CUDA_FA_PREFILL for the model tests of FA_PREFILL=1
FUSE_QK_ROPE=${FUSE_QK_ROPE:-0}    # 1: one-launch q/k RMSNorm + RoPE (PEREGRINE_CUDA_FUSE_QK_ROPE=1, issue 11): its op / model tests
                                   #    (tests-qk-rope.log), the op/model/graph/spec tests with it on (tests-qk-rope-on.log), tg128 at
                                   #    depths 0, 4096 off vs on (first model)
KV_STORE_PAR=${KV_STORE_PAR:-0}    # 1: parallel typed kv_store (PEREGRINE_CUDA_KV_STORE_PAR=1): the typed KV tests with it (tests-kv-store-par.log), and with KVTYPES each type's tg128 (and PROFILE_KV profile) again with it
NCU=${NCU:-0}                      # 1: Nsight Compute (hardware counters; --clock-control none --cache-control none): the GPU time of every
                                   #    kernel of decode steps of the first model (graphs off: no launch gaps in the numbers) at depths 0
                                   #    and 4096, summed per kernel → $OUT/ncu-decode-*.csv + summary; then the speed-of-light, occupancy,
                                   #    warp-stall and memory sections of the one-row GEMV and the decode attention → $OUT/ncu-kernels.txt
NCU_KERNELS=${NCU_KERNELS:-rw2_kernel|fa_prefill_kernel|fa_combine}  # ncu --kernel-name regex of the detailed sections
NCU_SOURCE=${NCU_SOURCE:-0}        # 1: source-level ncu (stall samples per SASS/CUDA line) of NCU_SOURCE_KERNELS' decode launches
NCU_SOURCE_KERNELS=${NCU_SOURCE_KERNELS:-fa_prefill_kernel fa_combine_kernel}  # one ncu run per name (regex) and depth
NCU_SOURCE_DEPTHS=${NCU_SOURCE_DEPTHS:-0 4096}
NCU_BENCH=${NCU_BENCH:-}           # "type:MxK:rows ..." (e.g. "q4_k:12288x4096:22"): Nsight Compute sections and source-level stall
                                   # samples of one pg_cuda_bench launch of NCU_BENCH_KERNEL (kernel name regex) per entry → $OUT/ncu-bench.txt
NCU_BENCH_KERNEL=${NCU_BENCH_KERNEL:-mmq_kernel}
NCU_BENCH_KERNELS=${NCU_BENCH_KERNELS:-mmq}  # pg_cuda_bench --kernels of those runs
DEPTH_DIAG=${DEPTH_DIAG:-0}        # 1: the check of the depth-fill fix (runs 48-51 timed the fill's queued tail), first model: tg128 at
                                   #    depths 0/64/1024 with the depth filled by 512-row and by one-row forwards (-b 512 / -b 1: they
                                   #    must agree now; bench prints each test's host / device split), then ncu per-kernel GPU time of
                                   #    decode steps after a d64 fill of each kind (graphs off; ncu-diag-b*.txt) → model-*.log, summary
STAGE_X_OFF=${STAGE_X_OFF:-0}      # 1: per model, tg128 at depths 0 and 4096 also with the one-row GEMVs reading activations from
                                   #    global memory (PEREGRINE_CUDA_GEMV_STAGE_X=0), before the default run
PDL_ALL=${PDL_ALL:-0}              # 1: PDL for every decode-path kernel (PEREGRINE_CUDA_PDL_ALL=1): the CUDA tests with it (tests-pdl-all.log)
                                   #    and, per model, tg128 at depths 0 and 4096 with it
FA_FUSED_COMBINE=${FA_FUSED_COMBINE:-0}  # 1: the attention's split combine inside the kernel (PEREGRINE_CUDA_FA_FUSED_COMBINE=1): the CUDA
                                   #    tests with it (tests-fa-fused-combine.log), tg128 at depths 0, 4096, 32768 with it, first model
FUSE_NORM_QUANT=${FUSE_NORM_QUANT:-0}  # 1: RMSNorm writes the next matmul's 8-bit activations (PEREGRINE_CUDA_FUSE_NORM_QUANT=1): the CUDA
                                   #    tests with it (tests-fuse-norm-quant.log), tg128 at depths 0 and 4096 on vs off, first model
MOE_FUSED=${MOE_FUSED:-0}          # 1: MoE decode in 4 launches (PEREGRINE_CUDA_MOE_FUSED=1): the CUDA tests with it
                                   #    (tests-moe-fused.log), tg128 at depths 0 and 4096 off then on, first model
FA_VEC=${FA_VEC:-0}                # 1: SIMT flash-decoding attention for ≤ 8-row calls (PEREGRINE_CUDA_FA_VEC=1): every CUDA test with it
                                   #    (tests-fa-vec.log), pg_cuda_attn_bench at rows 1/4/8, depths 0/512/4096/32768, qwen3-8b and
                                   #    head-256 shapes in graphs (kernels-attn-vec.log), tg128 at depths 0, 4096, 32768 off vs on, first model
FA_VEC_SWEEP=${FA_VEC_SWEEP:-}      # "CHUNK:BLOCKS[:STAGES] ..." points of fa_vec (PEREGRINE_CUDA_FA_VEC_CHUNK / _BLOCKS / _STAGES): per point the fa_vec
                                   #    and model/graph tests (tests-fa-vec-sweep.log), pg_cuda_attn_bench rows 1/2 (kernels-attn-sweep.log),
                                   #    tg128 at depths 0, 4096, 32768 with fa_vec on, first model (e.g. "64:4 128:8"); FA_VEC_SWEEP_TESTS
                                   #    (ctest -R regex) and FA_VEC_SWEEP_SHAPES (pg_cuda_attn_bench --shapes) narrow it
FA_SPLIT=${FA_SPLIT:-}              # PEREGRINE_CUDA_FA_SPLIT_BLOCKS values (tensor-core attention's split-K blocks per SM, default 2) to time
                                   #    tg128 at depths 4096 and 32768 with, first model (e.g. "4 8")
FA_PREFILL_ROWS=${FA_PREFILL_ROWS:-32}  # CudaOptions::fa_prefill_min_rows for the "on" runs (PEREGRINE_CUDA_FA_PREFILL)
FUSE=${FUSE:-0}                    # 1: fused decode GEMVs (CudaOptions::fuse_glu + fuse_qkv, PEREGRINE_CUDA_FUSE_GLU/QKV=1): the
                                   #    CudaFuse* tests, the op/model/graph/spec tests with both on (tests-fuse.log), and per model
                                   #    tg128 at depths 0 and 4096 with both on, then each alone (beside the default run)
GEMV_PIPE=${GEMV_PIPE:-0}          # 1: the persistent pipelined one-row GEMV (CudaOptions::gemv_pipe, PEREGRINE_CUDA_GEMV_PIPE=1): its
                                   #    CudaGemvPipe tests, every CUDA test with it on (tests-gemv-pipe.log), pg_cuda_bench existing vs pipe
                                   #    on the decode shapes per stage count of GEMV_PIPE_U (kernels-gemv-pipe.log), and tg128 at depths
                                   #    0 and 4096 off vs on per stage count, first model
GEMV_PIPE_U=${GEMV_PIPE_U:-4}      # ring stages (PEREGRINE_CUDA_GEMV_PIPE_U) to bench with GEMV_PIPE=1 (e.g. "3 4 6")
GEMV_PIPE_BPS=${GEMV_PIPE_BPS:-0}  # blocks per SM (PEREGRINE_CUDA_GEMV_PIPE_BPS; 0: as many as fit)
PREFETCH_AB=${PREFETCH_AB:-}       # "MB:BLOCKS ..." points of the L2 weight prefetch (PEREGRINE_CUDA_L2_PREFETCH / _BLOCKS): per point,
                                   #    tg128 at depths 0 and 4096 on the first model, after the same with it off (e.g. "16:16 16:64 48:64")
PREFILL_AB=${PREFILL_AB:-0}        # 1: per model, pp512/pp4096 at depths 0 and 4096 with the cuBLASLt prefill GEMM off and on
                                   #    (PEREGRINE_CUDA_GEMM_CUBLAS=0/1) at ubatch 512 and 4096, and pg_cuda_bench --gemm
                                   #    (the kernels alone) → model-*.log, kernels-gemm.log
BUILD=$ROOT/build-device
DEPS=$ROOT/.deps/debs
if [ ! -d "$DEPS/usr" ] && [ -f "$ROOT/.deps/debs.tar.xz" ]; then tar xJf "$ROOT/.deps/debs.tar.xz" -C "$ROOT/.deps"; fi
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
export PATH=/usr/local/cuda/bin:$PATH
# libcublasLt (the prefill GEMM, CudaOptions::gemm_cublas) is linked dynamically: the toolkit's library folder
# on the loader's path, wherever this image keeps it (run 71 found it under targets/x86_64-linux/lib).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done

note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - SECONDS)); }
# run_step NAME LOG TIMEOUT_S CMD...: runs CMD with a timeout, output appended to LOG; records the status.
run_step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local remaining
  remaining=$(left)
  if ((remaining < 20)); then
    note "SKIP  $name (only ${remaining}s of the budget left)"
    return 1
  fi
  ((limit > remaining - 10)) && limit=$((remaining - 10))
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" >>"$log"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  if ((rc == 0)); then
    note "OK    $name ($((SECONDS - t0))s)"
  elif ((rc == 124 || rc == 137)); then
    note "TIME  $name (killed after ${limit}s; see $(basename "$log"))"
  else
    note "FAIL  $name (exit $rc, $((SECONDS - t0))s; see $(basename "$log"))"
  fi
  return $rc
}

# ---- environment ------------------------------------------------------------------------------------
{
  echo "=== environment"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || echo "nvidia-smi failed"
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  g++ --version 2>&1 | head -1
  nproc
  # DFLASH_TRAIN needs PyTorch with CUDA on the device machine
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -1
} >"$OUT/build.log" 2>&1
grep -E "^torch|Error" "$OUT/build.log" | tail -1 | tee -a "$SUMMARY"
head -3 "$OUT/build.log" | tail -2 | tee -a "$SUMMARY"

# Carried Debian packages: headers, CMake configs, static libraries, pkg-config files (and pkgconf itself
# when the machine has no pkg-config).
CMAKE_EXTRA=()
if [ -d "$DEPS/usr" ]; then
  export CMAKE_PREFIX_PATH=$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export PKG_CONFIG_PATH=$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  CMAKE_EXTRA+=("-DCMAKE_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu" "-DCMAKE_INCLUDE_PATH=$DEPS/usr/include")
  if ! command -v pkg-config >/dev/null 2>&1 && [ -x "$DEPS/usr/bin/pkgconf" ]; then
    # The .pc files say prefix=/usr: the sysroot makes pkgconf point into the carried tree.
    export PKG_CONFIG_SYSROOT_DIR=$DEPS
    export PKG_CONFIG_PATH=/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/share/pkgconfig
    CMAKE_EXTRA+=("-DPKG_CONFIG_EXECUTABLE=$DEPS/usr/bin/pkgconf")
  fi
else
  note "WARN  no carried dependencies at .deps/debs (see the header of this script)"
fi
export PEREGRINE_SHARED=${PEREGRINE_SHARED:-$ROOT/.deps/shared}

# ---- 1. build -----------------------------------------------------------------------------------------
BUILD_OK=0 CLI_OK=0
if run_step "configure" "$OUT/build.log" 120 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPEREGRINE_CUDA=ON -DPEREGRINE_E2E=OFF \
  "-DCMAKE_CXX_FLAGS=-Wno-error=stringop-overflow -Wno-error=array-bounds -Wno-error=maybe-uninitialized -Wno-error=restrict -Wno-error=dangling-reference" \
  -DPEREGRINE_CUDA_ARCHS="$ARCHS" -DPEREGRINE_SHARED_DIR="$PEREGRINE_SHARED" "${CMAKE_EXTRA[@]}"; then
  # The CUDA tests and the kernel benchmark first, then the CLI (which needs every layer to compile), so
  # that a broken file elsewhere in the tree does not hide the backend's results.
  # One build of everything the later steps need (-k 0: a broken file does not stop the other targets).
  run_step "build CUDA tests, pg_cuda_bench, peregrine" "$OUT/build.log" 420 \
    cmake --build "$BUILD" -j "$JOBS" --target test_cuda_ops test_cuda_model test_cuda_spec test_cuda_kv_types test_cuda_attention_prefill test_cuda_favec test_cuda_fa_layout pg_cuda_attn_bench pg_cuda_bench pg_cuda_verify_bench peregrine -- -k 0
  [ -x "$BUILD/tests/cuda/test_cuda_ops" ] && [ -x "$BUILD/tests/cuda/test_cuda_model" ] && [ -x "$BUILD/src/backend/cuda/pg_cuda_bench" ] && BUILD_OK=1
  [ -x "$BUILD/src/cli/peregrine" ] && CLI_OK=1
fi
grep -E "error|FAILED" "$OUT/build.log" | head -20 >>"$SUMMARY"

# ---- 2. tests -----------------------------------------------------------------------------------------
# The tensor-core prefill attention first (its own log, so a failure there is visible at a glance), then
# the model and greedy tests with it routed for every attention call of ≥ FA_PREFILL_ROWS rows.
if ((BUILD_OK && FA_PREFILL)); then
  run_step "prefill attention tests (CudaAttentionPrefill*, CudaFaLayout)" "$OUT/tests-fa.log" 300 \
    ctest --test-dir "$BUILD" -R "CudaAttentionPrefill|CudaFaLayout" -V -j 4 --timeout 280
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|max \|fa|on vs off|Failure|Expected|Which is" "$OUT/tests-fa.log" |
    sed -E 's/^[0-9]+: //' | head -80 >>"$SUMMARY"
  # 16 rows (FA_TEST_ROWS): the golden prompt of test_cuda_model.cpp has 24; 1 routes decode steps too.
  PEREGRINE_CUDA_FA_PREFILL=$FA_TEST_ROWS run_step "model tests with prefill attention on (≥ $FA_TEST_ROWS rows)" \
    "$OUT/tests-fa-models.log" 240 ctest --test-dir "$BUILD" -R "CudaModel|CudaGreedy" -V -j 4 --timeout 220
  grep -E "tests passed|tests failed|\(Failed\)|exact: max" "$OUT/tests-fa-models.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
  # The attention kernels alone (qwen3-8b 32/8×128, qwen35-27b 24/4×256, 16/8×64), off vs on.
  if [ -x "$BUILD/tests/cuda/pg_cuda_attn_bench" ]; then
    run_step "attention kernels alone, FP32 vs tensor cores" "$OUT/kernels-attn.log" 150 "$BUILD/tests/cuda/pg_cuda_attn_bench" \
      --rows 512,4096 --depth 0,4096 --reps 5
    grep -E "^\||device:" "$OUT/kernels-attn.log" >>"$SUMMARY"
    for kvt in $ATTN_KV; do  # typed caches: attn_kvq_kernel vs the typed tensor-core path (CudaOptions::fa_prefill_typed)
      run_step "prefill attention alone, KV $kvt" "$OUT/kernels-attn-fa-$kvt.log" 90 "$BUILD/tests/cuda/pg_cuda_attn_bench" \
        --rows 512,4096 --depth 0,4096 --reps 5 --shapes 32:8:128 --kv "$kvt"
      grep -E "^\||device:" "$OUT/kernels-attn-fa-$kvt.log" >>"$SUMMARY"
    done
  fi
fi
# Decode / verification attention on tensor cores (CudaOptions::fa_decode, PEREGRINE_CUDA_FA_DECODE=1): the
# kernel's decode / tree cases first, then the model and speculative tests with it on (F16 caches; typed
# q8_0 also needs PEREGRINE_CUDA_FA_PREFILL_TYPED=1, set here too so test_cuda_kv_types-style caches route).
if ((BUILD_OK && FA_DECODE)); then
  run_step "decode/verify attention tests (CudaAttentionPrefill*, CudaFaLayout)" "$OUT/tests-fa-decode.log" 300 \
    ctest --test-dir "$BUILD" -R "CudaAttentionPrefill|CudaFaLayout" -V -j 4 --timeout 280
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|decode|tree|Failure|Expected|Which is" "$OUT/tests-fa-decode.log" |
    sed -E 's/^[0-9]+: //' | head -80 >>"$SUMMARY"
  PEREGRINE_CUDA_FA_DECODE=1 run_step "model + spec tests with decode attention on tensor cores" \
    "$OUT/tests-fa-decode-models.log" 300 ctest --test-dir "$BUILD" -R "CudaModel|CudaGreedy|CudaGraphs|CudaSpec|CudaTree" -V -j 4 --timeout 280
  grep -E "tests passed|tests failed|\(Failed\)|exact: max" "$OUT/tests-fa-decode-models.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
  PEREGRINE_CUDA_FA_DECODE=1 PEREGRINE_CUDA_FA_PREFILL_TYPED=1 run_step "KV type tests with decode attention on tensor cores" \
    "$OUT/tests-fa-decode-kv.log" 300 ctest --test-dir "$BUILD" -R "CudaKv" -V -j 4 --timeout 280
  grep -E "tests passed|tests failed|\(Failed\)" "$OUT/tests-fa-decode-kv.log" | sed -E 's/^[0-9]+: //' | head -20 >>"$SUMMARY"
fi
# One-launch q/k RMSNorm + RoPE (CudaOptions::fuse_qk_norm_rope): its own tests (bit-identical to the four ops,
# ops and whole models), then the op, model, graph and speculative tests with it on through make_cuda's alias.
if ((BUILD_OK && FUSE_QK_ROPE)); then
  run_step "fused q/k norm + rope tests (QkNormRope*, CudaFuseQkRope*)" "$OUT/tests-qk-rope.log" 200 \
    ctest --test-dir "$BUILD" -R "QkNormRope|CudaFuseQkRope" -V -j 4 --timeout 180
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|four ops max|Failure|Expected|Which is|fused" "$OUT/tests-qk-rope.log" |
    sed -E 's/^[0-9]+: //' | head -60 >>"$SUMMARY"
  PEREGRINE_CUDA_FUSE_QK_ROPE=1 run_step "op/model/graph/spec tests with fused q/k norm + rope on" "$OUT/tests-qk-rope-on.log" 300 \
    ctest --test-dir "$BUILD" -L cuda -R "CudaOps|CudaModel|CudaGreedy|CudaGraphs|CudaSpec|CudaTree|CudaKvModel" -j 4 --timeout 280
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$OUT/tests-qk-rope-on.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
fi
if ((BUILD_OK && ATTN_DECODE)) && [ -x "$BUILD/tests/cuda/pg_cuda_attn_bench" ]; then
  run_step "decode attention alone (rows 1, 22)" "$OUT/kernels-attn.log" 120 "$BUILD/tests/cuda/pg_cuda_attn_bench" \
    --rows 1,22 --depth 4096,32768 --reps 50
  grep -E "^\||device:" "$OUT/kernels-attn.log" | tail -14 >>"$SUMMARY"
  for kvt in $ATTN_KV; do  # typed caches: attn_kvq_kernel (and the typed tensor-core path where it applies)
    run_step "decode attention alone, KV $kvt" "$OUT/kernels-attn-$kvt.log" 60 "$BUILD/tests/cuda/pg_cuda_attn_bench" \
      --rows 1,22 --depth 4096,32768 --reps 50 --shapes 32:8:128 --kv "$kvt"
    grep -E "^\||device:" "$OUT/kernels-attn-$kvt.log" | tail -5 >>"$SUMMARY"
  done
fi
if ((BUILD_OK && TESTS)); then
  if ! run_step "CUDA tests (ctest -L cuda)" "$OUT/tests.log" 300 \
    ctest --test-dir "$BUILD" -L cuda ${TEST_FILTER:+-R "$TEST_FILTER"} -V -j ${CTEST_J:-4} --timeout 280 && ((RETRY_PDL_OFF)); then
    PEREGRINE_CUDA_PDL=0 run_step "CUDA tests, PDL off" "$OUT/tests-pdl-off.log" 300 \
      ctest --test-dir "$BUILD" -L cuda ${TEST_FILTER:+-R "$TEST_FILTER"} -V -j 4 --timeout 280
    grep -E "tests passed|tests failed|\(Failed\)" "$OUT/tests-pdl-off.log" | sed -E 's/^[0-9]+: //' | head -20 >>"$SUMMARY"
  fi
  # The model tests print one line per model (max/RMS logit differences) and per greedy run.
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|exact: max|greedy|identical|fused chunk|tree vs chain|diverges|CUDA vs CPU max|worst relative error" "$OUT/tests.log" |
    sed -E 's/^[0-9]+: //' | head -160 >>"$SUMMARY"
  # Failures last and in full (the list above is cut): which tests, and gtest's messages.
  { echo "CUDA test failures and messages:"; grep -E "tests failed|\(Failed\)|\(Subprocess|\(Timeout\)|Failure$|Expected|Which is|: error|what\(\)|C\+\+ exception" "$OUT/tests.log" |
    sed -E 's/^[0-9]+: //' | tail -60; } >>"$SUMMARY"
fi

# The norms writing the next matmul's 8-bit activations (CudaOptions::fuse_norm_quant): every CUDA test again with it on.
if ((BUILD_OK && FUSE_NORM_QUANT)); then
  PEREGRINE_CUDA_FUSE_NORM_QUANT=1 run_step "CUDA tests, fused norm quantization" "$OUT/tests-fuse-norm-quant.log" 300 \
    ctest --test-dir "$BUILD" -L cuda ${TEST_FILTER:+-R "$TEST_FILTER"} -j 6 --timeout 280 --output-on-failure
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Failure$|Expected|Which is|norm-quant on vs off" "$OUT/tests-fuse-norm-quant.log" | sed -E 's/^[0-9]+: //' | head -60 >>"$SUMMARY"
fi

# The fused MoE decode kernels (CudaOptions::moe_fused): every CUDA test again with them on.
if ((BUILD_OK && MOE_FUSED)); then
  PEREGRINE_CUDA_MOE_FUSED=1 run_step "CUDA tests, fused MoE decode" "$OUT/tests-moe-fused.log" 300 \
    ctest --test-dir "$BUILD" -L cuda ${TEST_FILTER:+-R "$TEST_FILTER"} -j 6 --timeout 280 --output-on-failure
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Failure$|Expected|Which is|moe_fused differs" "$OUT/tests-moe-fused.log" | sed -E 's/^[0-9]+: //' | head -60 >>"$SUMMARY"
fi

# The fused split combine (CudaOptions::fa_fused_combine): every CUDA test again with it on.
if ((BUILD_OK && FA_FUSED_COMBINE)); then
  PEREGRINE_CUDA_FA_FUSED_COMBINE=1 run_step "CUDA tests, fused attention split combine" "$OUT/tests-fa-fused-combine.log" 300 \
    ctest --test-dir "$BUILD" -L cuda ${TEST_FILTER:+-R "$TEST_FILTER"} -j 6 --timeout 280 --output-on-failure
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Failure$|Expected|Which is" "$OUT/tests-fa-fused-combine.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
fi

# The SIMT flash-decoding attention (CudaOptions::fa_vec): every CUDA test again with it on, then the attention
# alone (fa_vec vs the tensor-core decode route, device time per call in a graph of 20 calls).
if ((BUILD_OK && FA_VEC)); then
  PEREGRINE_CUDA_FA_VEC=1 run_step "CUDA tests, SIMT flash-decoding attention" "$OUT/tests-fa-vec.log" 300 \
    ctest --test-dir "$BUILD" -L cuda ${TEST_FILTER:+-R "$TEST_FILTER"} -j 6 --timeout 280 --output-on-failure
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Failure$|Expected|Which is" "$OUT/tests-fa-vec.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
  if [ -x "$BUILD/tests/cuda/pg_cuda_attn_bench" ]; then
    run_step "decode attention alone, fa_vec vs tensor cores" "$OUT/kernels-attn-vec.log" 150 "$BUILD/tests/cuda/pg_cuda_attn_bench" \
      --shapes 32:8:128,24:4:256 --rows 1,4,8 --depth 0,512,4096,32768 --reps 20 --graph 20
    grep -E "^\||device:" "$OUT/kernels-attn-vec.log" | tail -26 >>"$SUMMARY"
  fi
fi

# fa_vec's split plan swept: smaller chunks / more blocks per SM keep more KV loads in flight at depth.
if ((BUILD_OK)) && [ -n "$FA_VEC_SWEEP" ]; then
  for pt in $FA_VEC_SWEEP; do
    IFS=: read -r ch bl st <<<"$pt"
    st=${st:-2}
    export PEREGRINE_CUDA_FA_VEC_STAGES=$st
    PEREGRINE_CUDA_FA_VEC=1 PEREGRINE_CUDA_FA_VEC_CHUNK=$ch PEREGRINE_CUDA_FA_VEC_BLOCKS=$bl run_step "fa_vec tests, chunk $ch, $bl blocks/SM, $st stages" \
      "$OUT/tests-fa-vec-sweep.log" 200 ctest --test-dir "$BUILD" -L cuda -R "${FA_VEC_SWEEP_TESTS:-FaVec|CudaModel|CudaGraphs|CudaSpec}" -j 6 --timeout 190 --output-on-failure
    grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$OUT/tests-fa-vec-sweep.log" | tail -3 >>"$SUMMARY"
    if [ -x "$BUILD/tests/cuda/pg_cuda_attn_bench" ]; then
      echo "--- chunk $ch, $bl blocks/SM, $st stages" >>"$OUT/kernels-attn-sweep.log"
      PEREGRINE_CUDA_FA_VEC_CHUNK=$ch PEREGRINE_CUDA_FA_VEC_BLOCKS=$bl run_step "attention alone, fa_vec chunk $ch, $bl blocks/SM, $st stages" \
        "$OUT/kernels-attn-sweep.log" 90 "$BUILD/tests/cuda/pg_cuda_attn_bench" --shapes ${FA_VEC_SWEEP_SHAPES:-32:8:128,24:4:256} --rows 1,2 \
        --depth 512,4096,32768 --reps 20 --graph 20
    fi
    unset PEREGRINE_CUDA_FA_VEC_STAGES
  done
  grep -E "^\| [0-9]|^--- chunk" "$OUT/kernels-attn-sweep.log" | cut -d'|' -f2-4,13,16-18 >>"$SUMMARY"
fi

# PDL for every decode-path kernel (CudaOptions::pdl_all): every CUDA test again with it on.
if ((BUILD_OK && PDL_ALL)); then
  PEREGRINE_CUDA_PDL_ALL=1 run_step "CUDA tests, PDL for every kernel" "$OUT/tests-pdl-all.log" 300 \
    ctest --test-dir "$BUILD" -L cuda ${TEST_FILTER:+-R "$TEST_FILTER"} -j 6 --timeout 280 --output-on-failure
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Failure$|Expected|Which is" "$OUT/tests-pdl-all.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
fi

# The parallel typed kv_store (CudaOptions::kv_store_parallel): its byte-identity test runs in the main
# test step (CudaKvStore.BytesEqualCpuQuantizer/Parallel); here every typed-KV test (attention on stored
# caches, whole models, graph replay) runs with the option on, through the test helper's environment alias.
if ((BUILD_OK && KV_STORE_PAR)); then
  PEREGRINE_CUDA_KV_STORE_PAR=1 run_step "typed KV tests, parallel kv_store" "$OUT/tests-kv-store-par.log" 200 \
    ctest --test-dir "$BUILD" -L cuda -R "CudaKv|CudaAttentionPrefill" -V -j 4 --timeout 180
  grep -E "tests passed|tests failed|\(Failed\)|FAILED|first differing byte" "$OUT/tests-kv-store-par.log" | sed -E 's/^[0-9]+: //' | head -30 >>"$SUMMARY"
fi

# Fused decode GEMVs (issue 11): their own bit-identity tests (also part of the plain test step), then the
# op/model/graph/spec tests with both switches on through the test helper's environment aliases.
if ((BUILD_OK && FUSE)); then
  PEREGRINE_CUDA_FUSE_GLU=1 PEREGRINE_CUDA_FUSE_QKV=1 run_step "CUDA tests with fuse_glu + fuse_qkv on" "$OUT/tests-fuse.log" 300 \
    ctest --test-dir "$BUILD" -L cuda -R "CudaOps|CudaModel|CudaGreedy|CudaGraphs|CudaTree|CudaSpec" -V -j 4 --timeout 280
  grep -E "tests passed|tests failed|\(Failed\)|FAILED|fused vs separate" "$OUT/tests-fuse.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
fi

# The persistent pipelined one-row GEMV (CudaOptions::gemv_pipe): its bit-identity tests against the
# existing kernels first, then every CUDA test with it on through the test helper's environment alias.
if ((BUILD_OK && GEMV_PIPE)); then
  run_step "CudaGemvPipe tests" "$OUT/tests-gemv-pipe.log" 240 "$BUILD/tests/cuda/test_cuda_ops" --gtest_filter='CudaGemvPipe.*'
  grep -E "^\[  (PASSED|FAILED) |^\[       OK|Failure$|Expected|Which is|stages" "$OUT/tests-gemv-pipe.log" | head -40 >>"$SUMMARY"
  PEREGRINE_CUDA_GEMV_PIPE=1 PEREGRINE_CUDA_GEMV_PIPE_BPS=$GEMV_PIPE_BPS run_step "CUDA tests with gemv_pipe on" "$OUT/tests-gemv-pipe.log" 300 \
    ctest --test-dir "$BUILD" -L cuda ${TEST_FILTER:+-R "$TEST_FILTER"} -j 6 --timeout 280 --output-on-failure
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Failure$|Expected|Which is" "$OUT/tests-gemv-pipe.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
fi

if ((BUILD_OK && TESTS && TESTS_RPW2)); then
  PEREGRINE_GEMV_RPW=2 run_step "CUDA op/model tests, GEMV rows per warp 2" "$OUT/tests-rpw2.log" 200 \
    ctest --test-dir "$BUILD" -L cuda -R "CudaOps|CudaModel|CudaGreedy|CudaGraphs|CudaTree" -j 4 --timeout 180
  grep -E "tests passed|tests failed|\(Failed\)" "$OUT/tests-rpw2.log" | head -20 >>"$SUMMARY"
fi

# ---- 3. kernel micro-benchmark ---------------------------------------------------------------------------
if ((BUILD_OK && KERNELS)); then
  run_step "pg_cuda_bench" "$OUT/kernels.log" 180 "$BUILD/src/backend/cuda/pg_cuda_bench" --reps 20 --types "$KERNEL_TYPES"
  grep -E "^\||device:" "$OUT/kernels.log" >>"$SUMMARY"
fi
# Nsight Compute on single kernel-bench launches (NCU_BENCH): sections, then the source page ranked by tools/ncu_source.py.
# pg_cuda_bench times after 3 warm-up calls: --launch-skip 3 takes the first timed launch of the kernel.
if ((BUILD_OK)) && [[ -n $NCU_BENCH ]] && command -v ncu >/dev/null 2>&1; then
  for e in $NCU_BENCH; do
    IFS=: read -r ty shp rows <<<"$e"
    rep=/tmp/ncu-bench-$ty-$shp-$rows
    bargs=(--types "$ty" --shapes "$shp" --rows "$rows" --kernels "$NCU_BENCH_KERNELS" --reps 3)
    run_step "ncu sections $e" "$OUT/ncu-bench.txt" 120 ncu --kernel-name "regex:$NCU_BENCH_KERNEL" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
      "$BUILD/src/backend/cuda/pg_cuda_bench" "${bargs[@]}"
    run_step "ncu source $e" "$OUT/ncu-run.log" 120 ncu --kernel-name "regex:$NCU_BENCH_KERNEL" --launch-skip 3 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --import-source yes -f -o "$rep" "$BUILD/src/backend/cuda/pg_cuda_bench" "${bargs[@]}" &&
      ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass >"$rep.csv" 2>"$rep.err" &&
      { echo "=== ncu source: $e"; python3 "$ROOT/tools/ncu_source.py" "$rep.csv" 30 2>&1; } >>"$OUT/ncu-bench.txt"
  done
  { echo "ncu bench: $NCU_BENCH"; grep -E "^  *(Duration|Memory Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued)" "$OUT/ncu-bench.txt"; } >>"$SUMMARY"
fi
# The pipelined one-row GEMV against the kernels it replaces, on qwen3-8b's decode shapes.
if ((BUILD_OK && GEMV_PIPE)); then
  for u in $GEMV_PIPE_U; do
    run_step "pg_cuda_bench, gemv_pipe $u stages" "$OUT/kernels-gemv-pipe.log" 150 "$BUILD/src/backend/cuda/pg_cuda_bench" --reps 30 \
      --types q4_k,q6_k,q5_k,q8_0 --shapes 4096x4096,1024x4096,12288x4096,4096x12288,151936x4096 --pipe-stages "$u" --pipe-bps "$GEMV_PIPE_BPS" \
      --kernels fast/rw2+pdl,pipe+pdl,glu/fused+pdl,glu/pipe+pdl,qkv/grouped+pdl,qkv/pipe+pdl
  done
  grep -E "^\||^pipe:" "$OUT/kernels-gemv-pipe.log" >>"$SUMMARY"
fi

# ---- 3b. speculative decoding of the bundled pair on the GPU (AR vs chain vs DDTree) -------------------------
if ((CLI_OK && SPEC)); then
  run_step "bundled pair: AR vs chain vs DDTree" "$OUT/spec.log" 150 "$BUILD/src/cli/peregrine" bench --device cuda \
    -m "$ROOT/models/peregrine-demo-target-Q8_0.gguf" --draft "$ROOT/models/peregrine-demo-draft-Q8_0.gguf" --ddtree -n 128 -r 3
  grep -E "^\||model:|^differs|^spec-phases" "$OUT/spec.log" >>"$SUMMARY"
  if ((DRAFT_DEVICE_CHAIN)); then
    # The device-fed chain takes greedy chains without p-min only (the CLI's default p-min is 0.75):
    # p-min 0 with the per-depth path, then with the device-fed path.
    for dc in 0 1; do
      echo "bundled pair, --spec-draft-p-min 0, PEREGRINE_DRAFT_DEVICE_CHAIN=$dc:" >>"$SUMMARY"
      PEREGRINE_DRAFT_DEVICE_CHAIN=$dc run_step "bundled pair, p-min 0, device chain $dc" "$OUT/spec-devchain$dc.log" 150 \
        "$BUILD/src/cli/peregrine" bench --device cuda -m "$ROOT/models/peregrine-demo-target-Q8_0.gguf" \
        --draft "$ROOT/models/peregrine-demo-draft-Q8_0.gguf" --ddtree --spec-draft-p-min 0 -n 128 -r 3
      grep -E "^\\||model:" "$OUT/spec-devchain$dc.log" >>"$SUMMARY"
    done
  fi
fi
# The four drafters of issue 13 on the bundled target, fixed shapes (no adaptive choice), GPU then CPU:
# plain draft and DFlash, each as chain and DDTree (bench prints AR, chain and DDTree per invocation).
if ((CLI_OK && SPEC4)); then
  for dev in cuda cpu; do
    for d in draft dflash; do
      run_step "bundled target + $d, $dev, fixed shapes" "$OUT/spec.log" 150 "$BUILD/src/cli/peregrine" bench --device "$dev" -t 8 \
        -m "$ROOT/models/peregrine-demo-target-Q8_0.gguf" --draft "$ROOT/models/peregrine-demo-$d-Q8_0.gguf" --ddtree \
        --spec-fixed --spec-draft-p-min 0 -n 128 -r "$([ "$dev" = cuda ] && echo 3 || echo 1)"
      { echo "bundled target + $d, $dev:"; grep -E "^\||^differs" "$OUT/spec.log" | tail -6; } >>"$SUMMARY"
    done
  done
fi

# Verify-sized forwards replayed as CUDA graphs (issue 10/13: the bundled pair's forwards are launch-bound):
# the tests with PEREGRINE_CUDA_GRAPH_ROWS=64, then the SPEC bench at 8 rows (the default before run 39) and at 64 (the default),
# neighbours in time. What decides: chain / DDTree tok/s at 64 vs 8 with the same text, and the verify ms of
# the spec-phases lines.
if ((BUILD_OK && SPEC_GRAPHS)); then
  PEREGRINE_CUDA_GRAPH_ROWS=64 run_step "CUDA graph-rows/graph/tree/spec tests, graph rows 64" "$OUT/tests-spec-graphs.log" 300 \
    ctest --test-dir "$BUILD" -L cuda -R "CudaGraphRows|CudaGraphs|CudaTree|CudaSpec" -V -j 4 --timeout 280
  grep -E "tests passed|tests failed|\(Failed\)|FAILED|replay vs eager" "$OUT/tests-spec-graphs.log" | sed -E 's/^[0-9]+: //' | head -40 >>"$SUMMARY"
fi
if ((CLI_OK && SPEC_GRAPHS)); then
  for d in $SPEC_GRAPHS_DRAFTS; do
    for gr in 8 64; do
      PEREGRINE_CUDA_GRAPH_ROWS=$gr run_step "bundled target + $d, graph rows $gr" "$OUT/spec-graphs-$d-$gr.log" 150 \
        "$BUILD/src/cli/peregrine" bench --device cuda -m "$ROOT/models/peregrine-demo-target-Q8_0.gguf" \
        --draft "$ROOT/models/peregrine-demo-$d-Q8_0.gguf" --ddtree -n 128 -r 3
      { echo "bundled target + $d, PEREGRINE_CUDA_GRAPH_ROWS=$gr:"; grep -E "^\||^spec-phases|^differs" "$OUT/spec-graphs-$d-$gr.log"; } >>"$SUMMARY"
    done
  done
fi

# ---- 3c. the bundled target's DFlash draft trained on the GPU, its served acceptance on the CPU ---------------
# The CPU-trained draft of models/ saw 74 k tokens (docs/dflash.md); this trains the same shape on ~10x the
# data. The new file and its reference logits land in $OUT/dflash/ for the development machine to test and
# commit (tests/model/test_dflash.cpp checks the .ref_logits against Peregrine's forward).
if ((CLI_OK && DFLASH_TRAIN > 0)); then
  mkdir -p "$OUT/dflash"
  # shellcheck disable=SC2086
  run_step "DFlash draft training (${DFLASH_TRAIN} min on the GPU)" "$OUT/dflash.log" $((DFLASH_TRAIN * 60 + 240)) \
    python3 "$ROOT/tools/train/dflash_train.py" --device cuda --peregrine "$BUILD/src/cli/peregrine" --minutes "$DFLASH_TRAIN" \
    --target "$ROOT/models/peregrine-demo-target-Q8_0.gguf" --out "$OUT/dflash/peregrine-demo-dflash-Q8_0.gguf" $DFLASH_ARGS
  grep -E "final held-out|steps|generated:" "$OUT/dflash.log" | tail -4 >>"$SUMMARY"
  for f in "$ROOT/models/peregrine-demo-dflash-Q8_0.gguf" "$OUT/dflash/peregrine-demo-dflash-Q8_0.gguf"; do
    [ -f "$f" ] && run_step "DFlash acceptance, CPU: $(dirname "$f" | xargs basename)" "$OUT/dflash.log" 120 "$BUILD/src/cli/peregrine" bench \
      -m "$ROOT/models/peregrine-demo-target-Q8_0.gguf" --draft "$f" --ddtree -n 128 -t 8 -r 1 &&
      grep -E "^\|" "$OUT/dflash.log" | tail -4 >>"$SUMMARY"
  done
fi

# ---- 4. whole-model speed on synthetic models -------------------------------------------------------------
# MODELS: preset:type pairs. Each: synth on the device, then one bench of pp512, pp4096 and tg128 at depths
# 0 and 4096 (CUDA graphs on), tg128 with graphs off and with the GEMV lane candidates, and (with nsys) the
# kernel time breakdown of 32 decode steps.
PG=$BUILD/src/cli/peregrine
bench_one() {  # LOG NAME ARGS...
  local log=$1 name=$2
  shift 2
  run_step "$name" "$log" 200 "$PG" bench "$@" --device cuda --bandwidth "$BANDWIDTH"
}
if ((CLI_OK)); then
  FIRST_MODEL=1
  for spec in $MODELS; do
    preset=${spec%%:*} type=${spec##*:}
    MODEL=/tmp/peregrine-$preset-$type.gguf
    LOG=$OUT/model-$preset-$type.log
    if run_step "gguf synth $preset $type" "$LOG" 240 "$PG" gguf synth --preset "$preset" --type "$type" -o "$MODEL"; then
      # Nsight Compute: per-kernel GPU time of decode steps (eager: ncu serializes kernels anyway), the first
      # model only. bench -p 0 -n 8: the first 2 400 launches (warm-up) are skipped and the next 1 600 measured (~4 decode
      # steps of ~400 launches). At depth 4096 (-n 16) the depth's prefill runs past launch 9 000 (run 35 caught its GEMMs
      # in a 9 000..10 600 window), so 4 000 launches from 9 000 are profiled and tools/ncu_sum.py keeps the last 1 600;
      # it sums them per kernel name. The sections step skips 1 000 matching launches (past the prefill's attention).
      if ((NCU && FIRST_MODEL)) && command -v ncu >/dev/null 2>&1; then
        for d in 0 4096; do
          run_step "ncu $preset $type decode kernels at depth $d" "$OUT/ncu-run.log" 240 env PEREGRINE_CUDA_GRAPHS=0 ncu --clock-control none \
            --cache-control none --launch-skip $((d > 0 ? 9000 : 2400)) --launch-count $((d > 0 ? 4000 : 1600)) --csv --print-units base \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
            --log-file "$OUT/ncu-decode-d$d.csv" "$PG" bench -m "$MODEL" -p 0 -n $((d > 0 ? 16 : 8)) -d "$d" -r 1 --device cuda
          python3 "$ROOT/tools/ncu_sum.py" "$OUT/ncu-decode-d$d.csv" 1600 >"$OUT/ncu-decode-d$d.txt" 2>&1
          { echo "ncu: decode kernels of $preset $type at depth $d (GPU time, graphs off)"; head -40 "$OUT/ncu-decode-d$d.txt"; } >>"$SUMMARY"
        done
        run_step "ncu $preset $type kernel sections (depth 4096 decode)" "$OUT/ncu-run.log" 240 env PEREGRINE_CUDA_GRAPHS=0 ncu --clock-control none \
          --cache-control none --kernel-name "regex:$NCU_KERNELS" --launch-skip 1000 --launch-count 20 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
          --section SchedulerStats --log-file "$OUT/ncu-kernels.txt" "$PG" bench -m "$MODEL" -p 0 -n 8 -d 4096 -r 1 --device cuda
      elif ((NCU && FIRST_MODEL)); then
        note "SKIP  ncu (not on the PATH)"
      fi
      if ((DEPTH_DIAG && FIRST_MODEL)); then
        for bs in 512 1; do
          bench_one "$LOG" "$preset $type tg128 at depths 0, 64, 1024, depth filled by $bs-row forwards" -m "$MODEL" -p 0 -n 128 -d 0,64,1024 -r 2 -b $bs
        done
        { echo "depth diagnosis $preset $type (tg128; -b 512 then -b 1)"; grep -E "^\| tg128|^host / device" "$LOG" | tail -12; } >>"$SUMMARY"
        if command -v ncu >/dev/null 2>&1; then
          # bench -p 0 -n 64 -d 64 -r 1: two runs of (fill + 64 decode steps) of ~350-470 launches each (graphs off); the
          # window starts inside the second run's decode for either fill: -b 1 fills with 64 forwards (second decode
          # from ~84K launches), -b 512 with one (from ~28K). tools/ncu_sum.py keeps the last 1 600 and counts steps by argmax.
          for bs in 512 1; do
            skip=$((bs == 1 ? 90000 : 40000))
            run_step "ncu $preset $type decode kernels at depth 64 after a -b $bs fill" "$OUT/ncu-run.log" 240 env PEREGRINE_CUDA_GRAPHS=0 ncu \
              --clock-control none --cache-control none --launch-skip $skip --launch-count 3000 --csv --print-units base \
              --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
              --log-file "$OUT/ncu-diag-b$bs.csv" "$PG" bench -m "$MODEL" -p 0 -n 64 -d 64 -r 1 -b $bs --device cuda
            python3 "$ROOT/tools/ncu_sum.py" "$OUT/ncu-diag-b$bs.csv" 1600 >"$OUT/ncu-diag-b$bs.txt" 2>&1
            rm -f "$OUT/ncu-diag-b$bs.csv"
            { echo "ncu: decode kernels at depth 64 after a -b $bs fill (GPU time, graphs off)"; head -24 "$OUT/ncu-diag-b$bs.txt"; } >>"$SUMMARY"
          done
        fi
      fi
      if ((NCU_SOURCE && FIRST_MODEL)) && command -v ncu >/dev/null 2>&1; then
        # Source-level counters (warp-stall samples and instructions per SASS line, -lineinfo gives the CUDA
        # line) of one decode launch of each kernel of NCU_SOURCE_KERNELS at each depth of NCU_SOURCE_DEPTHS;
        # tools/ncu_source.py ranks the lines into one file, $OUT/ncu-source.txt (few files come back from $OUT).
        # The reports and source pages stay on the device.
        SRC_TMP=$(mktemp -d)
        : >"$OUT/ncu-source.txt"
        for d in $NCU_SOURCE_DEPTHS; do
          for k in $NCU_SOURCE_KERNELS; do
            rep="$SRC_TMP/$k-d$d"
            run_step "ncu source $k at depth $d" "$OUT/ncu-run.log" 180 env PEREGRINE_CUDA_GRAPHS=0 ncu --clock-control none \
              --cache-control none --kernel-name "regex:$k" --launch-skip $((d > 0 ? 1000 : 150)) --launch-count 1 \
              --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source yes -f -o "$rep" \
              "$PG" bench -m "$MODEL" -p 0 -n 8 -d "$d" -r 1 --device cuda || continue
            ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass >"$rep.csv" 2>"$rep.err" ||
              ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>>"$rep.err"
            { echo "=== ncu source: $k at depth $d"; cat "$rep.err"; python3 "$ROOT/tools/ncu_source.py" "$rep.csv" 40 2>&1; } \
              >>"$OUT/ncu-source.txt"
          done
        done
        rm -rf "$SRC_TMP"
        grep -A3 "^=== ncu source" "$OUT/ncu-source.txt" >>"$SUMMARY"
      fi
      if ((FA_PREFILL)); then  # prefill speed with the tensor-core attention off, then on
        PEREGRINE_CUDA_FA_PREFILL=0 bench_one "$LOG" "$preset $type prefill, FA prefill off" -m "$MODEL" -p 512,4096 -d 0,4096 -n 0 -r 2
        PEREGRINE_CUDA_FA_PREFILL=$FA_PREFILL_ROWS bench_one "$LOG" "$preset $type prefill, FA prefill on (≥ $FA_PREFILL_ROWS rows)" \
          -m "$MODEL" -p 512,4096 -d 0,4096 -n 0 -r 2
      fi
      if ((FA_DECODE && FIRST_MODEL)); then  # decode speed with the tensor-core decode attention off, then on
        PEREGRINE_CUDA_FA_DECODE=0 bench_one "$LOG" "$preset $type tg128, FA decode off" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
        PEREGRINE_CUDA_FA_DECODE=1 bench_one "$LOG" "$preset $type tg128, FA decode on" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
      fi
      if ((FIRST_MODEL && GEMV_PIPE)); then  # decode speed with the pipelined one-row GEMV off, then on per stage count
        PEREGRINE_CUDA_GEMV_PIPE=0 bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, gemv_pipe off" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 3
        for u in $GEMV_PIPE_U; do
          PEREGRINE_CUDA_GEMV_PIPE=1 PEREGRINE_CUDA_GEMV_PIPE_U=$u PEREGRINE_CUDA_GEMV_PIPE_BPS=$GEMV_PIPE_BPS bench_one "$LOG" \
            "$preset $type tg128 at depths 0 and 4096, gemv_pipe on, $u stages" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 3
        done
      fi
      if ((BENCH && PDL_ALL)); then
        PEREGRINE_CUDA_PDL_ALL=1 bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, PDL for every kernel" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
      fi
      if ((FUSE_QK_ROPE && FIRST_MODEL)); then  # decode speed with the one-launch q/k norm + rope off, then on
        PEREGRINE_CUDA_FUSE_QK_ROPE=0 bench_one "$LOG" "$preset $type tg128, fused q/k norm + rope off" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 3
        PEREGRINE_CUDA_FUSE_QK_ROPE=1 bench_one "$LOG" "$preset $type tg128, fused q/k norm + rope on" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 3
      fi
      if ((BENCH && STAGE_X_OFF)); then
        PEREGRINE_CUDA_GEMV_STAGE_X=0 bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, activations not staged" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
      fi
      if ((BENCH && TG_ONLY)); then
        bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
      elif ((BENCH)); then
        bench_one "$LOG" "$preset $type pp512, pp4096, tg128 at depths 0 and 4096" -m "$MODEL" -p 512,4096 -n 128 -d 0,4096 -r 2
      fi
      if ((PROFILE)); then
        PEREGRINE_CUDA_PROFILE=1 bench_one "$LOG" "$preset $type per-op profile (pp512, tg32 at depths 0 and 4096)" -m "$MODEL" -p 512 -n 32 -d 0,4096 -r 1
        { echo "per-op profile $preset $type"; grep -A22 "^ops of " "$LOG" | tail -100; } >>"$SUMMARY"
      fi
      if ((FIRST_MODEL && FUSE_NORM_QUANT)); then
        PEREGRINE_CUDA_FUSE_NORM_QUANT=1 bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, fused norm quantization" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
        PEREGRINE_CUDA_FUSE_NORM_QUANT=0 bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, separate act-quant" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
      fi
      if ((MOE_FUSED)) && [[ $preset == *a3b* || $preset == *moe* ]]; then  # every MoE model of MODELS
        PEREGRINE_CUDA_MOE_FUSED=0 bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, default MoE decode" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
        PEREGRINE_CUDA_MOE_FUSED=1 bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, fused MoE decode" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
      fi
      if ((FIRST_MODEL && FA_FUSED_COMBINE)); then
        PEREGRINE_CUDA_FA_FUSED_COMBINE=1 bench_one "$LOG" "$preset $type tg128 at depths 0, 4096, 32768, fused split combine" -m "$MODEL" -p 0 -n 128 -d 0,4096,32768 -r 1
        bench_one "$LOG" "$preset $type tg128 at depths 0, 4096, 32768, separate combine" -m "$MODEL" -p 0 -n 128 -d 0,4096,32768 -r 1
      fi
      if ((FIRST_MODEL && FA_VEC)); then  # decode speed with the SIMT flash-decoding attention off, then on
        PEREGRINE_CUDA_FA_VEC=0 bench_one "$LOG" "$preset $type tg128 at depths 0, 4096, 32768, fa_vec off" -m "$MODEL" -p 0 -n 128 -d 0,4096,32768 -r 2
        PEREGRINE_CUDA_FA_VEC=1 bench_one "$LOG" "$preset $type tg128 at depths 0, 4096, 32768, fa_vec on" -m "$MODEL" -p 0 -n 128 -d 0,4096,32768 -r 2
      fi
      if ((FIRST_MODEL)); then
        for pt in $FA_VEC_SWEEP; do
          IFS=: read -r ch bl st <<<"$pt"
          PEREGRINE_CUDA_FA_VEC=1 PEREGRINE_CUDA_FA_VEC_CHUNK=$ch PEREGRINE_CUDA_FA_VEC_BLOCKS=$bl PEREGRINE_CUDA_FA_VEC_STAGES=${st:-2} bench_one "$LOG" \
            "$preset $type tg128 at depths 0, 4096, 32768, fa_vec chunk $ch, $bl blocks/SM, ${st:-2} stages" -m "$MODEL" -p 0 -n 128 -d 0,4096,32768 -r 1
        done
        for v in $FA_SPLIT; do
          PEREGRINE_CUDA_FA_SPLIT_BLOCKS=$v bench_one "$LOG" "$preset $type tg128 at depths 4096 and 32768, FA split blocks per SM $v" -m "$MODEL" -p 0 -n 128 -d 4096,32768 -r 1
        done
        [ -n "$FA_SPLIT" ] && bench_one "$LOG" "$preset $type tg128 at depths 4096 and 32768, FA split blocks per SM default" -m "$MODEL" -p 0 -n 128 -d 4096,32768 -r 1
      fi
      for r in $RPW; do
        ((BENCH)) && PEREGRINE_GEMV_RPW=$r bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, GEMV rows per warp $r" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
      done
      # Verification-shaped steps: one forward of R rows (speculative trees, concurrent decoding).
      if [ -n "$PREFETCH_AB" ] && ((FIRST_MODEL)); then
        PEREGRINE_CUDA_L2_PREFETCH=0 bench_one "$LOG" "$preset $type tg128 at depths 0, 4096, L2 prefetch off" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
        for pt in $PREFETCH_AB; do
          PEREGRINE_CUDA_L2_PREFETCH=${pt%%:*} PEREGRINE_CUDA_L2_PREFETCH_BLOCKS=${pt##*:} bench_one "$LOG" \
            "$preset $type tg128 at depths 0, 4096, L2 prefetch ${pt%%:*} MiB from ${pt##*:} blocks" -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
        done
      fi
      if ((PREFILL_AB)); then  # the cuBLASLt prefill GEMM off vs on, at two ubatch sizes (every chunk re-dequantizes)
        for ub in 512 4096; do
          for on in 0 1; do
            PEREGRINE_CUDA_GEMM_CUBLAS=$on bench_one "$LOG" "$preset $type pp512/pp4096 at depths 0, 4096, -b $ub, gemm_cublas $on" \
              -m "$MODEL" -p 512,4096 -d 0,4096 -n 0 -r 2 -b "$ub"
          done
        done
        if ((FIRST_MODEL)) && [ -x "$BUILD/src/backend/cuda/pg_cuda_bench" ]; then
          run_step "prefill GEMM kernels alone (gemm.cu vs dequant + cuBLASLt)" "$OUT/kernels-gemm.log" 120 \
            "$BUILD/src/backend/cuda/pg_cuda_bench" --gemm --reps 5
          grep -E "cublas/total" "$OUT/kernels-gemm.log" | head -30 >>"$SUMMARY"
        fi
      fi
      ((BENCH && BENCH_ROWS)) && bench_one "$LOG" "$preset $type rows ${ROWS}" -m "$MODEL" -p "$ROWS" -n 0 -r 3
      if ((BENCH && FUSE)); then
        PEREGRINE_CUDA_FUSE_GLU=1 PEREGRINE_CUDA_FUSE_QKV=1 bench_one "$LOG" "$preset $type tg128 at depths 0 and 4096, fuse_glu + fuse_qkv" \
          -m "$MODEL" -p 0 -n 128 -d 0,4096 -r 2
        PEREGRINE_CUDA_FUSE_GLU=1 bench_one "$LOG" "$preset $type tg128, fuse_glu only" -m "$MODEL" -p 0 -n 128 -r 2
        PEREGRINE_CUDA_FUSE_QKV=1 bench_one "$LOG" "$preset $type tg128, fuse_qkv only" -m "$MODEL" -p 0 -n 128 -r 2
      fi
      ((BENCH && PDL_OFF)) && PEREGRINE_CUDA_PDL=0 bench_one "$LOG" "$preset $type tg128, PDL off" -m "$MODEL" -p 0 -n 128 -r 2
      for v in $MMQ_MIN_ROWS; do  # the row count from which MMQ replaces the GEMV (CudaOptions::mmq_min_rows)
        PEREGRINE_MMQ_MIN_ROWS=$v bench_one "$LOG" "$preset $type rows ${ROWS}, MMQ from $v rows" -m "$MODEL" -p "$ROWS" -n 0 -r 3
      done
      ((GRAPHS_OFF)) && PEREGRINE_CUDA_GRAPHS=0 bench_one "$LOG" "$preset $type tg128, graphs off" -m "$MODEL" -p 0 -n 128 -r 2
      for lanes in $LANES; do
        PEREGRINE_GEMV_LANES=$lanes bench_one "$LOG" "$preset $type tg128, GEMV lanes $lanes" -m "$MODEL" -p 0 -n 128 -r 2
      done
      # Verification forwards shaped as the scheduler's DDTree verify (argmax of every row on the device).
      if ((VERIFY)) && [ -x "$BUILD/tests/cuda/pg_cuda_verify_bench" ]; then
        run_step "$preset $type verify forwards (tree rows ${ROWS})" "$LOG" 120 "$BUILD/tests/cuda/pg_cuda_verify_bench" -m "$MODEL" --rows "$ROWS" --depth 512 --reps 5
      fi
      # KV cache types (issue 12): decode at depth per type on the first model. The typed CUDA path
      # (quantized / mixed KV) was written without a GPU; this is its first speed measurement.
      if ((FIRST_MODEL)); then
        for kvt in $KVTYPES; do
          bench_one "$LOG" "$preset $type KV $kvt tg128 at depths $KV_DEPTHS" -m "$MODEL" -ctk "$kvt" -ctv "$kvt" -p 0 -n 128 -d "$KV_DEPTHS" -r 1
          # Where a typed cache's decode time goes: per-op device times of 32 steps at depth 4096
          # (PEREGRINE_CUDA_PROFILE=1: CUDA events around each op, graphs off).
          if ((PROFILE_KV)) && (($(left) > 60)); then
            PEREGRINE_CUDA_PROFILE=1 bench_one "$LOG" "$preset $type KV $kvt tg32 at depth 4096, per-op profile" -m "$MODEL" \
              -ctk "$kvt" -ctv "$kvt" -p 0 -n 32 -d 4096 -r 1
            { echo "per-op profile, KV $kvt, tg32 @ 4096 (top 14)"; grep -A16 "^ops of tg32 @ 4096" "$LOG" | tail -17 | head -17; } >>"$SUMMARY"
          fi
          # The same with the parallel typed kv_store (f16/f32 caches do not use the typed store).
          if ((KV_STORE_PAR)) && [ "$kvt" != f16 ] && [ "$kvt" != f32 ]; then
            PEREGRINE_CUDA_KV_STORE_PAR=1 bench_one "$LOG" "$preset $type KV $kvt tg128 at depths $KV_DEPTHS, parallel kv_store" -m "$MODEL" \
              -ctk "$kvt" -ctv "$kvt" -p 0 -n 128 -d "$KV_DEPTHS" -r 1
            if ((PROFILE_KV)) && (($(left) > 60)); then
              PEREGRINE_CUDA_PROFILE=1 PEREGRINE_CUDA_KV_STORE_PAR=1 bench_one "$LOG" "$preset $type KV $kvt tg32 at depth 4096, per-op profile, parallel kv_store" \
                -m "$MODEL" -ctk "$kvt" -ctv "$kvt" -p 0 -n 32 -d 4096 -r 1
              { echo "per-op profile, KV $kvt, tg32 @ 4096, parallel kv_store (top 14)"; grep -A16 "^ops of tg32 @ 4096" "$LOG" | tail -17 | head -17; } >>"$SUMMARY"
            fi
          fi
        done
      fi
      FIRST_MODEL=0
      # 262144-token context with a tq3_0 cache on the 27B hybrid: `run` allocates the whole cache at start
      # (it logs the per-token KV bytes and the total) and decodes; bench then decodes at a real depth
      # (bench fills the depth by prefill, twice: a 262144-token prefill does not fit one device call).
      if ((LONGCTX)) && [ "$preset" = qwen35-27b ]; then
        run_step "$preset $type run -c 262144 tq3_0" "$LOG" 200 "$PG" run --device cuda -m "$MODEL" -c 262144 -ctk tq3_0 -ctv tq3_0 \
          -p "The quick brown fox" -n 32 --stats
        command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=memory.total,memory.used --format=csv >>"$LOG" 2>&1
        bench_one "$LOG" "$preset $type tq3_0 tg32 at depth $LONGCTX_DEPTH" -m "$MODEL" -ctk tq3_0 -ctv tq3_0 -p 0 -n 32 -d "$LONGCTX_DEPTH" -r 1
        grep -E "KV cache|bytes per token" "$LOG" | head -5 >>"$SUMMARY"
      fi
      ((BENCH)) || { grep -E "^\||model:|AR step" "$LOG" >>"$SUMMARY"; rm -f "$MODEL"; continue; }
      if command -v nsys >/dev/null 2>&1 && (($(left) > 120)) && ((NSYS)); then
        run_step "nsys $preset $type tg32" "$LOG" 100 nsys profile -o "/tmp/nsys-$preset-$type" --force-overwrite true --stats=false \
          "$PG" bench -m "$MODEL" -p 0 -n 32 -r 1 --device cuda
        nsys stats --report cuda_gpu_kern_sum --format csv "/tmp/nsys-$preset-$type.nsys-rep" 2>/dev/null | head -30 >"$OUT/nsys-$preset-$type.csv"
      fi
      grep -E "^\||model:|backend:|bytes per|AR step" "$LOG" >>"$SUMMARY"
      rm -f "$MODEL"
    else
      note "      (synth $preset $type failed: its benchmarks are skipped)"
    fi
  done
fi

echo "=== summary (${SECONDS}s)"
cat "$SUMMARY"
