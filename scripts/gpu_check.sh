#!/usr/bin/env bash
# The CUDA device's checks and benchmarks on a lent GPU machine, in one call of the `device` tool
# (docs/cuda.md, "Running the GPU checks"). From the repository root:
#
#   scripts/gpu_check.sh [STAGE...]     STAGE: build test memcheck racecheck bench hf hfgen (default: all)
#
# Binaries: build-gpu-pack/ when carried (made here by scripts/gpu_pack.sh: no configure, no
# dependencies needed there), else a CMake build in /tmp/specula-gpu-build (needs Boost,
# nlohmann_json, PCRE2, GoogleTest and concurrentqueue on that machine). Writes under $OUT (at
# most 8 files come back): summary.txt (one line per stage: exit status and seconds),
# bench_decode.json (with the skinny matmul's v2 and CUDA graphs timed in the same run),
# bench_spec_graphs.json, hf_compare.jsonl, hf_generate.json, gtest_cuda.json and logs.tar.gz
# (every stage's log).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/gpu_check}
LOGS=/tmp/specula-gpu-check
rm -rf "$LOGS"
mkdir -p "$OUT" "$LOGS"
STAGES=${*:-build test memcheck racecheck bench hf hfgen}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH

note() { echo "$*" | tee -a "$SUMMARY"; }
# The device tool stops a command at 600 s: stages share BUDGET seconds (default 570) and one
# that would start with under 30 s left is skipped (run it in a second call).
BUDGET=${GPU_CHECK_BUDGET:-570}
# stage NAME TIMEOUT CMD...: runs CMD with its output in $LOGS/NAME.log; one summary line.
stage() {
  local name=$1 limit=$2 t0=$SECONDS rc left
  shift 2
  left=$((BUDGET - SECONDS - 10))
  if [ "$left" -lt 30 ]; then
    note "$(printf '%-10s skipped: %ss of the budget left' "$name" "$((BUDGET - SECONDS))")"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  local last
  # GoogleTest's totals, compute-sanitizer's error summary, else the last line.
  last=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|ERROR SUMMARY' "$LOGS/$name.log" | tr '\n' ' ')
  [ -z "$last" ] && last=$(tail -n 1 "$LOGS/$name.log")
  note "$(printf '%-10s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(echo "$last" | cut -c1-160)")"
  return $rc
}
wants() { [[ " $STAGES " == *" $1 "* ]]; }

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -n 2
  cmake --version 2>&1 | head -n 1
  g++ --version 2>&1 | head -n 1
  git log --oneline -1 2>&1
} >"$LOGS/env.log"
note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1)"

BIN=
chmod +x build-gpu-pack/* 2>/dev/null  # in case the copy dropped the mode bits
if [ -x build-gpu-pack/test_gpu_cuda ] && [ -x build-gpu-pack/specula ]; then
  BIN=build-gpu-pack
  note "binaries: carried build-gpu-pack ($(cat build-gpu-pack/COMMIT 2>/dev/null))"
elif wants build; then
  B=/tmp/specula-gpu-build
  stage configure 300 cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80-real;90-real;90-virtual" &&
    stage build 480 ninja -C "$B" test_gpu_cuda test_gpu_streams specula && BIN=$B/tests
  # the program sits at the build root, the tests under tests/
  [ -n "$BIN" ] && ln -sf "$B/specula" "$B/tests/specula"
fi
if [ -z "$BIN" ]; then
  note "no binaries: carry build-gpu-pack (scripts/gpu_pack.sh) or install the build dependencies"
else
  if wants test; then
    stage test_cuda 300 "$BIN/test_gpu_cuda" --gtest_output=json:"$OUT/gtest_cuda.json"
    stage test_streams 120 "$BIN/test_gpu_streams"
    # With a GPU listed, a skipped GPU test means the program could not use it (e.g. a driver
    # older than the CUDA runtime it was built with): that is a failure here, not a pass.
    if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
      skipped=$(cat "$LOGS/test_cuda.log" "$LOGS/test_streams.log" 2>/dev/null |
        grep -oE '^\[  SKIPPED \] [0-9]+ tests?, listed below' | awk '{s += $4} END {print s + 0}')
      if [ "$skipped" -gt 0 ]; then
        note "FAILED     a GPU is listed but $skipped GPU tests skipped: $(grep -m1 -h -A1 ': Skipped$' "$LOGS"/test_*.log | tail -n 1 | cut -c1-120)"
        note "           driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1); built with $(cat "$BIN/CUDA_VERSION" 2>/dev/null || nvcc --version | tail -n 1)"
      fi
    fi
  fi
  if wants memcheck; then
    stage memcheck 420 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 \
      "$BIN/test_gpu_cuda" --gtest_brief=1
  fi
  if wants racecheck; then
    # Shared-memory hazards: the kernels that use shared memory (RMSNorm, attention, acceptance).
    stage racecheck 420 compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/test_gpu_cuda" --gtest_brief=1 \
      --gtest_filter='*RmsNorm*:*Attention*:DeviceVerify*:*GreedyGeneration*'
  fi
  if wants bench; then
    stage bench 420 sh -c "'$BIN/specula' bench decode --device cuda --shape llama-3.2-1b,llama-3.2-3b \
      --prompt-tokens 128 --decode-tokens 128 --repeat 3 --max-verify 9 --spec-pair 0.6,0.7,0.8 \
      >'$OUT/bench_decode.json'"
    # The synthetic pair again with every model's steps replayed from CUDA graphs
    # (SPECULA_CUDA_GRAPHS=1; the decode/verify timings above already compare graphs off and on).
    stage spec_graphs 300 sh -c "SPECULA_CUDA_GRAPHS=1 '$BIN/specula' bench decode --device cuda \
      --shape llama-3.2-1b,llama-3.2-3b --prompt-tokens 128 --decode-tokens 128 --repeat 1 --max-verify 2 \
      --cuda-graphs off --spec-pair 0.6,0.7,0.8 --spec-pair-engine off >'$OUT/bench_spec_graphs.json'"
  fi
  if wants hf; then
    # Golden logits need numpy only; the live transformers run needs torch and transformers.
    if python3 -c 'import numpy' >/dev/null 2>&1; then
      stage hf 420 sh -c "PYTHONUNBUFFERED=1 python3 tests/gpu/hf_compare.py '$BIN/specula' /tmp/specula-hf \
        | tee '$OUT/hf_compare.jsonl'"
    else
      note "hf         skipped: numpy is missing"
    fi
  fi
  if wants hfgen; then
    # transformers generate() at the same shapes on the same GPU (needs torch and transformers).
    if python3 -c 'import torch, transformers' >/dev/null 2>&1; then
      stage hfgen 420 sh -c "python3 tests/gpu/hf_generate_bench.py --shape llama-3.2-1b,llama-3.2-3b \
        --prompt-tokens 128 --decode-tokens 128 --repeat 3 >'$OUT/hf_generate.json'"
    else
      note "hfgen      skipped: torch or transformers is missing"
    fi
  fi
fi
tar -C "$LOGS" -czf "$OUT/logs.tar.gz" . 2>/dev/null
note "logs: logs.tar.gz ($(ls "$LOGS" | tr '\n' ' '))"
