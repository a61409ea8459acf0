#!/usr/bin/env bash
# The main job: set up (idempotent), then chat with the default model in the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${SPECULA_BUILD:-$PWD/build}/specula" chat "$@"
