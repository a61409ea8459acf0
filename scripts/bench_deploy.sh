#!/usr/bin/env bash
# specula-load through nginx in front of 1, 2 and 3 replicas (scripts/cluster.sh), the same
# sessions and requests each time; prints one JSON line per replica count (docs/benchmarks.md).
# Usage: scripts/bench_deploy.sh [--replicas 1,2,3] [--concurrency 32] [--requests 256] [--max-tokens 64]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SPECULA_BUILD:-$PWD/build}
REPLICAS=1,2,3; CONC=32; REQS=256; MAXTOK=64; PORT=18400
while [ $# -gt 0 ]; do
  case $1 in
    --replicas) REPLICAS=$2; shift ;;
    --concurrency) CONC=$2; shift ;;
    --requests) REQS=$2; shift ;;
    --max-tokens) MAXTOK=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
PROMPTS=${SPECULA_PROMPTS:-$PWD/../shared/data/prompts/chat.jsonl}
for n in ${REPLICAS//,/ }; do
  bash scripts/cluster.sh "$n" --port "$PORT" > "/tmp/bench_deploy.$n.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q "^front" "/tmp/bench_deploy.$n.log" 2>/dev/null && break; sleep 0.1; done
  "$BUILD/specula-load" --url "http://127.0.0.1:$PORT/v1/chat/completions" --prompts "$PROMPTS" \
    --concurrency "$CONC" --requests "$REQS" --max-tokens "$MAXTOK" --temperature 0.7 --json --quiet > "/tmp/bench_deploy.$n.json" || true
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$n" "/tmp/bench_deploy.$n.json" <<'PY'
import json, sys
n, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))["summary"]
keep = {k: s.get(k) for k in ("succeeded", "failed", "wall_s", "output_tokens", "total_tokens_per_s", "requests_per_s")}
keep["output_tokens_per_s"] = s["output_tokens"] / s["wall_s"] if s.get("wall_s") else None
for k in ("ttft_ms", "e2e_ms"):
    if k in s: keep[k + "_p50"] = s[k].get("p50"); keep[k + "_p90"] = s[k].get("p90")
print(json.dumps({"replicas": int(n), **keep}))
PY
done
