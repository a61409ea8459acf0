#!/usr/bin/env bash
# The main job: set up (idempotent), then serve the default model: the chat page, the WebSocket
# protocol and the OpenAI-compatible API on one port (http://127.0.0.1:8080/ unless --port says
# otherwise). The drafter is the one measured best on a CPU (docs/benchmarks.md, Serving): prompt
# lookup where the reply repeats its context's last 3 tokens, and the trained draft head for the
# default model elsewhere (--draft ngram:n=3+eagle, docs/draft.md), with adaptive K, the entropy
# rule and the load-adaptive policy, which drafts only where a draft pays (docs/serving.md, "The
# main job"). Extra arguments go to `specula serve` and win over these (e.g. --port 9000,
# --draft eagle).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${SPECULA_BUILD:-$PWD/build}/specula" serve --draft ngram:n=3+eagle --adaptive --draft-entropy 2 "$@"
