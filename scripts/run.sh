#!/usr/bin/env bash
# The main job: set up (idempotent), then serve the default model: the chat page, the WebSocket
# protocol and the OpenAI-compatible API on one port (http://127.0.0.1:8080/ unless --port says
# otherwise). Extra arguments go to `specula serve` (e.g. --port 9000, --draft skip:4-7).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${SPECULA_BUILD:-$PWD/build}/specula" serve "$@"
