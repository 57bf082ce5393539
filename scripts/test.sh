#!/usr/bin/env bash
# Builds everything and runs every test (CPU; the CUDA code is compiled when nvcc is present).
# Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${PEREGRINE_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$JOBS"
# The CUDA backend must keep compiling for the other supported GPU generations (Ampere, Ada, Blackwell;
# the build above is sm_90): compile the library once more for them. PEREGRINE_ARCH_CHECK=0 skips it.
if [ "${PEREGRINE_ARCH_CHECK:-1}" != 0 ] && [ -f "$BUILD/src/backend/cuda/libpg_backend_cuda.a" ]; then
  cmake -S . -B "$BUILD-archs" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPEREGRINE_TESTS=OFF -DPEREGRINE_E2E=OFF \
    -DPEREGRINE_CUDA=ON "-DPEREGRINE_CUDA_ARCHS=80;86;89;120" ${PEREGRINE_CMAKE_ARGS:-}
  cmake --build "$BUILD-archs" -j "$JOBS" --target pg_backend_cuda
fi
# CUDA tests (ctest label `cuda`) need a GPU; without a working nvidia-smi they are left out.
{ command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } || CTEST_ARGS="${CTEST_ARGS:-} -LE cuda"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" ${CTEST_ARGS:-}
