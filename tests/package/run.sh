#!/usr/bin/env bash
# `cmake --install` of the build into a temporary prefix, then tools/examples/engine_example.cpp
# built out of tree against it with find_package(Specula), and run on the default model: it must
# stream a reply through the coroutine API and finish a blocking request.
# Usage: tests/package/run.sh BUILD_DIR MODEL
set -euo pipefail
BUILD=$1; MODEL=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$WORK/prefix" > "$WORK/install.log"
# Nothing but the public header is installed.
headers=$(cd "$WORK/prefix/include" && find . -type f | sort)
[ "$headers" = "./specula/specula.h" ] || { echo "installed headers: $headers" >&2; exit 1; }
cmake -S "$SRC/tests/package" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$WORK/prefix" -DEXAMPLE_SOURCE="$SRC/tools/examples/engine_example.cpp" > "$WORK/configure.log"
cmake --build "$WORK/build" > "$WORK/build.log" || { cat "$WORK/build.log" >&2; exit 1; }
out=$("$WORK/build/engine_example" "$MODEL" ngram "Say hello.")
echo "$out"
# Here-strings, not `echo "$out" | grep -q`: grep -q exits at its first match, and with pipefail the
# echo still writing the lines after it (bash's stdout is line-buffered) would fail with SIGPIPE.
grep -Eq '^\[(stop|length): [0-9]+ tokens in [0-9]+ rounds' <<< "$out" || { echo "no streamed reply" >&2; exit 1; }
grep -q '^blocking: ' <<< "$out" && tail -1 <<< "$out" | grep -Eq '\[(stop|length)\]$' ||
  { echo "no blocking reply" >&2; exit 1; }
