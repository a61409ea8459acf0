#!/usr/bin/env bash
# The whole test suite: set up (idempotent), then every test through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests read ../shared/ beside the checkout (prompt sets, tokenizer vectors), or
# SPECULA_SHARED_DIR. A clone made elsewhere (git clone /work/main /tmp/x) finds the one beside
# the checkout it was cloned from. Without any, the tests would fail by the dozen, so say so once, first.
SHARED=${SPECULA_SHARED_DIR:-$PWD/../shared}
if [ -z "${SPECULA_SHARED_DIR:-}" ] && [ ! -f "$SHARED/data/prompts/chat.jsonl" ]; then
  ORIGIN=$(git config --get remote.origin.url 2>/dev/null || true)
  ORIGIN=${ORIGIN#file://}
  if [ -n "$ORIGIN" ] && [ -f "$ORIGIN/../shared/data/prompts/chat.jsonl" ]; then
    SHARED=$ORIGIN/../shared
    echo "scripts/test.sh: no shared/ beside this checkout; using the one beside its origin, $SHARED" >&2
  fi
fi
if [ ! -f "$SHARED/data/prompts/chat.jsonl" ]; then
  echo "scripts/test.sh: no shared data at $SHARED (expected data/prompts/chat.jsonl there): clone beside" \
       "the workplace's shared/ folder (or from a checkout that has it beside), or set SPECULA_SHARED_DIR to it" >&2
  exit 2
fi
export SPECULA_SHARED_DIR=$(cd "$SHARED" && pwd)
bash scripts/setup.sh --tests
BUILD=${SPECULA_BUILD:-$PWD/build}
# Two cores: run tests two at a time; the oracle suite is one long test.
ctest --test-dir "$BUILD" --output-on-failure -j 2 --timeout 1800 "$@"
