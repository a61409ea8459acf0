#!/usr/bin/env bash
# The whole test suite: set up (idempotent), then every test through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
BUILD=${SPECULA_BUILD:-$PWD/build}
# Two cores: run tests two at a time; the oracle suite is one long test.
ctest --test-dir "$BUILD" --output-on-failure -j 2 --timeout 1800 "$@"
