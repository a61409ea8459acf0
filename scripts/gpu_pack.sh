#!/usr/bin/env bash
# Builds the GPU test binaries and the program here (CUDA on; no GPU needed) and copies them into
# build-gpu-pack/, which a `device` tool call carries to the GPU machine so that
# scripts/gpu_check.sh needs no configure and no build dependencies there (docs/cuda.md).
#
# It builds the committed HEAD in a worktree of its own (SPECULA_PACK_SRC, default
# ~/.cache/specula/gpu-pack-src, kept between runs so rebuilds are incremental), so that
# uncommitted work elsewhere in the tree cannot break or change the binaries; PACK_FROM=tree
# builds the working tree instead (in build-cuda). JOBS (default 1: the machine is shared).
# The binaries link the CUDA runtime and cuBLAS dynamically: the GPU machine's CUDA (13.0) must
# be at least the nvcc used here.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-1}
if [ "${PACK_FROM:-head}" = tree ]; then
  SRC=$ROOT
  B=$ROOT/build-cuda
else
  SRC=${SPECULA_PACK_SRC:-$HOME/.cache/specula/gpu-pack-src}
  if [ ! -e "$SRC/.git" ]; then
    mkdir -p "$(dirname "$SRC")"
    git worktree add --detach "$SRC" HEAD
  else
    git -C "$SRC" checkout -q --detach "$(git rev-parse HEAD)"
  fi
  B=$SRC/build-cuda
fi
cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_SHARED_DIR="$ROOT/../shared" >/dev/null
ninja -C "$B" -j"$JOBS" test_gpu_cuda test_gpu_streams specula
rm -rf build-gpu-pack
mkdir -p build-gpu-pack
cp "$B/tests/test_gpu_cuda" "$B/tests/test_gpu_streams" "$B/specula" build-gpu-pack/
strip build-gpu-pack/* 2>/dev/null || true
git -C "$SRC" log --oneline -1 >build-gpu-pack/COMMIT
nvcc --version | tail -n 1 >build-gpu-pack/CUDA_VERSION  # gpu_check.sh names it if the GPU tests skip
if [ "$SRC" = "$ROOT" ] && ! git diff --quiet HEAD; then
  echo "(built from a working tree with uncommitted changes)" >>build-gpu-pack/COMMIT
fi
du -sh build-gpu-pack
ldd build-gpu-pack/test_gpu_cuda | grep -v -E "linux-vdso|ld-linux" | awk '{print "  needs", $1}'
