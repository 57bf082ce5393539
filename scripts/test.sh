#!/usr/bin/env bash
# Builds everything and runs every test (CPU; the CUDA code is compiled when nvcc is present).
# Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${PEREGRINE_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$JOBS"
# CUDA tests (ctest label `cuda`) need a GPU; without a working nvidia-smi they are left out.
{ command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } || CTEST_ARGS="${CTEST_ARGS:-} -LE cuda"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" ${CTEST_ARGS:-}
