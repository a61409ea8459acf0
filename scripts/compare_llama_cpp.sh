#!/usr/bin/env bash
# Scores llama.cpp's CPU path against Specula's f32 reference on the positions `bench decode` scores
# for its top-1 agreement (issue 12: "top-1 agreement >= 99%"), so the fast path's figure can be read
# beside the best existing engine's on the same model file (docs/benchmarks.md). Not part of the test
# suite: the first run builds llama-cpp-python from PyPI (about 15 minutes on 2 cores) into a venv
# cached beside the models.
#
# Usage: scripts/compare_llama_cpp.sh [--model GGUF] [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SPECULA_CACHE:-$HOME/.cache/specula}
BUILD=${SPECULA_BUILD:-$PWD/build}
MODEL=$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
THREADS=2
while [ $# -gt 0 ]; do
  case $1 in
    --model) MODEL=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    *) echo "compare_llama_cpp.sh: unknown option '$1' (expected --model GGUF or --threads N)" >&2; exit 2 ;;
  esac
  shift
done
[ -f "$MODEL" ] || { echo "compare_llama_cpp.sh: no model file at $MODEL (run scripts/setup.sh first)" >&2; exit 1; }
[ -x "$BUILD/specula" ] || { echo "compare_llama_cpp.sh: no $BUILD/specula (build first: scripts/run.sh or scripts/test.sh)" >&2; exit 1; }
VENV=$CACHE/llama-cpp-venv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
  echo "[compare_llama_cpp] building llama-cpp-python 0.3.36 into $VENV (once)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet numpy==2.4.6 llama-cpp-python==0.3.36 >&2
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$BUILD/specula" bench decode --model "$MODEL" --threads "$THREADS" --contexts 128 --max-verify 1 --decode-tokens 8 \
  --repeat 1 --paths fast,reference --agreement-out "$OUT/agreement.jsonl" > "$OUT/bench.json"
"$VENV/bin/python" tools/compare/llama_cpp_agreement.py --model "$MODEL" --agreement "$OUT/agreement.jsonl" --threads "$THREADS"
