#!/usr/bin/env bash
# Builds the GGUF reader fuzzer (clang, libFuzzer + ASan + UBSan) in its own build directory and runs it
# seeded with the hostile corpus (tests/gguf/corpus), the valid corpus base, and small valid copies of
# every golden model (fuzz/make_seeds.py keeps their metadata and tensor tables, shrinks the data).
#
#   scripts/fuzz-gguf.sh                 # 1,000,000 executions
#   RUNS=10000000 JOBS=2 scripts/fuzz-gguf.sh
#
# Environment: BUILD (default build-fuzz), RUNS (default 1000000), JOBS (parallel fuzzing processes,
# default 1; each runs RUNS executions), SHARED (default ../shared beside the checkout), MAX_LEN (default
# 65536 bytes: headers of real models fit, tensor data beyond it only slows mutation down).
# A crash leaves its input as crash-* in the build directory and makes this script fail.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-fuzz}
RUNS=${RUNS:-1000000}
JOBS=${JOBS:-1}
MAX_LEN=${MAX_LEN:-65536}
SHARED=${SHARED:-${PEREGRINE_SHARED:-$ROOT/../shared}}

command -v clang++ >/dev/null || { echo "fuzz-gguf: clang++ is required" >&2; exit 1; }
if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DPEREGRINE_FUZZ=ON -DPEREGRINE_TESTS=OFF \
    -DPEREGRINE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
ninja -C "$BUILD" fuzz_gguf

SEEDS="$BUILD/fuzz-gguf-seeds"
WORK="$BUILD/fuzz-gguf-corpus"   # new interesting inputs land here; kept between runs
mkdir -p "$SEEDS" "$WORK"
/usr/bin/python3 "$ROOT/fuzz/make_seeds.py" "$SEEDS" "$SHARED"/golden/models/*.gguf "$SHARED"/testdata/models/stories260K.gguf
cp "$ROOT"/tests/gguf/corpus/*.gguf "$ROOT/tests/gguf/valid_base.gguf" "$SEEDS/"

cd "$BUILD"
ARGS=(-runs="$RUNS" -max_len="$MAX_LEN" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
if [ "$JOBS" -gt 1 ]; then
  ARGS+=(-jobs="$JOBS" -workers="$JOBS")
fi
exec "$BUILD/fuzz/fuzz_gguf" "${ARGS[@]}" "$WORK" "$SEEDS"
