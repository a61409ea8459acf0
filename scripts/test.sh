#!/usr/bin/env bash
# The whole test suite: set up (idempotent), then every test through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests read ../shared/ beside the checkout (prompt sets, tokenizer vectors), or
# SPECULA_SHARED_DIR: without it they would fail by the dozen, so say so once, first.
SHARED=${SPECULA_SHARED_DIR:-$PWD/../shared}
if [ ! -f "$SHARED/data/prompts/chat.jsonl" ]; then
  echo "scripts/test.sh: no shared data at $SHARED (expected data/prompts/chat.jsonl there): clone beside" \
       "the workplace's shared/ folder, or set SPECULA_SHARED_DIR to it" >&2
  exit 2
fi
export SPECULA_SHARED_DIR=$(cd "$SHARED" && pwd)
bash scripts/setup.sh --tests
BUILD=${SPECULA_BUILD:-$PWD/build}
# Two cores: run tests two at a time; the oracle suite is one long test.
ctest --test-dir "$BUILD" --output-on-failure -j 2 --timeout 1800 "$@"
