#!/usr/bin/env bash
# Builds the GPU test binaries and the program here (build-cuda, CUDA on) and copies them into
# build-gpu-pack/, which a `device` tool call carries to the GPU machine so that
# scripts/gpu_check.sh needs no configure and no build dependencies there (docs/cuda.md).
# The binaries link the CUDA runtime and cuBLAS dynamically: the GPU machine's CUDA (13.0) must
# be at least the nvcc used here.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${SPECULA_CUDA_BUILD:-build-cuda}
JOBS=${JOBS:-1}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$B" -j"$JOBS" test_gpu_cuda test_gpu_streams specula
rm -rf build-gpu-pack
mkdir -p build-gpu-pack
cp "$B/tests/test_gpu_cuda" "$B/tests/test_gpu_streams" "$B/specula" build-gpu-pack/
strip build-gpu-pack/* 2>/dev/null || true
git log --oneline -1 >build-gpu-pack/COMMIT
if ! git diff --quiet HEAD -- gpu tests/gpu tools/specula spec model; then
  echo "(built from a tree with uncommitted changes)" >>build-gpu-pack/COMMIT
fi
du -sh build-gpu-pack
ldd build-gpu-pack/test_gpu_cuda | grep -v -E "linux-vdso|ld-linux" | awk '{print "  needs", $1}'
